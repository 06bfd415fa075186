"""The store: one object whose methods are the database operations, each one
transaction. It is composed of one part per job (each in its own module)."""

from __future__ import annotations

from tether.store.approvals import Rounds
from tether.store.audit import Audit
from tether.store.claims import Claims
from tether.store.compaction import Compaction
from tether.store.creation import Creation
from tether.store.erasure import Erasure
from tether.store.escalations import Escalations
from tether.store.forks import Forks
from tether.store.model_rate import ModelRate
from tether.store.reads import Reads
from tether.store.schedules import Schedules
from tether.store.sign_ins import SignIns
from tether.store.steps import Steps
from tether.store.suspensions import Suspensions
from tether.store.threads import Threads
from tether.store.trees import Trees
from tether.store.upkeep import Upkeep
from tether.store.users import Users
from tether.store.versions import Versions
from tether.store.wait_counts import WaitCounts


class Store(
    Steps,
    Compaction,
    Creation,
    Claims,
    Suspensions,
    Forks,
    Threads,
    Trees,
    Upkeep,
    Reads,
    Users,
    SignIns,
    Versions,
    WaitCounts,
    Schedules,
    ModelRate,
    Rounds,
    Audit,
    Escalations,
    Erasure,
):
    """The synchronous store for a database URL: SQLite or PostgreSQL, whose differences
    are the hooks of its ``dialect`` (``backend.dialect.Dialect``, picked by
    ``dialect_for``).

    ``steps``: a running owner's fenced writes; ``compaction``: storing a summary the
    model sees in place of the messages it covers; ``creation``: creating a run, under an
    ``Idempotency-Key`` or not; ``claims``: claiming, continuing, cancelling, deciding a
    suspension's calls; ``suspensions``: what a token or a suspended call names;
    ``forks``: forking a run at a step; ``threads``: a run's place in its conversation,
    reading, listing and deleting threads; ``upkeep``: expiry, notices, retention;
    ``reads``; ``users``; ``sign_ins``: the inbox's sign-in sessions; ``versions``: the
    worker registry, stranded runs, migrating a run to another agent version;
    ``wait_counts``: why runs wait, counted; ``schedules``: cron schedules and their
    ticks, each claimed with the run it creates; ``model_rate``: leases of the fleet's
    model capacity; ``approvals``: a quorum call's new round on an edit (reference §19);
    ``audit``: reading, exporting and purging the audit of decisions; ``escalations``:
    escalating calls nobody decided in time; ``erasure``: erasing a user's data, batch
    by batch.
    Each method is one transaction; the engine's async API reaches each through one
    thread hop. Every state change is a ``sql.transitions.Transition``, checked against
    ``tether.runs.TRANSITIONS``. The statements live in ``sql``, what differs between
    SQLite and PostgreSQL in ``backend``."""
