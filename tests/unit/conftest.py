"""Unit tests: property tests judge what a function returns, never how fast a loaded
machine computes it (Hypothesis's per-example deadline is a timed assertion)."""

from __future__ import annotations

from hypothesis import settings

settings.register_profile("untimed", deadline=None)
settings.load_profile("untimed")
