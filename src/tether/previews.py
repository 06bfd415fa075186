"""Previews, the artefacts a human approves: their digest and their field-level diff."""

from __future__ import annotations

import hashlib
from typing import Any

from tether.messages import canonical_json


def digest(preview: Any) -> str:
    """SHA-256 of the canonical JSON of a preview."""
    return hashlib.sha256(canonical_json(preview).encode()).hexdigest()


def diff_previews(before: Any, after: Any, path: str = "") -> list[dict[str, Any]]:
    """Field-level differences between two previews: ``[{"path", "before", "after"}]``."""
    if isinstance(before, dict) and isinstance(after, dict):
        out: list[dict[str, Any]] = []
        for key in sorted(set(before) | set(after), key=str):
            sub = f"{path}.{key}" if path else str(key)
            out.extend(diff_previews(before.get(key), after.get(key), sub))
        return out
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        out = []
        for i, (b, a) in enumerate(zip(before, after, strict=True)):
            out.extend(diff_previews(b, a, f"{path}[{i}]"))
        return out
    if before == after:
        return []
    return [{"path": path or "$", "before": before, "after": after}]
