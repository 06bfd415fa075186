"""Reading a run's state to carry it on: the run with its suspension's calls and their
decisions, its messages, and the conversation of its thread before it.

A long run (or a long conversation) is picked up by this one read, so its cost is what
resuming costs: no per-message work but decoding each message, one ``json.loads`` of its
stored text (not the driver's JSON loader nor SQLAlchemy's result processor, which cost
more: benchmarks/README.md, threads.py). On PostgreSQL it is one statement, sent outside any
transaction (``StoreBase.reading``), so one round trip whatever the run's length: the
run's rows, each as its ``row_to_json``, then the messages, in one ordered ``UNION
ALL`` of (kind, place, seq, text). A single statement sees one snapshot, so the messages
belong to the run row read. On SQLite a statement is a function call, not a round trip:
the same reads are plain statements in one read transaction.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from tether.models.base import Message
from tether.sealing import Keyring, open_json, open_text
from tether.store.sql.schema import decisions, pending_calls, run_messages, runs
from tether.store.sql.sealed import SealedJSON, SealedText, keyring_of

_DECISION_COLUMNS = [c.label(f"d_{c.name}") for c in decisions.c]
# A call's columns beside a run's (``p_*``), for a read of the run with its calls.
CALL_COLUMNS = [c.label(f"p_{c.name}") for c in pending_calls.c]
_ID: Any = sa.bindparam("b_id")

# The run with the decisions its suspensions' calls carry (one row per call row of the
# run; the run's columns repeat).
RUN_AND_DECISIONS = (
    sa.select(runs, *_DECISION_COLUMNS, *CALL_COLUMNS)
    .select_from(
        runs.outerjoin(pending_calls, pending_calls.c.run_id == runs.c.id).outerjoin(
            decisions, decisions.c.token_hash == pending_calls.c.token_hash
        )
    )
    .where(runs.c.id == _ID)
)

# The run's own messages, as stored text, in order.
OWN = (
    sa.select(sa.cast(run_messages.c.message, sa.Text))
    .where(run_messages.c.run_id == _ID)
    .order_by(run_messages.c.seq)
)
# The conversation of the run's thread before it: the messages of its earlier runs, by
# place then seq, as stored text.
_OF_RUN = runs.alias("of_run")


def _of_run(column: sa.ColumnElement[Any]) -> sa.ScalarSelect[Any]:
    return sa.select(column).where(_OF_RUN.c.id == _ID).scalar_subquery()


EARLIER = (
    sa.select(runs.c.thread_pos, run_messages.c.seq, sa.cast(run_messages.c.message, sa.Text))
    .select_from(run_messages.join(runs, runs.c.id == run_messages.c.run_id))
    .where(
        runs.c.thread_id == _of_run(_OF_RUN.c.thread_id),
        runs.c.thread_pos < _of_run(_OF_RUN.c.thread_pos),
    )
    .order_by(runs.c.thread_pos, run_messages.c.seq)
)


# The fields of those rows that hold stored content (``sealed``), and whether as JSON: a
# row read as JSON (PostgreSQL's one statement) opens them itself.
_SEALED_FIELDS = {
    column.name: isinstance(column.type, SealedJSON)
    for column in RUN_AND_DECISIONS.selected_columns
    if isinstance(column.type, (SealedJSON, SealedText))
}


def _opened(keyring: Keyring | None, row: dict[str, Any]) -> dict[str, Any]:
    for name, is_json in _SEALED_FIELDS.items():
        value = row.get(name)
        row[name] = open_json(keyring, value) if is_json else open_text(keyring, value)
    return row


class JsonRow:
    """A row read as a JSON object, answering as a SQLAlchemy row does (``row.name``,
    ``row._mapping``), so the helpers that read rows of the run and its calls take it."""

    __slots__ = ("_mapping",)

    def __init__(self, mapping: Mapping[str, Any]) -> None:
        self._mapping = mapping

    def __getattr__(self, name: str) -> Any:
        try:
            return self._mapping[name]
        except KeyError:
            raise AttributeError(name) from None


@dataclass(frozen=True, kw_only=True)
class Loaded:
    """What one read of a run gives: its rows (with its calls and their decisions), its own
    messages and, when asked, the conversation of its thread before it."""

    rows: list[Any]
    messages: list[Message]
    earlier: list[Message]


# How a dialect reads the message texts of a statement of this module for a run.
Texts = Callable[[Connection, sa.Select[Any], str], list[str]]


def _texts(conn: Connection, statement: sa.Select[Any], run_id: str) -> list[str]:
    return [row[-1] for row in conn.execute(statement, {"b_id": run_id})]


def read_portable(
    conn: Connection,
    run_id: str,
    *,
    history: bool,
    texts: Texts | None = None,
) -> Loaded | None:
    """The run's state in up to three statements, in the caller's (read) transaction.
    ``texts`` reads the message texts of ``OWN`` or ``EARLIER`` (their last column), by
    default through SQLAlchemy."""
    read = texts or _texts
    keyring = keyring_of(conn.dialect)
    rows = conn.execute(RUN_AND_DECISIONS, {"b_id": run_id}).all()
    if not rows:
        return None
    own = [open_json(keyring, json.loads(text)) for text in read(conn, OWN, run_id)]
    earlier: list[Message] = []
    if history and rows[0].thread_pos > 1:
        earlier = [open_json(keyring, json.loads(t)) for t in read(conn, EARLIER, run_id)]
    return Loaded(rows=list(rows), messages=own, earlier=earlier)


def _constant(value: int) -> sa.ColumnElement[int]:
    """An integer written into the statement (not a parameter: the planner sees it)."""
    return sa.literal_column(str(int(value)), sa.Integer)


@functools.cache
def _in_one(history: bool) -> sa.CompoundSelect[Any]:
    """PostgreSQL's one statement: (kind, place, seq, text) rows, kind 0 the run's rows as
    JSON, 1 its messages, 2 the conversation before it (with ``history``)."""
    joined = RUN_AND_DECISIONS.subquery("j")
    rows = sa.select(
        _constant(0).label("kind"),
        _constant(0).label("place"),
        _constant(0).label("seq"),
        sa.cast(sa.func.row_to_json(sa.literal_column("j")), sa.Text).label("body"),
    ).select_from(joined)
    own = sa.select(
        _constant(1), _constant(0), run_messages.c.seq, sa.cast(run_messages.c.message, sa.Text)
    ).where(run_messages.c.run_id == _ID)
    parts: list[sa.Select[Any]] = [rows, own]
    if history:
        earlier = EARLIER.order_by(None).subquery("e")
        parts.append(sa.select(_constant(2), *earlier.c))
    return sa.union_all(*parts).order_by(sa.text("kind"), sa.text("place"), sa.text("seq"))


def read_in_one(conn: Connection, run_id: str, *, history: bool) -> Loaded | None:
    """The run's state in one statement (PostgreSQL, one round trip)."""
    keyring = keyring_of(conn.dialect)
    rows: list[Any] = []
    own: list[Message] = []
    earlier: list[Message] = []
    for kind, _place, _seq, text in conn.execute(_in_one(history), {"b_id": run_id}).tuples():
        if kind == 0:
            rows.append(JsonRow(_opened(keyring, json.loads(text))))
        elif kind == 1:
            own.append(open_json(keyring, json.loads(text)))
        else:
            earlier.append(open_json(keyring, json.loads(text)))
    if not rows:
        return None
    return Loaded(rows=rows, messages=own, earlier=earlier)
