"""The one compare-and-set helper every state change of a run goes through.

A ``Transition`` is built once (at import) from the state(s) it expects and the state it
sets. Building it checks each pair against ``tether.runs.TRANSITIONS`` and raises
``IllegalTransition`` for a pair the table does not allow, so an illegal change fails
before it reaches the database. Applying it is one conditional UPDATE,
``WHERE state IN (expected) AND …``, whose RETURNING rows tell whether it applied: a
precondition that no longer holds (another worker, an approval, the expiry sweep) changes
nothing. Never read a row and write it back.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Row
from sqlalchemy.sql.elements import ColumnElement

from tether.errors import IllegalTransition
from tether.runs import RunState, can_transition
from tether.store.sql.schema import runs


def state_in(states: Iterable[RunState]) -> ColumnElement[bool]:
    """``state = 'x'`` or ``state IN ('x', 'y')`` with the values inlined (in enum order),
    so both planners can match the partial indexes' predicates at any plan."""
    values = [s.value for s in RunState if s in set(states)]
    literals: list[ColumnElement[str]] = [sa.literal_column(f"'{v}'") for v in values]
    if len(literals) == 1:
        return runs.c.state == literals[0]
    return runs.c.state.in_(literals)


class Transition:
    """``expected`` → ``to`` as one conditional UPDATE of ``runs`` (plus ``where``),
    setting ``values`` and returning ``returning`` from the rows it changed.

    With ``when``, the row changes state (and takes ``values``) only if ``when`` holds of
    it as it was before the UPDATE; otherwise it keeps its state and its other columns.
    ``always`` is set either way. Both outcomes are one statement, so concurrent UPDATEs
    of the row, serialised by its lock, each see the row the one before left (a decision
    recorded while others of its suspension are undecided, and the last one claiming)."""

    def __init__(
        self,
        expected: RunState | Iterable[RunState],
        to: RunState,
        *where: ColumnElement[bool],
        returning: Sequence[Any] = (runs,),
        when: ColumnElement[bool] | None = None,
        always: dict[str, Any] | None = None,
        **values: Any,
    ) -> None:
        self.expected = (
            frozenset({expected}) if isinstance(expected, RunState) else frozenset(expected)
        )
        self.to = to
        check(self.expected, to)
        sets: dict[str, Any] = {"state": to.value, **values}
        if when is not None:
            sets = {
                name: sa.case((when, sa.null() if value is None else value), else_=runs.c[name])
                for name, value in sets.items()
            }
        sets.update(always or {})
        self.statement = (
            runs.update()
            .where(state_in(self.expected), *where)
            .values(**sets)
            .returning(*returning)
        )

    def one(self, conn: Connection, params: dict[str, Any] | None = None) -> Row[Any] | None:
        """Apply it to at most one row; the row it changed, or None if it did not apply."""
        return conn.execute(self.statement, params or {}).first()

    def many(self, conn: Connection, params: dict[str, Any] | None = None) -> Sequence[Row[Any]]:
        """Apply it to every row that matches; the rows it changed."""
        return conn.execute(self.statement, params or {}).all()

    def pairs(self) -> set[tuple[RunState, RunState]]:
        """The (expected, new) pairs this transition may apply."""
        return {(src, self.to) for src in self.expected}


def check(expected: Iterable[RunState], to: RunState) -> None:
    """Raise ``IllegalTransition`` unless the table allows every ``expected`` → ``to``."""
    sources = list(expected)
    if not sources:
        raise IllegalTransition(f"a transition to {to.value} must name the state it expects")
    for src in sources:
        if not can_transition(src, to):
            raise IllegalTransition(
                f"{src.value} → {to.value} is not in the transition table",
                source=src.value,
                target=to.value,
            )
