"""Blocking wrappers over ``Engine`` for scripts without an event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from tether.results import ApprovalResult, Outcome
from tether.runs import Run

if TYPE_CHECKING:
    from tether.engine import Engine
    from tether.results import ReapReport, RunView

T = TypeVar("T")


class SyncEngine:
    """The engine's main calls, each run in its own event loop."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    @staticmethod
    def _run(coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run(coro)

    def start_run(self, user_id: str, question: str, **kwargs: Any) -> Run:
        return self._run(self._engine.start_run(user_id, question, **kwargs))

    def run_until_stop(self, run_id: str) -> Outcome:
        return self._run(self._engine.run_until_stop(run_id))

    def ask(self, user_id: str, question: str, **kwargs: Any) -> Outcome:
        return self._run(self._engine.ask(user_id, question, **kwargs))

    def resume_after_confirmation(
        self, token: str, decision: str, approver: str, **kwargs: Any
    ) -> ApprovalResult:
        return self._run(
            self._engine.resume_after_confirmation(token, decision, approver, **kwargs)
        )

    def continue_run(self, run_id: str, user: str, **kwargs: Any) -> Run:
        return self._run(self._engine.continue_run(run_id, user, **kwargs))

    def cancel_run(self, run_id: str, user: str) -> Run:
        return self._run(self._engine.cancel_run(run_id, user))

    def fork_run(self, run_id: str, user: str, *, at_step: int, dry_run: bool = False) -> Run:
        return self._run(self._engine.fork_run(run_id, user, at_step=at_step, dry_run=dry_run))

    def reap(self) -> ReapReport:
        return self._run(self._engine.reap())

    def get_run(self, run_id: str, *, user_id: str | None = None) -> RunView:
        return self._run(self._engine.get_run(run_id, user_id=user_id))

    def list_runs(self, user_id: str | None = None, limit: int = 100) -> list[Run]:
        return self._run(self._engine.list_runs(user_id, limit))
