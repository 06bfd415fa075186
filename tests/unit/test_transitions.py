"""The store's transitions (``tether.store.sql.transitions``) are the table's (``tether.runs``):
a transition builds exactly when the table allows it, and the store declares every legal
transition and no other. That each is enforced on the rows is
tests/integration/test_store.py."""

from __future__ import annotations

import pytest

from tether.errors import IllegalTransition
from tether.runs import TRANSITIONS, RunState
from tether.store import claims, upkeep
from tether.store.sql import claims as claim_sql
from tether.store.sql import steps as step_sql
from tether.store.sql import trees as tree_sql
from tether.store.sql.transitions import Transition

ALL_PAIRS = [(src, dst) for src in RunState for dst in RunState]
LEGAL = {(src, dst) for src in TRANSITIONS for dst in TRANSITIONS[src]}


@pytest.mark.parametrize(("src", "dst"), ALL_PAIRS)
def test_a_transition_builds_exactly_when_the_table_allows_it(src: RunState, dst: RunState) -> None:
    if (src, dst) in LEGAL:
        assert Transition(src, dst).pairs() == {(src, dst)}
    else:
        with pytest.raises(IllegalTransition):
            Transition(src, dst)


def test_the_store_declares_every_transition_of_the_table_and_no_other() -> None:
    declared = {
        pair
        for module in (step_sql, claim_sql, tree_sql, claims, upkeep)
        for value in vars(module).values()
        if isinstance(value, Transition)
        for pair in value.pairs()
    }
    assert declared == LEGAL
