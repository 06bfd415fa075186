"""The store: one object whose methods are the database operations, each one
transaction. It is composed of one part per job (each in its own module)."""

from __future__ import annotations

from tether.store.claims import Claims
from tether.store.compactions import Compactions
from tether.store.forks import Forks
from tether.store.rates import Rates
from tether.store.reads import Reads
from tether.store.requests import Requests
from tether.store.schedules import Schedules
from tether.store.sessions import Sessions
from tether.store.steps import Steps
from tether.store.suspensions import Suspensions
from tether.store.threads import Threads
from tether.store.upkeep import Upkeep
from tether.store.users import Users
from tether.store.versions import Versions
from tether.store.waiting import Waiting


class Store(
    Steps,
    Compactions,
    Requests,
    Claims,
    Suspensions,
    Forks,
    Threads,
    Upkeep,
    Reads,
    Users,
    Sessions,
    Versions,
    Waiting,
    Schedules,
    Rates,
):
    """The synchronous store for a database URL: SQLite or PostgreSQL, whose differences
    are the hooks of its ``dialect`` (``dialect.Dialect``, picked by ``dialect_for``).

    ``steps``: a running owner's fenced writes; ``compactions``: storing a summary the
    model sees in place of the messages it covers; ``claims``: creating, claiming,
    continuing, cancelling, deciding a suspension's calls; ``suspensions``: what a token
    or a suspended call names; ``requests``: creating a run under an ``Idempotency-Key``;
    ``forks``: forking a run at a step; ``threads``: a run's
    place in its conversation, reading, listing and deleting threads; ``upkeep``: expiry,
    notices, retention; ``reads``; ``users``; ``sessions``: the inbox's sessions;
    ``versions``: the worker registry, stranded runs, migrating a run to another agent
    version; ``waiting``: why runs wait, counted; ``schedules``: cron schedules and
    their ticks, each claimed with the run it creates; ``rates``: leases of the fleet's
    model capacity.
    Each method is one transaction; the engine's async API reaches each through one
    thread hop. Every state change is a ``transitions.Transition``, checked against
    ``tether.runs.TRANSITIONS``."""
