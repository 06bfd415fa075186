"""The demo's stand-in business system: a small CRM served over HTTP with its own database."""

from __future__ import annotations

from tether.demo.sandbox.app import create_app
from tether.demo.sandbox.server import RunningSandbox, serve, start_in_thread

__all__ = ["RunningSandbox", "create_app", "serve", "start_in_thread"]
