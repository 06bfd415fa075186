"""The schema's one ``MetaData`` and the column types its tables share."""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

# An auto-incrementing 64-bit key: BIGINT on PostgreSQL, INTEGER (the rowid alias) on SQLite.
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
