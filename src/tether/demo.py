"""The demo story (being written)."""

from __future__ import annotations


def main() -> int:
    """Run the demo; 0 when every scene matched its expectation."""
    raise NotImplementedError
