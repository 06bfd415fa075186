"""What an erasure must leave behind (reference §20), read with plain SQL: every row of
every table of the database that mentions a string, and a user's runs written straight to
a store in bulk (for erasures of several batches)."""

from __future__ import annotations

import uuid

import sqlalchemy as sa
from store_runs import new_run

from tether.runs import RunState
from tether.store import Store
from tether.store.sql.schema import runs


def mentions(url: str, needles: list[str]) -> list[tuple[str, str]]:
    """Each (table, row as text) of the database at ``url`` whose text holds one of
    ``needles``: every table the database has, read only, whatever the code knows of it."""
    store = Store(url)
    found: list[tuple[str, str]] = []
    try:
        with store.engine.connect() as conn:
            for table in sa.inspect(conn).get_table_names():
                rows = conn.execute(sa.text(f'SELECT * FROM "{table}"')).all()
                for row in rows:
                    text = repr(tuple(row))
                    if any(needle in text for needle in needles):
                        found.append((table, text))
    finally:
        store.close()
    return found


def stopped_runs(store: Store, user: str, count: int, *, question: str = "q") -> list[str]:
    """``count`` runs of ``user`` written straight to the store, each then answered (so no
    worker takes them): an erasure of several batches without running them."""
    ids = [new_run(store, user) for _ in range(count)]
    with store.engine.begin() as conn:
        conn.execute(
            runs.update()
            .where(runs.c.id.in_(ids))
            .values(state=RunState.ANSWERED.value, question=question)
        )
    return ids


def marker() -> str:
    """A string no test data holds by chance."""
    return "mark-" + uuid.uuid4().hex[:12]
