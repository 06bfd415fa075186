"""The log notifier (the default when no webhook is configured): a suspension is logged
with its run and tool, never with its token, unless the operator asks for the links
(``TETHER_LOG_APPROVAL_LINKS``)."""

from __future__ import annotations

import logging

import pytest

from tether.notify import LogNotifier, Notice

TOKEN = "tok-SECRET-0123456789"
NOTICE = Notice(
    run_id="r1",
    user_id="dana",
    token=TOKEN,
    approve_url=f"https://tether.example.com/approve/{TOKEN}",
    tool="send",
    arguments={"item": "b"},
    preview={"item": "b"},
    expires_at="2026-11-29T00:00:00+00:00",
)


def _logged(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "action", "") == "suspension_notice"]


async def test_a_logged_notice_names_the_run_and_tool_and_not_the_token(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="tether.notify")
    await LogNotifier().send(NOTICE)
    [record] = _logged(caplog)
    assert record.__dict__["run_id"] == "r1" and record.__dict__["tool"] == "send"
    assert "tether approvals list" in record.getMessage()
    assert TOKEN not in str(record.__dict__)


async def test_the_operator_may_ask_for_the_links_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="tether.notify")
    await LogNotifier(links=True).send(NOTICE)
    [record] = _logged(caplog)
    assert record.__dict__["approve_url"] == NOTICE.approve_url
