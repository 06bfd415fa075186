"""Agent versions in the store (reference §12): the registry of live workers and the versions
they serve, the runs stranded on a version none of them serves, and the deliberate move
of a run to another version (``move_run``).

A worker's rows carry its heartbeat on the database's clock (invariant 11); a version is
served while one of its rows is fresher than the heartbeat timeout. A worker that stops
cleanly removes its rows, so the runs it alone served show as stranded at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from tether.runs import Run, RunState
from tether.store import audit
from tether.store.audit import AuditKind
from tether.store.backend.clock import db_now
from tether.store.base import StoreBase
from tether.store.sql.schema import runs, workers
from tether.store.sql.steps import add_event
from tether.store.sql.transitions import state_in
from tether.store.suspensions import with_calls

# Rows of workers whose heartbeat is older than this are forgotten when a worker registers.
FORGET_AFTER_S = 86_400.0

_OF_WORKER = workers.c.worker_id == sa.bindparam("b_worker")
_STALE_S = sa.bindparam("b_stale", type_=sa.Float)
_LIVE = workers.c.heartbeat_at > db_now() - _STALE_S
# A run waits for a worker when it is ready (running without an owner), orphaned (its
# owner's heartbeat is stale: it waits for a reaper), suspended (its decision is carried
# out, and the rest of its loop run, by a process of its version) or queued behind the
# earlier runs of its thread (a worker of its version starts it).
_WAITING = sa.or_(
    sa.and_(
        state_in([RunState.RUNNING]),
        sa.or_(runs.c.owner.is_(None), runs.c.heartbeat_at < db_now() - _STALE_S),
    ),
    state_in([RunState.QUEUED, RunState.SUSPENDED]),
)
_SERVED_LIVE = (
    sa.select(workers.c.worker_id).where(workers.c.version == runs.c.agent_version, _LIVE).exists()
)
_STRANDED = sa.and_(_WAITING, ~_SERVED_LIVE)
_STRANDED_RUNS = (
    sa.select(runs)
    .where(_STRANDED)
    .order_by(runs.c.updated_at, runs.c.id)
    .limit(sa.bindparam("b_limit", type_=sa.Integer))
)
_COUNT_STRANDED = sa.select(sa.func.count()).select_from(runs).where(_STRANDED)
_LIVE_VERSIONS = sa.select(workers.c.version).where(_LIVE).distinct().order_by(workers.c.version)
_LIVE_WORKERS = sa.select(workers.c.worker_id).where(_LIVE).distinct().order_by(workers.c.worker_id)
_RUN = sa.select(runs).where(runs.c.id == sa.bindparam("b_id"))
# The tools each live worker of a version registered (NULL: registered before 0007).
_LIVE_TOOLS = sa.select(workers.c.tools).where(
    workers.c.version == sa.bindparam("b_version"), _LIVE
)


@dataclass(frozen=True, kw_only=True)
class Migration:
    """What ``move_run`` found: the run as moved (``run``), or why it was not moved
    (``refused``: ``not_found``, ``already_finished``, ``busy``, ``same_version``,
    ``not_served``, ``tools_unknown``, ``tool_unavailable``) with the run as it stands."""

    run: Run | None
    refused: str | None = None


class Versions(StoreBase):
    """The worker registry, stranded runs, and moving a run to another agent version."""

    def register_worker(
        self, worker_id: str, versions: Sequence[str], tools: Sequence[str]
    ) -> None:
        """Record that ``worker_id`` is alive and serves ``versions`` with ``tools`` (the
        tool names of its agent), replacing what it served before, and forget workers
        silent for a day."""
        with self.engine.begin() as conn:
            conn.execute(workers.delete().where(_OF_WORKER), {"b_worker": worker_id})
            conn.execute(workers.delete().where(workers.c.heartbeat_at < db_now() - FORGET_AFTER_S))
            conn.execute(
                workers.insert().values(
                    worker_id=worker_id,
                    version=sa.bindparam("b_version"),
                    tools=sa.bindparam("b_tools", type_=sa.JSON),
                    started_at=db_now(),
                    heartbeat_at=db_now(),
                ),
                [
                    {"b_version": version, "b_tools": sorted(set(tools))}
                    for version in dict.fromkeys(versions)
                ],
            )

    def beat_worker(self, worker_id: str) -> bool:
        """Refresh the worker's heartbeat; False if it is not registered (any more)."""
        with self.engine.begin() as conn:
            changed = conn.execute(
                workers.update().where(_OF_WORKER).values(heartbeat_at=db_now()),
                {"b_worker": worker_id},
            )
            return bool(changed.rowcount)

    def leave(self, worker_id: str) -> None:
        """Remove the worker's rows: it serves nothing any more."""
        with self.engine.begin() as conn:
            conn.execute(workers.delete().where(_OF_WORKER), {"b_worker": worker_id})

    def live_versions(self, *, stale_after_s: float) -> list[str]:
        """The versions some worker with a fresh heartbeat serves."""
        with self.engine.connect() as conn:
            return list(conn.execute(_LIVE_VERSIONS, {"b_stale": stale_after_s}).scalars())

    def live_workers(self, *, stale_after_s: float) -> list[str]:
        """The ids of the workers with a fresh heartbeat (one per worker process), whatever
        the versions each serves."""
        with self.engine.connect() as conn:
            return list(conn.execute(_LIVE_WORKERS, {"b_stale": stale_after_s}).scalars())

    def stranded_runs(self, *, stale_after_s: float, limit: int) -> list[Run]:
        """Runs that wait on an agent version no live worker serves, longest first."""
        params = {"b_stale": stale_after_s, "b_limit": limit}
        with self.engine.connect() as conn:
            return [Run.from_row(r._mapping) for r in conn.execute(_STRANDED_RUNS, params)]

    def count_stranded(self, *, stale_after_s: float) -> int:
        """How many runs are stranded (the ``tether_runs_stranded`` gauge)."""
        with self.engine.connect() as conn:
            return int(conn.execute(_COUNT_STRANDED, {"b_stale": stale_after_s}).scalar() or 0)

    def move_run(
        self,
        *,
        run_id: str,
        to_version: str,
        by: str,
        why: str | None,
        stale_after_s: float,
    ) -> Migration:
        """Move a run that is not terminal and not carried by a live owner to
        ``to_version``, one some live worker serves, recording a ``migrated`` event (who,
        why, both versions); one transaction, under the run's row lock, so it cannot race
        a claim. A suspended run is refused when a tool it waits on is missing from the
        tools any live worker of ``to_version`` registered. A queued run wakes the
        workers; an orphan stays as it is, so a reaper of the new version reconciles it
        before it goes on."""
        with self.begin() as conn:
            row = conn.execute(self.dialect.lock(_RUN), {"b_id": run_id}).first()
            if row is None:
                return Migration(run=None, refused="not_found")
            run = with_calls(conn, [Run.from_row(row._mapping)])[0]
            refused = _refusal(run, to_version, conn, stale_after_s)
            if refused is not None:
                return Migration(run=run, refused=refused)
            moved = conn.execute(
                runs.update()
                .where(runs.c.id == run_id)
                .values(agent_version=to_version, updated_at=db_now())
                .returning(runs)
            ).one()
            data = {
                "by": by,
                "why": why,
                "from_version": run.agent_version,
                "to_version": to_version,
            }
            add_event(conn, run_id, "migrated", data)
            change = f"{run.agent_version} -> {to_version}"
            record = audit.of_run(run, by=by, reason=why, outcome=change[:32])
            audit.append(conn, AuditKind.MIGRATED, [record])
            if run.state is RunState.QUEUED or (
                run.state is RunState.RUNNING and run.owner is None
            ):
                self.dialect.wake(conn)
            return Migration(run=Run.from_row(moved._mapping))


def _refusal(run: Run, to_version: str, conn: sa.Connection, stale_after_s: float) -> str | None:
    if run.state.terminal:
        return "already_finished"
    if run.agent_version == to_version:
        return "same_version"
    served = conn.execute(_LIVE_TOOLS, {"b_version": to_version, "b_stale": stale_after_s})
    tools = [row.tools for row in served]
    if not tools:
        return "not_served"
    if run.state is RunState.SUSPENDED and run.pending is not None:
        known = [names for names in tools if names is not None]
        if not known:
            return "tools_unknown"
        waiting = {c.pending.tool for c in run.pending_calls} or {run.pending.tool}
        if any(tool not in names for tool in waiting for names in known):
            return "tool_unavailable"
    if run.state is RunState.RUNNING and run.owner is not None:
        fresh = conn.execute(
            sa.select(runs.c.heartbeat_at > db_now() - _STALE_S).where(runs.c.id == run.id),
            {"b_stale": stale_after_s},
        ).scalar()
        if fresh:
            return "busy"
    return None
