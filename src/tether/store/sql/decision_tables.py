"""The tables of who decides (reference §15, §19): the calls a suspension waits on, the
decisions that used their tokens, the approvals a quorum counts, and the audit of every
decision, kept apart from the runs it names.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from tether.store.sql.meta import BigId, metadata
from tether.store.sql.sealed import SealedJSON, SealedText

ALIASED = "alias_hash IS NOT NULL"
TO_ESCALATE = "escalate_at IS NOT NULL AND escalated_at IS NULL"
ESCALATION_UNSENT = "escalated_at IS NOT NULL AND escalation_notified_at IS NULL"


def _partial(table: sa.Table, name: str, *cols: str, where: str, unique: bool = False) -> sa.Index:
    clause = sa.text(where)
    columns: list[Any] = [table.c[col] for col in cols]
    return sa.Index(name, *columns, unique=unique, postgresql_where=clause, sqlite_where=clause)


# The calls a suspension waits on (reference §15, migration 0011): one row per call, each
# with its own token (only its hash), in call order. ``epoch`` is the run's lease epoch
# when it suspended: a suspension's rows are those whose epoch is the run's while it is
# suspended (every claim moves the epoch on, so a token never outlives its suspension).
# An expired suspension keeps its rows, so its tokens are still matched to their run.
# The rows of calls decided but not yet carried out outlive a re-suspension of an
# earlier call of their turn (their decisions stand); the rest are replaced by the next
# suspension, and all go when a halted run is continued.
pending_calls = sa.Table(
    "pending_calls",
    metadata,
    sa.Column("token_hash", sa.String(64), primary_key=True),
    sa.Column(
        "run_id", sa.String(64), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False
    ),
    sa.Column("tool_call_id", sa.String(128), nullable=False),
    sa.Column("position", sa.Integer, nullable=False),
    sa.Column("epoch", sa.Integer, nullable=False),
    # The call as the human is asked to decide it (``runs.Pending``'s JSON).
    sa.Column("call", SealedJSON, nullable=False),
    # When this call's notice was delivered; NULL until then (the reaper re-issues it).
    sa.Column("notified_at", sa.Float, nullable=True),
    # Who decides (reference §19, migration 0016): when the call was suspended, when it is
    # due to be escalated (NULL: its tool does not escalate) and when it was. An escalated
    # call gets a second token for the people it is escalated to (``alias_hash``: its
    # hash; the call's own token keeps working), whose notice's delivery is recorded apart.
    sa.Column("suspended_at", sa.Float, nullable=True),
    sa.Column("escalate_at", sa.Float, nullable=True),
    sa.Column("escalated_at", sa.Float, nullable=True),
    sa.Column("alias_hash", sa.String(64), nullable=True),
    sa.Column("escalation_notified_at", sa.Float, nullable=True),
    # The call's tool and its preview's digest, in the clear (migration 0017): ``call`` may
    # be sealed (reference §20), and SQL still reads these two.
    sa.Column("tool", sa.String(128), nullable=True),
    sa.Column("digest", sa.String(64), nullable=True),
)
sa.Index("pending_calls_run", *(pending_calls.c[c] for c in ("run_id", "epoch", "position")))
_partial(pending_calls, "pending_calls_alias", "alias_hash", where=ALIASED, unique=True)
# The escalation pass reads only the calls still to escalate, soonest first, and those
# whose escalation notice is not delivered.
_partial(pending_calls, "pending_calls_escalation", "escalate_at", where=TO_ESCALATE)
_partial(pending_calls, "pending_calls_escalation_unsent", "escalated_at", where=ESCALATION_UNSENT)

# Every decision that used a token, kept for as long as the run, so a used token answers
# already_resumed with the decision that used it (reference §6).
decisions = sa.Table(
    "decisions",
    metadata,
    sa.Column("token_hash", sa.String(64), primary_key=True),
    sa.Column(
        "run_id", sa.String(64), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False
    ),
    sa.Column("tool_call_id", sa.String(128), nullable=False),
    sa.Column("decision", sa.String(16), nullable=False),
    sa.Column("decided_by", sa.String(128), nullable=False),
    sa.Column("decided_at", sa.Float, nullable=False),
    sa.Column("digest", sa.String(64), nullable=True),
    # The approver's reason and edited arguments (reference §9, migration 0004).
    sa.Column("reason", SealedText, nullable=True),
    sa.Column("arguments", SealedJSON, nullable=True),
)
sa.Index("decisions_run", decisions.c.run_id, decisions.c.tool_call_id)


# The approvals of a call that waits on a quorum (reference §19, migration 0016): one per
# person and artefact (the preview's digest; "" for a tool without a preview). Only those
# of the call's current digest count; the row goes with its call's.
approvals = sa.Table(
    "approvals",
    metadata,
    sa.Column(
        "token_hash",
        sa.String(64),
        sa.ForeignKey("pending_calls.token_hash", ondelete="CASCADE", onupdate="CASCADE"),
        primary_key=True,
    ),
    sa.Column("approver", sa.String(128), primary_key=True),
    sa.Column("digest", sa.String(64), primary_key=True),
    sa.Column("approved_at", sa.Float, nullable=False),
    sa.Column("reason", SealedText, nullable=True),
)

# The audit of decisions (reference §19, migration 0016): every decision, recorded
# approval, escalation, continuation grant, migration and cancellation, appended in the
# transaction of what it records. Never changed (a trigger refuses an UPDATE) and kept
# apart from the runs, so it outlives their retention; its own retention purges it.
audit = sa.Table(
    "audit",
    metadata,
    sa.Column("seq", BigId, primary_key=True, autoincrement=True),
    sa.Column("at", sa.Float, nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("run_id", sa.String(64), nullable=True),
    sa.Column("root_run_id", sa.String(64), nullable=True),
    sa.Column("user_id", sa.String(128), nullable=True),
    sa.Column("by", sa.String(128), nullable=True),
    sa.Column("tool", sa.String(128), nullable=True),
    sa.Column("tool_call_id", sa.String(128), nullable=True),
    sa.Column("digest", sa.String(64), nullable=True),
    sa.Column("decision", sa.String(16), nullable=True),
    sa.Column("reason", SealedText, nullable=True),
    sa.Column("outcome", sa.String(32), nullable=True),
)
sa.Index("audit_user", audit.c.user_id, audit.c.seq)
sa.Index("audit_by", audit.c.by, audit.c.seq)
sa.Index("audit_at", audit.c.at)
