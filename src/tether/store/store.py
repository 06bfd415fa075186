"""The store: one object whose methods are the database operations, each one
transaction. It is composed of one part per job (each in its own module)."""

from __future__ import annotations

from tether.store.claims import Claims
from tether.store.reads import Reads
from tether.store.steps import Steps
from tether.store.upkeep import Upkeep
from tether.store.users import Users


class Store(Steps, Claims, Upkeep, Reads, Users):
    """The synchronous store for a database URL: SQLite or PostgreSQL (``dialect``).

    ``steps``: a running owner's fenced writes; ``claims``: creating, claiming,
    continuing, cancelling; ``upkeep``: expiry, notices, retention; ``reads``; ``users``.
    Each method is one transaction; the engine's async API reaches each through one
    thread hop. Every state change is a ``transitions.Transition``, checked against
    ``tether.runs.TRANSITIONS``."""
