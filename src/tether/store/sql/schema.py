"""The tables (SQLAlchemy Core), one definition for SQLite and PostgreSQL.

Times that decide anything are stored as epoch seconds (double precision) written from
the database's clock (``db_now()``), so expiry, staleness and retention compare plain
numbers on both backends and no worker clock is ever consulted (invariant 11).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from tether.runs import BUSY, RunState

# The tables of who decides (a suspension's calls, decisions, approvals, the audit) are
# ``decision_tables``; they are re-exported here with the rest.
from tether.store.sql.decision_tables import approvals as approvals
from tether.store.sql.decision_tables import audit as audit
from tether.store.sql.decision_tables import decisions as decisions
from tether.store.sql.decision_tables import pending_calls as pending_calls
from tether.store.sql.meta import BigId as BigId
from tether.store.sql.meta import metadata as metadata
from tether.store.sql.sealed import SealedJSON, SealedText

# The states retention purges (halted and the terminal ones), in enum order. The index
# predicates are written from RunState's values, exactly as the queries render them.
RETAINED = tuple(s for s in RunState if s.terminal or s is RunState.HALTED)
_RETAINED = "state IN ({})".format(", ".join(f"'{s.value}'" for s in RETAINED))
_RUNNING = f"state = '{RunState.RUNNING.value}'"
_SUSPENDED = f"state = '{RunState.SUSPENDED.value}'"
_QUEUED = f"state = '{RunState.QUEUED.value}'"
REQUESTED = "request_key IS NOT NULL"
_BUSY = "state IN ({})".format(", ".join(f"'{s.value}'" for s in BUSY))


def _partial(table: sa.Table, name: str, *cols: Any, where: str, unique: bool = False) -> sa.Index:
    """An index on ``table`` (its columns by name or expression) on the rows ``where`` holds."""
    clause = sa.text(where)
    columns = [table.c[col] if isinstance(col, str) else col for col in cols]
    return sa.Index(name, *columns, unique=unique, postgresql_where=clause, sqlite_where=clause)


runs = sa.Table(
    "runs",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("user_id", sa.String(128), nullable=False),
    sa.Column("question", SealedText, nullable=False),
    sa.Column("route", sa.JSON, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("step", sa.Integer, nullable=False, server_default="0"),
    # Limits.
    sa.Column("max_steps", sa.Integer, nullable=False),
    sa.Column("max_spend_usd", sa.Float, nullable=False),
    sa.Column("max_tool_calls", sa.Integer, nullable=False),
    sa.Column("max_elapsed_ms", sa.BigInteger, nullable=False),
    # Consumed budget: only ever grown (invariant 4).
    sa.Column("steps", sa.Integer, nullable=False, server_default="0"),
    sa.Column("spend_usd", sa.Float, nullable=False, server_default="0"),
    sa.Column("tool_calls", sa.Integer, nullable=False, server_default="0"),
    sa.Column("elapsed_ms", sa.BigInteger, nullable=False, server_default="0"),
    # A snapshot of the user's permissions, not a reference, and when it was taken.
    sa.Column("scope_snapshot", sa.JSON, nullable=False),
    sa.Column("scope_resolved_at", sa.Float, nullable=False),
    # Suspension: the pending call with its preview and digest; the token's hash only.
    sa.Column("pending", SealedJSON, nullable=True),
    sa.Column("pending_token_hash", sa.String(64), nullable=True),
    sa.Column("suspended_at", sa.Float, nullable=True),
    sa.Column("expires_at", sa.Float, nullable=True),
    # When the notice of the current suspension was delivered; NULL until then, so the
    # reaper can re-issue a notice that a crash or an unreachable webhook lost.
    sa.Column("notified_at", sa.Float, nullable=True),
    sa.Column("halt_reason", sa.String(32), nullable=True),
    sa.Column("fail_reason", sa.String(32), nullable=True),
    sa.Column("recovery_attempts", sa.Integer, nullable=False, server_default="0"),
    # The lease: only (owner, lease_epoch) may write the run's steps (invariant 8).
    sa.Column("owner", sa.String(128), nullable=True),
    sa.Column("lease_epoch", sa.Integer, nullable=False, server_default="0"),
    sa.Column("heartbeat_at", sa.Float, nullable=True),
    sa.Column("versions", sa.JSON, nullable=False),
    # Number of stored messages: the next message's seq, so appends never read the list.
    sa.Column("message_count", sa.Integer, nullable=False, server_default="0"),
    sa.Column("started_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
    # A run handed back with a delay (a retry's backoff) is not claimable before this
    # time of the database's clock; NULL when it may be claimed at once (migration 0003).
    sa.Column("ready_at", sa.Float, nullable=True),
    # Consecutive failed model calls; a successful call resets it (reference §10, migration 0004).
    sa.Column("model_failures", sa.Integer, nullable=False, server_default="0"),
    # The validated typed output of an answered run (reference §11, migration 0005), or NULL.
    sa.Column("output", SealedJSON, nullable=True),
    # The W3C trace context of the run's root span, so a resumed run continues its trace.
    sa.Column("trace_context", sa.JSON, nullable=True),
    # The agent version the run is written for (reference §12, migration 0006): only workers
    # that serve it claim, recover or resume it.
    sa.Column("agent_version", sa.String(128), nullable=False, server_default=""),
    # A fork's lineage: the run and step it was forked from; NULL for a run that was asked.
    sa.Column("forked_from_run", sa.String(64), nullable=True),
    sa.Column("forked_from_step", sa.Integer, nullable=True),
    # A dry run never executes a write: each gets a ``dry_run`` result, ledger ``skipped``.
    sa.Column("dry_run", sa.Boolean, nullable=False, server_default=sa.false()),
    # The conversation the run belongs to (reference §14, migration 0010) and its place in
    # it (1 for the thread's first run); the model sees the messages of the thread's
    # earlier runs, read by reference, then the run's own.
    sa.Column("thread_id", sa.String(64), nullable=True),
    sa.Column("thread_pos", sa.Integer, nullable=False, server_default="1"),
    # How many of the run's stored messages are a copy of an earlier conversation rather
    # than its own (a fork of a follow-up starts a thread holding what it saw); 0 otherwise.
    sa.Column("base_count", sa.Integer, nullable=False, server_default="0"),
    # Idempotent creation (reference §14): the ``Idempotency-Key`` its user created it
    # with, the SHA-256 of that request's body (canonical JSON) and the state its first
    # answer gave; NULL for a run created without a key. The key lives as long as its run.
    sa.Column("request_key", sa.String(255), nullable=True),
    sa.Column("request_digest", sa.String(64), nullable=True),
    sa.Column("request_state", sa.String(16), nullable=True),
    # The input tokens the run's latest model call reported, 0 once the conversation was
    # compacted after it (reference §14): over the agent's threshold, the next call is
    # preceded by a compaction. NULL before the run's first call or compaction (a
    # follow-up then goes by its thread's earlier runs).
    sa.Column("last_input_tokens", sa.Integer, nullable=True),
    # How many calls of the current suspension have no decision yet (reference §15,
    # migration 0011): each decision takes one off in the conditional UPDATE that records
    # it, and the one that takes the last claims the run in that same UPDATE.
    sa.Column("undecided", sa.Integer, nullable=False, server_default="0"),
    # Flow control (reference §13, migration 0012): the claim order (higher first, then the
    # oldest), the time of the database's clock before which the run stays ``queued``
    # (NULL: none), and the schedule whose tick created it (NULL: asked).
    sa.Column("priority", sa.Integer, nullable=False, server_default="0"),
    sa.Column("start_at", sa.Float, nullable=True),
    sa.Column("schedule_id", sa.String(64), nullable=True),
    # A tree of sub-agents (reference §18, migration 0015): the run and call that started a
    # child (NULL at the top), the tree's root (its own id at the top), its depth (0 at the
    # top), its place among its siblings (their calls' order), the run whose limits halted it.
    sa.Column("parent_run_id", sa.String(64), nullable=True),
    sa.Column("parent_tool_call_id", sa.String(255), nullable=True),
    sa.Column("root_run_id", sa.String(64), nullable=True),
    sa.Column("depth", sa.Integer, nullable=False, server_default="0"),
    sa.Column("child_order", sa.Integer, nullable=False, server_default="0"),
    sa.Column("halted_by", sa.String(64), nullable=True),
)

# Partial indexes: the reaper, the worker queue, expiry and retention each scan only the
# rows in their state, so their cost does not grow with the number of finished runs.
_partial(runs, "runs_orphan_scan", "heartbeat_at", where=f"{_RUNNING} AND owner IS NOT NULL")
# The claim's order (reference §13): by priority, highest first, then by age. A claim
# reads the users in the order of their first ready runs (``user_load``), then each user's
# own ready runs in that order (migration 0018 dropped ``runs_ready``, all users' ready
# runs in that order, which no claim reads any more).
_READY = f"{_RUNNING} AND owner IS NULL"
_CLAIM_ORDER = (runs.c.priority.desc(), runs.c.updated_at)
_partial(runs, "runs_ready_user", "user_id", *_CLAIM_ORDER, where=_READY)
_partial(runs, "runs_suspended_expiry", "expires_at", where=_SUSPENDED)
_partial(runs, "runs_unnotified", "suspended_at", where=f"{_SUSPENDED} AND notified_at IS NULL")
_partial(runs, "runs_retention", "updated_at", where=_RETAINED)
sa.Index("runs_user", runs.c.user_id, runs.c.started_at)
sa.Index("runs_thread", runs.c.thread_id, runs.c.thread_pos)
# A thread is busy while one of its runs is in a ``BUSY`` state: the check of a follow-up
# and the claim of a queued run read only these rows.
_partial(runs, "runs_thread_busy", "thread_id", "thread_pos", where=_BUSY)
# Queued runs: those waiting on their thread in the claim's order, those with a start time
# by it (the due ones are the index's first rows, whatever waits for later).
_WAITS_THREAD = f"{_QUEUED} AND start_at IS NULL"
_WAITS_START = f"{_QUEUED} AND start_at IS NOT NULL"
_partial(runs, "runs_queued", *_CLAIM_ORDER, where=_WAITS_THREAD)
_partial(runs, "runs_starting", "start_at", where=_WAITS_START)
sa.Index("runs_schedule", runs.c.schedule_id)
# A user's key names one run: a second creation with it conflicts here.
_partial(runs, "runs_request_key", "user_id", "request_key", where=REQUESTED, unique=True)
sa.Index("runs_forked_from", runs.c.forked_from_run)
# Trees (reference §18): one child per (parent, tool call), even for a recovered parent.
_CHILD = ("parent_run_id", "parent_tool_call_id")
_partial(runs, "runs_child", *_CHILD, where="parent_run_id IS NOT NULL", unique=True)
sa.Index("runs_root", runs.c.root_run_id)
# Counting runs by state (the metrics gauge) reads this index only, never the rows. It is
# partial on a predicate no other query states, so SQLite's planner (without statistics)
# never picks it over the partial indexes above for a ``state = …`` lookup; the count
# states the predicate (``COUNTABLE``) and both backends scan the index alone.
COUNTABLE = "length(state) > 0"
_partial(runs, "runs_state", "state", where=COUNTABLE)

# Conversations (reference §14, migration 0010): one row per thread, locked by whoever
# adds a run to it, so two follow-ups never both find it idle; ``runs`` counts the runs
# given a place in it (the next ``thread_pos``).
threads = sa.Table(
    "threads",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("user_id", sa.String(128), nullable=False),
    sa.Column("runs", sa.Integer, nullable=False, server_default="0"),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
    # False for a child run's thread (§18, 0015): never listed, never followed up.
    sa.Column("conversation", sa.Boolean, nullable=False, server_default=sa.true()),
)
sa.Index("threads_user", threads.c.user_id, threads.c.updated_at)

# Compactions (reference §14): the summary of a thread's conversation through message
# ``through_seq`` (1-based, in the thread's conversation), stored by the run that made it.
# What the model sees is computed from the messages and these rows; messages are never
# rewritten.
compactions = sa.Table(
    "compactions",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("thread_id", sa.String(64), nullable=False),
    sa.Column(
        "run_id", sa.String(64), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False
    ),
    sa.Column("through_seq", sa.Integer, nullable=False),
    sa.Column("summary", SealedText, nullable=False),
    sa.Column("summary_tokens", sa.Integer, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
)
sa.Index("compactions_thread", compactions.c.thread_id, compactions.c.id)
sa.Index("compactions_run", compactions.c.run_id)

run_messages = sa.Table(
    "run_messages",
    metadata,
    sa.Column(
        "run_id", sa.String(64), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True
    ),
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("message", SealedJSON, nullable=False),
)

run_events = sa.Table(
    "run_events",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column(
        "run_id", sa.String(64), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False
    ),
    sa.Column("at", sa.Float, nullable=False),
    sa.Column("kind", sa.String(64), nullable=False),
    sa.Column("data", SealedJSON, nullable=False),
)
sa.Index("run_events_run", run_events.c.run_id, run_events.c.id)

# The tool-call ledger, as Jepsen records operations: the intent is written before the
# tool runs (with the assistant turn), the outcome (ok / error / unknown) after; a dry
# run's write is recorded ``skipped`` instead (it never runs, reference §12).
tool_calls = sa.Table(
    "tool_calls",
    metadata,
    sa.Column("idempotency_key", sa.String(200), primary_key=True),
    sa.Column(
        "run_id", sa.String(64), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False
    ),
    sa.Column("tool_call_id", sa.String(128), nullable=False),
    sa.Column("seq", sa.Integer, nullable=False),
    sa.Column("tool", sa.String(128), nullable=False),
    sa.Column("arguments", SealedJSON, nullable=False),
    sa.Column("effect", sa.String(8), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("result", SealedJSON, nullable=True),
    sa.Column("intent_at", sa.Float, nullable=False),
    sa.Column("outcome_at", sa.Float, nullable=True),
    # The arguments the call ran with when a human edited them (reference §9, migration 0004).
    sa.Column("edited_arguments", SealedJSON, nullable=True),
)
sa.Index("tool_calls_run", tool_calls.c.run_id, tool_calls.c.seq)

# People who own runs and approve them, and their API keys (only the SHA-256 is stored).
# A removed user's row stays, ``removed_at`` set, so nobody takes the name until their data
# is erased; ``max_priority`` bounds the priority they may ask (None: TETHER_MAX_PRIORITY).
users = sa.Table(
    "users",
    metadata,
    sa.Column("id", sa.String(128), primary_key=True),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("removed_at", sa.Float, nullable=True),
    sa.Column("max_priority", sa.Integer, nullable=True),
    # Days this user's halted and terminal runs are kept (migration 0017); NULL:
    # TETHER_RETENTION_DAYS.
    sa.Column("retention_days", sa.Float, nullable=True),
)

# The id of every key that sealed a value still stored (reference §20, migration 0017): a
# process whose keys lack one refuses to start, and ``tether keys rotate`` removes the
# ids no value is sealed with any more.
sealing_keys = sa.Table(
    "sealing_keys",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("since", sa.Float, nullable=False),
)

# The SHA-256 of every key revoked (rotated or its user removed), and nothing of whose it
# was: a published key (the demo's) revoked once is never inserted again (migration 0013).
revoked_keys = sa.Table(
    "revoked_keys",
    metadata,
    sa.Column("key_hash", sa.String(64), primary_key=True),
    sa.Column("revoked_at", sa.Float, nullable=False),
)

api_keys = sa.Table(
    "api_keys",
    metadata,
    sa.Column("key_hash", sa.String(64), primary_key=True),
    sa.Column(
        "user_id", sa.String(128), sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False
    ),
    sa.Column("created_at", sa.Float, nullable=False),
)
sa.Index("api_keys_user", api_keys.c.user_id)

# Inbox sessions (migration 0008), one row per signed-in browser, so signing out, removing
# a user or rotating a key ends sessions at once. ``sid_hash`` is the SHA-256 of the
# cookie's random session id (the cookie is the credential, never stored); a session dies
# with the key that opened it.
web_sessions = sa.Table(
    "web_sessions",
    metadata,
    sa.Column("sid_hash", sa.String(64), primary_key=True),
    sa.Column(
        "key_hash",
        sa.String(64),
        sa.ForeignKey("api_keys.key_hash", ondelete="CASCADE"),
        nullable=False,
    ),
    sa.Column("user_id", sa.String(128), nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False),
)
sa.Index("web_sessions_key", web_sessions.c.key_hash)
sa.Index("web_sessions_user", web_sessions.c.user_id)
sa.Index("web_sessions_expiry", web_sessions.c.expires_at)

# The worker registry (reference §12, migrations 0006 and 0007): one row per worker and
# version it serves, with its tools and its heartbeat on the database's clock. A version
# is served while a row of it has a fresh heartbeat; a run waiting on a version none
# serves is stranded.
workers = sa.Table(
    "workers",
    metadata,
    sa.Column("worker_id", sa.String(128), primary_key=True),
    sa.Column("version", sa.String(128), primary_key=True),
    sa.Column("started_at", sa.Float, nullable=False),
    sa.Column("heartbeat_at", sa.Float, nullable=False),
    # The tool names of the agent the worker runs (migration 0007): what a run moved to
    # this version may wait on. NULL for a row registered before it (unknown).
    sa.Column("tools", sa.JSON, nullable=True),
)
sa.Index("workers_version", workers.c.version, workers.c.heartbeat_at)

# Per user (reference §13, migrations 0012 and 0018): how many runs a worker carries now
# (running under an owner), how many wait for one (running, no owner, a delayed one
# included), and the first of those in the claim's order, the *head* (its priority, since
# when it waits, id, and what tells whether a worker may take it now: its version and its
# delay; NULL when none waits). Triggers on ``runs`` (written in migration 0018) keep them
# on every change of a run's state or owner, and of what the head copies of a waiting
# run, whichever statement makes it, so no path can forget them; a step of a carried run
# fires none. A claim reads the users in the order of their heads (``user_load_heads``),
# so it finds the users to take from without reading their runs; it locks the rows of the
# users it claims for, so claims of one user's runs are serialised and each sees the count
# the one before left.
user_load = sa.Table(
    "user_load",
    metadata,
    sa.Column("user_id", sa.String(128), primary_key=True),
    sa.Column("carried", sa.Integer, nullable=False, server_default="0"),
    sa.Column("ready", sa.Integer, nullable=False, server_default="0"),
    sa.Column("head_priority", sa.Integer, nullable=True),
    sa.Column("head_since", sa.Float, nullable=True),
    sa.Column("head_id", sa.String(64), nullable=True),
    sa.Column("head_version", sa.String(128), nullable=True),
    sa.Column("head_ready_at", sa.Float, nullable=True),
)
# The claim's order of users: the priority of their first waiting run (highest first),
# their carried runs (fewest first), since when that run waits, its id.
HEADS_ORDER = (
    user_load.c.head_priority.desc(),
    user_load.c.carried,
    user_load.c.head_since,
    user_load.c.head_id,
)
# The users with waiting runs: the index's predicate, its 0 written out so that a plan
# made for any parameters (a prepared statement's) can use the index.
HAS_WAITING = user_load.c.ready > sa.literal_column("0")
_partial(user_load, "user_load_heads", *HEADS_ORDER, where="ready > 0")

# The model's requests and tokens, fleet-wide (reference §13, migrations 0012 and 0014):
# each row is a lease of ``requests`` request starts taken at ``at`` (the database's clock)
# for the runs of ``user_id``, or the ``tokens`` that user's requests reported when they
# ended at ``at``. The limiter sums the rows of the last minute, in all and by user;
# ``gates`` holds the row a lease locks, so leases are taken one at a time.
model_usage = sa.Table(
    "model_usage",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("at", sa.Float, nullable=False),
    sa.Column("requests", sa.Integer, nullable=False, server_default="0"),
    sa.Column("tokens", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("user_id", sa.String(128), nullable=True),
)
sa.Index("model_usage_at", model_usage.c.at)

# Who waits for the model's capacity, fleet-wide (reference §13, migration 0014): one row
# per limiter (``waiter``, a process's engine) and user whose runs it holds back now,
# ``wanting`` request starts, waiting ``since``; good ``until`` a little after the limiter
# was told to come back, so a limiter that died stops being owed capacity. A lease gives
# what frees to these users in turn, the one who used least of the window first.
model_waits = sa.Table(
    "model_waits",
    metadata,
    sa.Column("waiter", sa.String(64), primary_key=True),
    sa.Column("user_id", sa.String(128), primary_key=True),
    sa.Column("wanting", sa.Integer, nullable=False),
    sa.Column("since", sa.Float, nullable=False),
    sa.Column("until", sa.Float, nullable=False),
)

# Rows locked to serialise one fleet-wide decision each (``FOR UPDATE`` on PostgreSQL;
# SQLite serialises writers anyway): ``model`` for leases of model capacity.
gates = sa.Table(
    "gates",
    metadata,
    sa.Column("name", sa.String(32), primary_key=True),
)

# Schedules (reference §13, migration 0012): a cron expression in a timezone, the
# question each tick asks as the schedule's user, and the next tick due (epoch seconds).
# A tick is claimed by moving ``next_at`` on in a conditional UPDATE, in the transaction
# that creates its run, so each tick starts exactly one run, fleet-wide.
schedules = sa.Table(
    "schedules",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("user_id", sa.String(128), nullable=False),
    sa.Column("cron", sa.String(255), nullable=False),
    sa.Column("timezone", sa.String(64), nullable=False),
    sa.Column("question", SealedText, nullable=False),
    sa.Column("limits", sa.JSON, nullable=True),
    sa.Column("next_at", sa.Float, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("last_fired_at", sa.Float, nullable=True),
    sa.Column("fired", sa.Integer, nullable=False, server_default="0"),
    sa.Column("missed", sa.Integer, nullable=False, server_default="0"),
)
sa.Index("schedules_due", schedules.c.next_at)
sa.Index("schedules_user", schedules.c.user_id, schedules.c.created_at)
