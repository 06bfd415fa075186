"""The keys stored content is sealed with (reference §20): the check every process makes
when it opens a database, and ``tether keys rotate``.

``sealing_keys`` lists the id of every key that sealed a value still stored. A process
registers its sealing key before it writes anything under it (when it opens the
database), so a process that lacks one of the listed keys, or has none at all, refuses to
start instead of failing later on a value it cannot read. A rotation re-seals every value
under the first key, a batch per transaction, each row rewritten only if it still holds
what was read (so a worker writing meanwhile wins, and its value is taken by a later
pass); once no value is sealed with another key, their ids leave the list.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from tether.errors import ConfigError
from tether.failpoints import fail
from tether.sealing import SEALED, Keyring, open_json, open_text, seal_json, seal_text
from tether.store.backend.clock import db_now
from tether.store.backend.dialect import Dialect
from tether.store.sql.meta import metadata
from tether.store.sql.schema import sealing_keys
from tether.store.sql.sealed import SealedJSON, SealedText, Stored

_IDS = sa.select(sealing_keys.c.id).order_by(sealing_keys.c.id)
# A rotation passes over the columns again while a pass still rewrote something (a worker
# wrote meanwhile); past this many passes, what is left is reported, never ignored.
_PASSES = 3


def check_keys(engine: Engine, dialect: Dialect, keyring: Keyring | None) -> None:
    """Refuse (``invalid_config``, naming the ids) a process without every key stored
    content is sealed with; register this process's sealing key. Safe twice: the
    registration is an insert that skips an id already listed."""
    with engine.connect() as conn:
        listed = list(conn.execute(_IDS).scalars())
    missing = [key_id for key_id in listed if keyring is None or key_id not in keyring.ids]
    if missing:
        named = ", ".join(repr(key_id) for key_id in missing)
        raise ConfigError(
            f"stored content is sealed with key {named}, which TETHER_ENCRYPTION_KEYS does "
            "not list: give this process every key the database was sealed with (the "
            "first one seals; `tether keys rotate` moves every value to it)"
        )
    if keyring is not None and keyring.current not in listed:
        with engine.begin() as conn:
            insert = dialect.insert_new(sealing_keys)
            conn.execute(insert.values(id=keyring.current, since=db_now()))


@dataclass(frozen=True)
class SealedColumn:
    """A column of stored content: its table, name and whether it holds JSON."""

    table: sa.Table
    name: str
    json: bool

    @property
    def column(self) -> sa.Column[Any]:
        return self.table.c[self.name]

    @property
    def label(self) -> str:
        return f"{self.table.name}.{self.name}"

    def opened(self, keyring: Keyring, text: str) -> Any:
        """The value of a stored text of this column."""
        return open_json(keyring, json.loads(text)) if self.json else open_text(keyring, text)

    def resealed(self, keyring: Keyring, text: str) -> str | None:
        """The stored form of the same value under the current key; None for a JSON null."""
        value = self.opened(keyring, text)
        if value is None:
            return None
        return seal_json(keyring, value) if self.json else seal_text(keyring, value)


def sealed_columns() -> list[SealedColumn]:
    """Every column of stored content, in the tables' dependency order."""
    return [
        SealedColumn(table, column.name, isinstance(column.type, SealedJSON))
        for table in metadata.sorted_tables
        for column in table.columns
        if isinstance(column.type, (SealedJSON, SealedText))
    ]


@dataclass
class Rotation:
    """What ``rotate`` did: values re-sealed per column, the key they are under now, and the
    key ids no value is sealed with any more (removed from the list)."""

    key: str
    rotated: dict[str, int] = field(default_factory=dict)
    retired: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.rotated.values())

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "rotated": self.total, "retired": self.retired}


