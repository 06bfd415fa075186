"""Stored content sealed at rest (reference §20): keys for ``TETHER_ENCRYPTION_KEYS``, a
run that stores content of every kind (its question, tool arguments and results, a
preview, an approver's edit and reason, a decline's reason, the answer, a schedule's
question), and a scan of every column of every table, read as the database holds it."""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass
from typing import Any

import agents
import inprocess
import sqlalchemy as sa

from tether import Engine, MemoryNotifier, StopKind
from tether.sealing import Keyring, key_of, parse_keys
from tether.store.sealing import sealed_columns
from tether.store.sql.meta import metadata


def entry(key_id: str) -> str:
    """One entry of ``TETHER_ENCRYPTION_KEYS``: a fresh 32-byte key under ``key_id``."""
    return f"{key_id}:{base64.b64encode(os.urandom(32)).decode()}"


def ring(*entries: str) -> Keyring:
    keyring = parse_keys(",".join(entries))
    assert keyring is not None
    return keyring


def markers(tag: str) -> list[str]:
    """The marker strings ``story(tag)`` stores, one per kind of content."""
    kinds = ("question", "arg", "item", "send", "edit", "why", "again", "no", "answer", "cron")
    return [f"{tag}-{kind}" for kind in kinds]


def turns(tag: str) -> list[dict[str, Any]]:
    return [
        {
            "tool_calls": [
                agents.call("lookup", query=f"{tag}-arg"),
                agents.call("record", item=f"{tag}-item"),
            ]
        },
        {"tool_calls": [agents.call("send", item=f"{tag}-send")]},
        {"tool_calls": [agents.call("send", item=f"{tag}-again")]},
        {"content": f"{tag}-answer"},
    ]


@dataclass(frozen=True)
class Story:
    run_id: str
    digest: str
    run: dict[str, Any]


def engine(
    url: str, keyring: Keyring | None, tag: str = "m", **settings: Any
) -> tuple[Engine, MemoryNotifier]:
    notifier = MemoryNotifier()
    made = inprocess.engine(url, turns=turns(tag), notifier=notifier, keyring=keyring, **settings)
    return made, notifier


async def story(engine: Engine, notifier: MemoryNotifier, tag: str) -> Story:
    """A run that stores every kind of content, to its answer: an edited approval with a
    reason, then a declined call with one; and a schedule of the same user."""
    outcome = await engine.ask("dana", f"{tag}-question")
    assert outcome.kind is StopKind.SUSPENDED
    token = notifier.last(outcome.run_id).token
    view = await engine.get_run(outcome.run_id)
    assert view.run.pending is not None and view.run.pending.digest is not None
    digest = view.run.pending.digest
    shown = await engine.preview_approval(token, "dana", {"item": f"{tag}-edit"})
    done = await engine.resume_after_confirmation(
        token,
        "approve",
        "dana",
        arguments={"item": f"{tag}-edit"},
        digest=shown.digest,
        reason=f"{tag}-why",
    )
    assert done.outcome.value == "executed"
    await engine.run_until_stop(outcome.run_id)
    again = notifier.last(outcome.run_id).token
    declined = await engine.resume_after_confirmation(again, "decline", "dana", reason=f"{tag}-no")
    assert declined.outcome.value == "declined"
    await engine.run_until_stop(outcome.run_id)
    await engine.add_schedule("dana", "0 9 * * *", f"{tag}-cron")
    final = await engine.get_run(outcome.run_id)
    assert final.run.state.value == "answered"
    return Story(run_id=outcome.run_id, digest=digest, run=await shown_run(engine, outcome.run_id))


async def shown_run(engine: Engine, run_id: str) -> dict[str, Any]:
    """What a reader is given of a run: its JSON, events, ledger (times left out)."""
    view = await engine.get_run(run_id)
    events = [(e.kind, e.data) for e in await engine.events(run_id)]
    ledger = [
        (e.tool, e.arguments, e.result, e.edited_arguments) for e in await engine.ledger(run_id)
    ]
    return {
        "messages": view.messages,
        "question": view.run.question,
        "events": events,
        "ledger": ledger,
    }


def found(engine: Engine, strings: list[str]) -> list[tuple[str, str]]:
    """Every (table, marker) where a row of the database, read raw, holds a marker."""
    hits: list[tuple[str, str]] = []
    with engine.runner.store.engine.connect() as conn:
        for table in metadata.sorted_tables:
            for row in conn.execute(sa.text(f'SELECT * FROM "{table.name}"')):
                text = " ".join(str(value) for value in row)
                hits.extend((table.name, s) for s in strings if s in text)
    return sorted(set(hits))


def keys_in_use(engine: Engine) -> dict[str, int]:
    """How many stored values each key id seals (``None``: values in the clear), raw."""
    counts: dict[str, int] = {}
    with engine.runner.store.engine.connect() as conn:
        for target in sealed_columns():
            stored = sa.cast(target.column, sa.Text)
            for (text,) in conn.execute(sa.select(stored).where(target.column.is_not(None))):
                value = json.loads(text) if target.json else text
                if value is None:
                    continue
                key = key_of(value) or "clear"
                counts[key] = counts.get(key, 0) + 1
    return counts
