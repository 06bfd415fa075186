"""The JSON API under /v1 (SPEC §6). Being written."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter()
