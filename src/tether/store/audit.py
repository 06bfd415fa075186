"""The audit of decisions (reference §19): one record per decision, recorded approval,
escalation, continuation grant, migration and cancellation, appended in the transaction of
what it records (``append``), so a record exists exactly when its fact does. Records are
never changed (the schema refuses an UPDATE), outlive their runs, and go only when their
own retention has passed (``purge_audit``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from tether.errors import InvalidInput
from tether.runs import iso
from tether.store.backend.clock import db_now
from tether.store.base import StoreBase
from tether.store.sql.schema import audit


class AuditKind(str, enum.Enum):
    """What an audit record records; the stored string."""

    DECIDED = "decided"  # a call's decision that took effect (approve or decline)
    RECORDED = "recorded"  # an approval or decision stored before it took effect
    ESCALATED = "escalated"
    CONTINUED = "continued"
    MIGRATED = "migrated"
    CANCELLED = "cancelled"
    ERASED = "erased"


FIELDS = (
    "run_id",
    "root_run_id",
    "user_id",
    "by",
    "tool",
    "tool_call_id",
    "digest",
    "decision",
    "reason",
    "outcome",
)


@dataclass(frozen=True, kw_only=True)
class AuditRecord:
    """One audit record as stored (``at``: the database's clock, epoch seconds)."""

    seq: int
    at: float
    kind: str
    values: Mapping[str, Any]

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> AuditRecord:
        return cls(
            seq=int(row["seq"]),
            at=float(row["at"]),
            kind=str(row["kind"]),
            values={name: row[name] for name in FIELDS},
        )

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "at": iso(self.at), "kind": self.kind, **self.values}


@dataclass(frozen=True, kw_only=True)
class AuditPage:
    """A page of audit records in ``seq`` order; ``after`` is the next page's cursor (the
    last record's ``seq``) while ``more`` records follow, else None."""

    records: list[AuditRecord]
    more: bool

    @property
    def after(self) -> int | None:
        return self.records[-1].seq if self.more and self.records else None

    def __iter__(self) -> Iterator[AuditRecord]:
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)

    def to_json(self) -> dict[str, Any]:
        return {
            "items": [r.to_json() for r in self.records],
            "more": self.more,
            "after": self.after,
        }


MAX_PAGE = 1000
MAX_SEQ = 2**63 - 1  # a seq column's largest value on both backends


def audit_cursor(after: Any, limit: Any) -> tuple[int, int]:
    """A page's cursor (a ``seq``, 0 for the first page) and size (1 to ``MAX_PAGE``),
    checked (``invalid_input``)."""
    if isinstance(after, bool) or not isinstance(after, int) or not 0 <= after <= MAX_SEQ:
        raise InvalidInput("after must be the seq of an audit record (a whole number >= 0)")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise InvalidInput(f"limit must be between 1 and {MAX_PAGE}")
    return after, limit


_INSERT = audit.insert().values(at=db_now())
_NONE = dict.fromkeys(FIELDS)


def append(conn: Connection, kind: AuditKind, records: list[dict[str, Any]]) -> None:
    """Append records of ``kind`` (each a dict of ``FIELDS``; those absent are null), in
    the caller's transaction, stamped with the database's clock."""
    if records:
        conn.execute(_INSERT, [{**_NONE, **r, "kind": kind.value} for r in records])


def of_run(run: Any, **values: Any) -> dict[str, Any]:
    """A record's fields naming ``run`` (its id, root and owner) and ``values``."""
    return {
        "run_id": run.id,
        "root_run_id": run.root_run_id or run.id,
        "user_id": run.user_id,
        **values,
    }


_PAGE = (
    sa.select(audit)
    .where(
        sa.or_(audit.c.user_id == sa.bindparam("b_viewer"), audit.c.by == sa.bindparam("b_viewer")),
        audit.c.seq > sa.bindparam("b_after"),
    )
    .order_by(audit.c.seq)
    .limit(sa.bindparam("b_limit"))
)
_EXPORT = (
    sa.select(audit)
    .where(audit.c.seq > sa.bindparam("b_after"))
    .order_by(audit.c.seq)
    .limit(sa.bindparam("b_limit"))
)
_OLDEST_PAST = (
    sa.select(audit.c.seq)
    .where(audit.c.at < db_now() - sa.bindparam("b_retention", type_=sa.Float))
    .order_by(audit.c.seq)
    .limit(sa.bindparam("b_batch"))
)
_PURGE = audit.delete().where(audit.c.seq.in_(sa.bindparam("b_seqs", expanding=True)))


class Audit(StoreBase):
    """Reading, exporting and purging the audit of decisions."""

    def audit_page(self, viewer: str, after: int, limit: int) -> tuple[list[AuditRecord], bool]:
        """Up to ``limit`` records after ``seq`` ``after`` of ``viewer``'s runs or decided
        by ``viewer``, in ``seq`` order, and whether more follow."""
        params = {"b_viewer": viewer, "b_after": after, "b_limit": limit + 1}
        with self.engine.connect() as conn:
            rows = conn.execute(_PAGE, params).all()
        found = [AuditRecord.from_row(r._mapping) for r in rows[:limit]]
        return found, len(rows) > limit

    def audit_records(
        self, *, after: int, limit: int, since: float | None = None, user: str | None = None
    ) -> tuple[list[AuditRecord], bool]:
        """Up to ``limit`` records after ``seq`` ``after``, in ``seq`` order (at or after
        ``since``, epoch seconds; of runs owned by ``user``), for an operator's export, and
        whether more follow."""
        query = _EXPORT
        if since is not None:
            query = query.where(audit.c.at >= since)
        if user is not None:
            query = query.where(audit.c.user_id == user)
        with self.engine.connect() as conn:
            rows = conn.execute(query, {"b_after": after, "b_limit": limit + 1}).all()
        return [AuditRecord.from_row(r._mapping) for r in rows[:limit]], len(rows) > limit

    def purge_audit(self, retention_s: float, batch: int) -> int:
        """Delete up to ``batch`` records older than ``retention_s`` by the database's
        clock, oldest first; how many went. Safe twice: a deleted record is not found."""
        with self.begin() as conn:
            params = {"b_retention": retention_s, "b_batch": batch}
            seqs = list(conn.execute(_OLDEST_PAST, params).scalars())
            if seqs:
                conn.execute(_PURGE, {"b_seqs": seqs})
            return len(seqs)
