"""The HTTP service: JSON API, approvals inbox, health and metrics."""

from __future__ import annotations

from tether.api.app import create_app

__all__ = ["create_app"]
