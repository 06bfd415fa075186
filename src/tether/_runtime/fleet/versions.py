"""Agent versions across deploys (reference §12): which runs this process may carry, the runs
no live worker serves (stranded), and moving a run to another version deliberately.

A process serves its agent's version and those ``TETHER_ACCEPT_VERSIONS`` adds
(``Services.versions``). Every claim (a ready run, an orphan, a decision) and every expiry
or notice re-issue takes only runs of those versions, so a run is never carried by code
it was not written for. A decision on a run of another version is refused with
``wrong_version`` before anything is claimed: the token still works for a process that
serves it, or after ``tether runs migrate``.
"""

from __future__ import annotations

from tether import inputs
from tether._runtime.hop import hop
from tether._runtime.shared.services import Services
from tether.agent import MAX_VERSION_CHARS
from tether.errors import (
    AlreadyFinished,
    InvalidInput,
    NotFound,
    PendingToolUnavailable,
    TetherError,
    WrongVersion,
)
from tether.runs import Run

MAX_WHY_CHARS = 2000


def check_served(services: Services, run: Run) -> None:
    """``wrong_version`` unless this process serves the run's agent version."""
    if run.agent_version not in services.versions:
        raise WrongVersion(
            f"this run is written for agent version {run.agent_version!r}; this process "
            f"serves {', '.join(services.versions)}. A process that serves it can act on it, "
            "or move it with `tether runs migrate`",
            agent_version=run.agent_version,
        )


async def stranded(services: Services, limit: int = 100) -> list[Run]:
    """Runs waiting on an agent version no live worker serves, longest waiting first."""
    if not 1 <= limit <= 1000:
        raise InvalidInput("limit must be between 1 and 1000")
    return await hop(
        services.store.stranded_runs,
        stale_after_s=services.settings.heartbeat_timeout_s,
        limit=limit,
    )


async def count_stranded(services: Services) -> int:
    """How many runs are stranded (the ``tether_runs_stranded`` gauge)."""
    return await hop(
        services.store.count_stranded, stale_after_s=services.settings.heartbeat_timeout_s
    )


async def live_workers(services: Services) -> list[str]:
    """The ids of the worker processes with a fresh heartbeat, fleet-wide (the
    ``tether_worker_processes`` gauge)."""
    return await hop(
        services.store.live_workers, stale_after_s=services.settings.heartbeat_timeout_s
    )


async def move_run(
    services: Services, run_id: str, to_version: str, *, by: str, why: str | None = None
) -> Run:
    """Move a run to ``to_version``, recording who, why and both versions as a ``migrated``
    event. The version's code need not be loaded here: its live workers registered the
    tools they have (``Registration``). Refused (nothing changes): ``not_found``;
    ``already_finished``; ``invalid_input`` when no live worker serves the version, it is
    already the run's, or a live worker is carrying the run now (it hands it back at its
    next step boundary on SIGTERM); ``tool_unavailable`` when the run is suspended on a
    tool a live worker of ``to_version`` does not have."""
    inputs.user_id(by, "by")
    if not isinstance(to_version, str) or not 0 < len(to_version) <= MAX_VERSION_CHARS:
        raise InvalidInput(f"the version must be 1 to {MAX_VERSION_CHARS} characters")
    if why is not None:
        why = inputs.text(why, "reason", MAX_WHY_CHARS)
    moved = await hop(
        services.store.move_run,
        run_id=inputs.run_id(run_id),
        to_version=to_version,
        by=by,
        why=why,
        stale_after_s=services.settings.heartbeat_timeout_s,
    )
    if moved.refused is None and moved.run is not None:
        return moved.run
    raise _refusal(moved.refused, moved.run, to_version)


def _refusal(code: str | None, run: Run | None, to_version: str) -> TetherError:
    if code == "not_found" or run is None:
        return NotFound("no such run")
    if code == "already_finished":
        return AlreadyFinished(f"the run is {run.state.value}; only a waiting run moves")
    if code == "same_version":
        return InvalidInput(f"the run is already on agent version {to_version!r}")
    if code == "not_served":
        return InvalidInput(
            f"no live worker serves agent version {to_version!r}: start a worker of that "
            "version (it registers the tools it has), then migrate"
        )
    if code == "tools_unknown":
        return InvalidInput(
            f"the live workers of agent version {to_version!r} registered no tools (they "
            "predate this check): restart them, then migrate"
        )
    if code == "tool_unavailable":
        tool = run.pending.tool if run.pending is not None else "?"
        return PendingToolUnavailable(
            f"the run waits on tool {tool!r}, which agent version {to_version!r} does not have",
            tool=tool,
            agent_version=run.agent_version,
        )
    return InvalidInput(
        "a live worker is carrying this run now; migrate it once it waits (a worker "
        "stopped with SIGTERM hands it back at its next step boundary)"
    )


class Registration:
    """This process in the worker registry while its worker runs: ``join`` on start,
    ``beat`` at a third of the heartbeat timeout, ``leave`` on a clean stop."""

    def __init__(self, services: Services, worker_id: str) -> None:
        self.services = services
        self.worker_id = worker_id

    @property
    def interval_s(self) -> float:
        return self.services.settings.heartbeat_timeout_s / 3

    async def join(self) -> None:
        """Register the versions served and the tool names this process has for them (of
        every agent of its tree, reference §18)."""
        tools = list(
            dict.fromkeys(
                t.name for agent in self.services.agent.tree.values() for t in agent.tools
            )
        )
        await hop(
            self.services.store.register_worker, self.worker_id, self.services.versions, tools
        )

    async def beat(self) -> None:
        """Refresh the heartbeat; register again if the rows were forgotten."""
        if not await hop(self.services.store.beat_worker, self.worker_id):
            await self.join()

    async def leave(self) -> None:
        await hop(self.services.store.leave, self.worker_id)
