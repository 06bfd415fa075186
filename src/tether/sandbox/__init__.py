"""``tether.sandbox``, the name reference §8 gives the demo's CRM: an alias of
``tether.demo.sandbox``, where it lives with the rest of the demo."""

from __future__ import annotations

from tether.demo.sandbox import RunningSandbox, create_app, serve, start_in_thread

__all__ = ["RunningSandbox", "create_app", "serve", "start_in_thread"]
