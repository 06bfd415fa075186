"""Idempotent creation (reference §14): a run created under its user's ``Idempotency-Key``
stores the key, the digest of the request's body and the state it first answered in its
own row (``runs.request_key``, unique per user by a partial index), inserted in the
transaction that creates the run, so the key and its run exist together or not at all,
and the key is free again once its run is deleted or purged.

Concurrent requests with one key never make two runs, and a fresh key costs no statement
of its own (the run's INSERT, built and cached as without a key, carries it). On SQLite
writers are serialised (``BEGIN IMMEDIATE``); on PostgreSQL a second transaction's INSERT
of the same key waits on the unique index until the first commits. Either way the second
INSERT fails on the index, and the request rolls back and answers the first request's
answer, read then. A follow-up of the same key waits
on its thread's lock instead and finds the thread busy with the first's run: its
``thread_busy`` is answered by the first's key too.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from tether.errors import ThreadBusy
from tether.runs import Run
from tether.store.backend import faults
from tether.store.base import StoreBase
from tether.store.claims import insert_run
from tether.store.records import RunRequest
from tether.store.sql.schema import runs

# The status a creation answers (reference §6: 202 Accepted).
ACCEPTED = 202

_REQUEST = sa.select(runs).where(
    runs.c.user_id == sa.bindparam("b_user"), runs.c.request_key == sa.bindparam("b_key")
)


class Requests(StoreBase):
    """Creation requests by ``Idempotency-Key``: looking one up, creating a run under one."""

    def run_request(self, user_id: str, key: str) -> RunRequest | None:
        """``user_id``'s request stored under ``key``, with its run as it is now; None
        when the key is free (never used, or its run was deleted or purged)."""
        with self.engine.connect() as conn:
            row = conn.execute(_REQUEST, {"b_user": user_id, "b_key": key}).first()
        if row is None:
            return None
        run = Run.from_row(row._mapping)
        return RunRequest(
            key=key,
            digest=row.request_digest,
            status=ACCEPTED,
            response={"id": run.id, "state": row.request_state},
            run=run,
        )

    @faults.idempotent
    def create_requested_run(self, *, key: str, digest: str, **fields: Any) -> RunRequest:
        """A new run (``claims.insert_run`` of ``fields``) stored with ``user_id``'s
        ``key`` and ``digest``, in one transaction; or, when the key names a run already,
        that request (whatever its body: the caller compares ``digest``). A refusal
        (``thread_busy``, ``not_found``) stores nothing.

        Safe to try again, even after its COMMIT was cut off: a second try finds the key
        the first stored, if it landed, and answers with it."""
        try:
            with self.begin() as conn:
                run = insert_run(conn, self.dialect, request=(key, digest), **fields)
        except (ThreadBusy, IntegrityError):
            # Rolled back. Another request of this key (or this one's first try) stored
            # it first; or the refusal is this request's own.
            found = self.run_request(fields["user_id"], key)
            if found is None:
                raise
            return found
        response = {"id": run.id, "state": run.state.value}
        return RunRequest(key=key, digest=digest, status=ACCEPTED, response=response, run=run)
