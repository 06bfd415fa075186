"""The Engine: what an application calls (``Engine``), the HTTP/inbox side
(``Engine.web``: ``WebSide``), the operator's side (``Engine.operator``: ``Operator``) and
the blocking wrapper (``Engine.sync``: ``SyncEngine``)."""

from __future__ import annotations

from tether.engine.engine import Engine
from tether.engine.operator import Operator
from tether.engine.sync import SyncEngine
from tether.engine.web import WebSide

__all__ = ["Engine", "Operator", "SyncEngine", "WebSide"]
