"""Which agent versions a claim may take (reference §12): a worker claims, recovers, expires
and resumes only runs of the versions it serves. One condition, used by every claim."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from tether.store.sql.schema import runs

# ``b_versions``: the versions served; ``b_any_version``: callers of the store that name
# no versions (tests, tools) take any.
SERVED = sa.or_(
    sa.bindparam("b_any_version", type_=sa.Boolean),
    runs.c.agent_version.in_(sa.bindparam("b_versions", expanding=True)),
)


def served(versions: Sequence[str] | None) -> dict[str, Any]:
    """The parameters of ``SERVED``: ``versions``, or any version when None."""
    if versions is None:
        return {"b_any_version": True, "b_versions": []}
    return {"b_any_version": False, "b_versions": list(versions)}
