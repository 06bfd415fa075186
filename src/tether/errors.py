"""One exception root for tether; every subclass carries a stable error ``code``.

Codes are part of the product contract (reference §4, §6): tests and clients match on them,
so a code never changes once published. The driver's error, where there is one, stays in
``__cause__``. Domain errors know nothing of HTTP: ``tether.api.statuses.STATUS`` maps
codes to statuses.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Protocol


class CallAnswer(Protocol):
    """One call's answer as a request carried it out (``tether.results.CallDecision``)."""

    @property
    def tool_call_id(self) -> str: ...

    def to_json(self) -> dict[str, Any]: ...


class TetherError(Exception):
    """Root of every error tether raises on purpose.

    ``carried``: the other calls of a suspended turn that the request refused with this
    error carried out before (or instead of) its own, each answered as it was carried out
    (reference §15); empty for every other error."""

    code: ClassVar[str] = "tether_error"

    def __init__(self, message: str, *, carried: Sequence[CallAnswer] = (), **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details
        self.carried = tuple(carried)

    def to_dict(self) -> dict[str, Any]:
        """The error as the JSON body of reference §6:
        ``{"ok": false, "error", "message", ..., "carried"?}``."""
        body = {"ok": False, "error": self.code, "message": self.message, **self.details}
        if self.carried:
            body["carried"] = [call.to_json() for call in self.carried]
        return body


class InvalidInput(TetherError):
    """A caller passed something malformed; nothing was changed."""

    code = "invalid_input"


class Unauthenticated(TetherError):
    """No valid credentials were presented."""

    code = "unauthenticated"


class TooManyAttempts(TetherError):
    """Too many failed authentications from this address or with this credential;
    ``retry_after_s`` says when to try again."""

    code = "too_many_attempts"


class TooManyStreams(TetherError):
    """The caller already holds as many open event streams in this process as one user may
    (``TETHER_MAX_STREAMS_PER_USER``); ``limit`` says how many. Nothing was opened."""

    code = "too_many_streams"


class ConfigError(TetherError):
    """The environment or a setting is malformed."""

    code = "invalid_config"


class SchemaNotReady(TetherError):
    """The database schema is missing or older/newer than this code; run ``tether migrate``."""

    code = "schema_not_ready"


class NotReady(TetherError):
    """The database cannot be reached, so this process cannot serve (``/readyz``)."""

    code = "not_ready"


class DatabaseUnavailable(TetherError):
    """The database could not be reached (a dropped connection, a restart, a locked or
    full SQLite file) for longer than the store retries, or a COMMIT was cut off so its
    outcome is not known. Retryable: nothing was lost, and a run that met it is recovered
    once the database is back."""

    code = "database_unavailable"


class DatabaseMisconfigured(DatabaseUnavailable):
    """The database server refused the connection for a reason trying again cannot cure
    (the database or role does not exist, the password is wrong, the host is unknown):
    raised at once, with the server's words and what to change in TETHER_DATABASE_URL.
    A run that meets it is handed back like one that met ``database_unavailable``."""

    code = "database_misconfigured"


class ScopeUnavailable(TetherError):
    """A run owner's scope could not be resolved (the agent's resolver failed), so whether
    a viewer may see or decide their requests is unknown: refused rather than answered as
    if there were none. Retryable; the owner and the resolver's error are in the log."""

    code = "scope_unavailable"


class NotFound(TetherError):
    """The run is missing or not the caller's (the two are never told apart)."""

    code = "not_found"


class NotHalted(TetherError):
    """Only a halted run can be continued."""

    code = "not_halted"


class HaltedByAncestor(TetherError):
    """The run was halted by an ancestor's limits (reference §18): continuing that ancestor
    (named by ``run_id``) is the grant that resumes it."""

    code = "halted_by_ancestor"


class AlreadyFinished(TetherError):
    """The run is terminal and cannot be cancelled."""

    code = "already_finished"


class IllegalTransition(TetherError):
    """A state change that the transition table does not allow, or whose precondition no
    longer held when the conditional UPDATE ran."""

    code = "illegal_transition"


class LeaseLost(TetherError):
    """This worker no longer owns the run: another owner took it (reference invariant 8)."""

    code = "lease_lost"


class ModelError(TetherError):
    """The model provider failed in a way the SDK's own retries did not absorb.
    ``transient`` (a timeout, a connection error, HTTP 408, 409, 429, 5xx): asking again
    later may succeed, so the run is handed back with a delay; otherwise (any other 4xx, a
    reply that cannot be read) asking again cannot help and the run fails (reference §10)."""

    code = "model_error"

    def __init__(
        self, message: str, *, status: int | None = None, transient: bool = False, **details: Any
    ) -> None:
        if status is not None:
            details["status"] = status
        super().__init__(message, **details)
        self.status = status
        self.transient = transient


class FailpointError(TetherError):
    """Raised by a failpoint whose action is ``error`` (reference §7)."""

    code = "failpoint"


# Errors of the resumption paths (reference §4).


class UnknownOrExpired(TetherError):
    """The token is unknown, expired, or presented by someone who may not use it."""

    code = "unknown_or_expired"


class AlreadyResumed(TetherError):
    """The token was already used; ``decision`` carries the decision that used it."""

    code = "already_resumed"


class AlreadyDecided(TetherError):
    """The approver already approved this artefact (its digest) of a call that waits on a
    quorum (``@tool(quorum=N)``); each person counts once. Nothing changed."""

    code = "already_decided"


class NoLongerPermitted(TetherError):
    """The owner's current permissions no longer allow the pending call."""

    code = "no_longer_permitted"


class FourEyes(TetherError):
    """The pending call's tool wants someone other than the run's owner to decide it
    (``@tool(approvers="others")``), and the owner tried; nothing changed."""

    code = "four_eyes"


class Changed(TetherError):
    """The re-rendered preview differs from the approved one; a new token is issued."""

    code = "changed"


class GuardFailed(TetherError):
    """The tool's guard refused the call on resumption."""

    code = "guard_failed"


class WrongVersion(TetherError):
    """The run is written for an agent version this process does not serve (reference §12);
    nothing was claimed. ``agent_version`` names the run's version: a process that serves
    it (or ``tether runs migrate``) can act on it."""

    code = "wrong_version"


class PendingToolUnavailable(TetherError):
    """The run's pending tool does not exist in the agent version that would execute it
    (reference §12): a decision halts the run ``tool_unavailable``; a migration is refused."""

    code = "tool_unavailable"


# Conversations (reference §14).


class ThreadBusy(TetherError):
    """A run of the thread is running, suspended or queued; ``run_id`` names the one the
    request would wait on. Nothing was created or deleted."""

    code = "thread_busy"


class IdempotencyMismatch(TetherError):
    """The ``Idempotency-Key`` was used by this user for a request with another body;
    nothing was created."""

    code = "idempotency_mismatch"