def rotate(
    engine: Engine,
    keyring: Keyring,
    *,
    batch: int = 500,
    rest: float = 0.0,
    progress: Callable[[str, int], None] | None = None,
) -> Rotation:
    """Re-seal every stored value (clear ones included) under ``keyring.current``. Safe to
    run twice, or again after a crash: a value already under the current key is never
    selected, and each UPDATE applies only if the row still holds what was read. A value
    under a key the ring lacks raises ``MissingKey`` naming it. After each batch it rests
    ``rest`` times as long as the batch took."""
    done = Rotation(key=keyring.current)
    for _ in range(_PASSES):
        moved = 0
        for target in sealed_columns():
            started = time.monotonic()
            for count in _rotate_column(engine, keyring, target, batch):
                done.rotated[target.label] = done.rotated.get(target.label, 0) + count
                moved += count
                if count:
                    fail("after_rotation_batch")
                    # Let other processes' writers in before the next batch (SQLite's
                    # share of the batch's time: ``Dialect.rest_after_batch``).
                    time.sleep((time.monotonic() - started) * rest)
                started = time.monotonic()
                if progress is not None:
                    progress(target.label, count)
        if moved == 0:
            break
    with engine.begin() as conn:
        left = {c.label for c in sealed_columns() if _others_left(conn, keyring, c)}
        if left:
            raise ConfigError(
                "values sealed with other keys were still being written while the rotation "
                f"ran ({', '.join(sorted(left))}): run `tether keys rotate` again once every "
                "process seals with the first key"
            )
        retired = sealing_keys.delete().where(sealing_keys.c.id != keyring.current)
        done.retired = list(conn.execute(retired.returning(sealing_keys.c.id)).scalars())
        conn.execute(
            sealing_keys.insert().from_select(
                ["id", "since"],
                sa.select(sa.literal(keyring.current), db_now()).where(
                    ~sa.exists().where(sealing_keys.c.id == keyring.current)
                ),
            )
        )
    done.retired.sort()
    return done


def _stored(target: SealedColumn) -> sa.ColumnElement[str]:
    return sa.cast(target.column, sa.Text)


def _current_prefix(keyring: Keyring, target: SealedColumn) -> str:
    return ('"' if target.json else "") + f"{SEALED}{keyring.current}:%"


def _others_left(conn: Connection, keyring: Keyring, target: SealedColumn) -> bool:
    """Whether a value of the column is sealed with a key other than the current one."""
    sealed_any = ('"' if target.json else "") + f"{SEALED}%"
    found = sa.select(sa.literal(1)).where(
        _stored(target).like(sealed_any), ~_stored(target).like(_current_prefix(keyring, target))
    )
    return conn.execute(found.limit(1)).first() is not None


def _rotate_column(
    engine: Engine, keyring: Keyring, target: SealedColumn, batch: int
) -> Iterator[int]:
    """Re-seal the column's values not under the current key, a batch per transaction;
    yields how many each batch rewrote."""
    keys = list(target.table.primary_key.columns)
    stored = _stored(target)
    pick = (
        sa.select(*keys, stored.label("stored"))
        .where(target.column.is_not(None), ~stored.like(_current_prefix(keyring, target)))
        .order_by(*keys)
        .limit(batch)
    )
    after: tuple[Any, ...] | None = None
    same_row = [k == sa.bindparam(f"k_{k.name}") for k in keys]
    update = (
        target.table.update()
        .where(*same_row, stored == sa.bindparam("b_old", type_=sa.Text))
        .values({target.name: sa.bindparam("b_new", type_=target.column.type)})
    )
    while True:
        query = pick if after is None else pick.where(sa.tuple_(*keys) > sa.tuple_(*after))
        with engine.begin() as conn:
            rows = conn.execute(query).all()
            changes = []
            for row in rows:
                new = target.resealed(keyring, row.stored)
                if new is None:
                    continue
                params = {f"k_{k.name}": row._mapping[k.name] for k in keys}
                changes.append({**params, "b_old": row.stored, "b_new": Stored(new)})
            count = conn.execute(update, changes).rowcount if changes else 0
        yield count
        if len(rows) < batch:
            return
        after = tuple(rows[-1]._mapping[k.name] for k in keys)
