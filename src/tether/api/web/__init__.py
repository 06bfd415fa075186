"""The approvals inbox: server-rendered pages to sign in, list pending requests, review, edit
and decide an approval link, list one's runs, and read, continue, cancel or fork a run. Every
action is a plain form; one small script of our own (``live``) makes a run's page and the
lists follow runs as they go, and the pages are whole without it.

A session is a signed cookie; every POST that acts carries a CSRF token bound to the
session; a GET never changes anything; every stored string goes through Jinja's
autoescaping (reference §6).
"""

from __future__ import annotations

from fastapi import APIRouter

from tether.api.web import apidocs, approvals, edits, inbox, live, runs, sign_in, turns
from tether.api.web.pages import templates

router = APIRouter(include_in_schema=False)
router.include_router(sign_in.router)
router.include_router(inbox.router)
router.include_router(runs.router)
router.include_router(approvals.router)
router.include_router(edits.router)
router.include_router(turns.router)
router.include_router(live.router)
router.include_router(apidocs.router)

__all__ = ["router", "templates"]
