"""The database's clock (invariant 11: one clock): ``db_now()``, compiled per backend.

Every time the store writes or compares (heartbeats, expiry, staleness, retention, delays)
is the database's, never a worker's, so workers whose clocks disagree still agree on it.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement


class db_now(FunctionElement[float]):
    """The database's current time in epoch seconds (invariant 11: one clock)."""

    type = sa.Float()
    inherit_cache = True


@compiles(db_now, "postgresql")
def _now_pg(element: db_now, compiler: SQLCompiler, **kw: Any) -> str:
    return "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"


@compiles(db_now, "sqlite")
def _now_sqlite(element: db_now, compiler: SQLCompiler, **kw: Any) -> str:
    return "((julianday('now') - 2440587.5) * 86400.0)"
