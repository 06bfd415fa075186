"""Idempotent creation (reference §14): a run created under its user's ``Idempotency-Key``
stores the key, the digest of the request's body and the answer first sent
(``run_requests``) in the transaction that inserts the run, so the key and its run exist
together or not at all, and go together (the row cascades with its run).

Concurrent requests with one key never make two runs. On SQLite writers are serialised
(``BEGIN IMMEDIATE``): the transaction's own look-up of the key sees any earlier one. On
PostgreSQL a second transaction that missed the first's uncommitted key blocks on the
key's primary key when it inserts it (``Dialect.insert_new``: ON CONFLICT DO NOTHING)
until the first commits, then finds it taken, rolls its own run back and answers the
first's. A follow-up waits on its thread's lock instead, then finds the thread busy with
the first's run: its ``thread_busy`` is answered by the first's key, found then.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from tether.errors import ThreadBusy
from tether.runs import Run
from tether.store import faults
from tether.store.base import StoreBase
from tether.store.claims import insert_run
from tether.store.clock import db_now
from tether.store.records import RunRequest
from tether.store.schema import run_requests, runs

# The status a creation answers (reference §6: 202 Accepted), stored with its key.
ACCEPTED = 202

_REQUEST = (
    sa.select(
        runs,
        run_requests.c.body_digest.label("request_digest"),
        run_requests.c.status.label("request_status"),
        run_requests.c.response.label("request_response"),
    )
    .select_from(run_requests.join(runs, runs.c.id == run_requests.c.run_id))
    .where(
        run_requests.c.user_id == sa.bindparam("b_user"),
        run_requests.c.key == sa.bindparam("b_key"),
    )
)


class _Taken(Exception):
    """A concurrent request stored the key first: this one's run is rolled back."""


def _found(conn: Connection, user_id: str, key: str) -> RunRequest | None:
    row = conn.execute(_REQUEST, {"b_user": user_id, "b_key": key}).first()
    if row is None:
        return None
    return RunRequest(
        key=key,
        digest=row.request_digest,
        status=row.request_status,
        response=dict(row.request_response),
        run=Run.from_row(row._mapping),
    )


class Requests(StoreBase):
    """Creation requests by ``Idempotency-Key``: looking one up, creating a run under one."""

    def run_request(self, user_id: str, key: str) -> RunRequest | None:
        """``user_id``'s request stored under ``key``, with its run as it is now; None
        when the key is free (never used, or its run was deleted or purged)."""
        with self.engine.connect() as conn:
            return _found(conn, user_id, key)

    @faults.idempotent
    def create_requested_run(self, *, key: str, digest: str, **fields: Any) -> RunRequest:
        """The request already stored under ``user_id``'s ``key`` (whatever its body: the
        caller compares ``digest``), or else a new run (``claims.insert_run`` of
        ``fields``) with the key, ``digest`` and the answer ``{"id", "state"}`` it gets,
        in one transaction. A refusal (``thread_busy``, ``not_found``) stores nothing.

        Safe to try again, even after its COMMIT was cut off: a second try finds the key
        the first stored, if it landed, and answers with it."""
        while True:
            try:
                return self._create_once(key, digest, fields)
            except _Taken:
                continue  # rolled back; the next try finds the first request's key

    def _create_once(self, key: str, digest: str, fields: dict[str, Any]) -> RunRequest:
        user_id: str = fields["user_id"]
        with self.begin() as conn:
            earlier = _found(conn, user_id, key)
            if earlier is not None:
                return earlier
            try:
                run = insert_run(conn, self.dialect, **fields)
            except ThreadBusy:
                # A first request of this key held the thread's lock and has committed
                # since: its run is what keeps the thread busy.
                earlier = _found(conn, user_id, key)
                if earlier is None:
                    raise
                return earlier
            response = {"id": run.id, "state": run.state.value}
            stored = conn.execute(
                self.dialect.insert_new(run_requests)
                .values(
                    user_id=user_id,
                    key=key,
                    run_id=run.id,
                    body_digest=digest,
                    status=ACCEPTED,
                    response=response,
                    created_at=db_now(),
                )
                .returning(run_requests.c.run_id)
            ).first()
            if stored is None:
                raise _Taken
            return RunRequest(key=key, digest=digest, status=ACCEPTED, response=response, run=run)
