"""The sandbox's one error type: an HTTP status plus a stable code, rendered as JSON.

Clients (the demo tools, the engine's reconcile path) match on ``error``, so a code never
changes once published.
"""

from __future__ import annotations

from typing import Any


class SandboxError(Exception):
    """A refused request: nothing was written, the client gets ``status`` and ``code``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    def to_dict(self) -> dict[str, Any]:
        """The response body: ``{"ok": false, "error": CODE, "message": TEXT}``."""
        return error_body(self.code, self.message)


def error_body(code: str, message: str) -> dict[str, Any]:
    """The JSON shape of every sandbox error response."""
    return {"ok": False, "error": code, "message": message}


def not_found(what: str) -> SandboxError:
    """404 for a missing thing, or one the acting user may not see (never told apart)."""
    return SandboxError(404, "not_found", f"{what} not found")


def forbidden(message: str) -> SandboxError:
    """403: the acting user exists but lacks the permission this write needs."""
    return SandboxError(403, "forbidden", message)
