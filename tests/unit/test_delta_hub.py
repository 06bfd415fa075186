"""The hub of the model's text as it is written (reference §16), in one process: what a
watcher gets, when it joins mid-step, when a step's model call starts again, when it reads
too slowly, and how a notice from another process is trimmed to what follows."""

from __future__ import annotations

import json

import pytest

from tether._runtime.live.deltas import DeltaHub, texts
from tether.results import Delta


def _spans(items: list[Delta]) -> list[tuple[int, int, str]]:
    return [(d.step, d.offset, d.text) for d in items]


async def test_a_watcher_gets_each_piece_after_the_one_before() -> None:
    hub = DeltaHub(None)
    woken: list[int] = []
    sub = hub.subscribe("r1", lambda: woken.append(1))
    async with hub.stream("r1", 1) as write:
        write("Hel")
        write("")  # an empty piece is no delta
        write("lo é")
    assert _spans(sub.take()) == [(1, 0, "Hel"), (1, 3, "lo é")]
    assert woken == [1]  # woken once until it read
    async with hub.stream("r1", 2) as write:
        write("next")
    assert _spans(sub.take()) == [(2, 0, "next")]
    sub.close()
    assert not hub._runs  # nothing kept for a run nobody watches and nobody carries


async def test_a_watcher_that_joins_mid_step_first_gets_the_text_so_far_at_offset_0() -> None:
    hub = DeltaHub(None)
    async with hub.stream("r1", 3) as write:
        write("one ")
        write("two ")
        late = hub.subscribe("r1", lambda: None)
        write("three")
        first, second = late.take()
    assert (first.offset, first.text, first.catch_up) == (0, "one two ", True)
    assert (second.offset, second.text, second.catch_up) == (8, "three", False)
    after = hub.subscribe("r1", lambda: None)  # the step ended: its model_turn holds it
    assert after.take() == []
    empty = DeltaHub(None)
    async with empty.stream("r2", 1):
        assert empty.subscribe("r2", lambda: None).take() == []  # no empty catch-up


async def test_a_repeated_model_call_of_a_step_starts_again_at_offset_0() -> None:
    hub = DeltaHub(None)
    sub = hub.subscribe("r1", lambda: None)
    async with hub.stream("r1", 1) as write:
        write("first try")
    async with hub.stream("r1", 1) as write:  # the step's call again (a retry)
        write("second")
        write(" try")
    assert _spans(sub.take()) == [(1, 0, "first try"), (1, 0, "second"), (1, 6, " try")]


async def test_a_watcher_that_does_not_read_is_dropped_to_a_catch_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(texts, "MAX_QUEUED_CHARS", 100)
    hub = DeltaHub(None)
    stalled = hub.subscribe("r1", lambda: None)
    reader = hub.subscribe("r1", lambda: None)
    pieces = [f"{i:04d}" for i in range(5000)]
    async with hub.stream("r1", 1) as write:
        for i, piece in enumerate(pieces):
            write(piece)
            if i % 10 == 0:
                assert len(stalled._queue) <= 25 and stalled._chars <= 100
                reader.take()
        caught = stalled.take()
    whole = "".join(pieces)
    assert _spans(caught) == [(1, 0, whole)]
    assert caught[0].catch_up and caught[0].dropped
    async with hub.stream("r1", 2) as write:
        write("on")
    assert _spans(stalled.take()) == [(2, 0, "on")]  # back to deltas once it read


async def test_a_watcher_dropped_as_the_step_ends_still_gets_its_whole_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The end of a step's text does not end a dropped watcher's catch-up: its
    ``model_turn`` comes next, and every delta of the step must come before it."""
    monkeypatch.setattr(texts, "MAX_QUEUED_CHARS", 10)
    hub = DeltaHub(None)
    stalled = hub.subscribe("r1", lambda: None)
    async with hub.stream("r1", 1) as write:
        write("a quote ")
        write("for you today.")  # past the bound: dropped
    caught = stalled.take()
    assert _spans(caught) == [(1, 0, "a quote for you today.")]
    assert caught[0].catch_up and caught[0].dropped
    assert stalled.take() == []  # once
    late = hub.subscribe("r1", lambda: None)  # never dropped: the model_turn holds it
    assert late.take() == []


def _notice(run: str, step: int, gen: str, offset: int, text: str) -> str:
    return json.dumps({"r": run, "s": step, "g": gen, "o": offset, "t": text})


def test_text_from_another_process_is_trimmed_to_what_follows_and_a_gap_asks_again() -> None:
    hub = DeltaHub(None)
    sub = hub.subscribe("r1", lambda: None)
    hub._received(_notice("r1", 1, "g1", 3, "lo"))  # the start was missed: nothing
    assert sub.take() == [] and hub._asks == {"r1"}
    hub._asks.clear()
    hub._received(_notice("r1", 1, "g1", 0, "Hello"))  # the text so far (an answer)
    hub._received(_notice("r1", 1, "g1", 3, "lo wor"))  # overlaps: only " wor" is new
    hub._received(_notice("r1", 1, "g1", 0, "Hel"))  # a repeat: nothing
    hub._received(_notice("r1", 1, "g1", 12, "x"))  # a gap: ask again
    hub._received(_notice("r1", 1, "g2", 0, "Again"))  # another call of the step
    hub._received(json.dumps({"r": "r1", "s": 1, "g": "g2", "e": 1}))  # it ended
    hub._received(_notice("r1", 1, "g2", 5, "!"))  # late: the stored turn holds it
    hub._received(_notice("r2", 1, "g1", 0, "not watched here"))
    hub._received("not json")
    assert _spans(sub.take()) == [(1, 0, "Hello"), (1, 5, " wor"), (1, 0, "Again")]
    assert hub._asks == {"r1"}
    assert "r2" not in hub._runs


async def test_a_step_watched_elsewhere_is_sent_once_asked_and_again_from_0_when_asked_again() -> (
    None
):
    hub = DeltaHub(None)
    async with hub.stream("r1", 1) as write:
        write("not asked for")
        assert hub._notices() == []  # nobody asked: nothing is sent
        hub._asked("r1")
        sent = hub._notices()
        write(" yet")
        more = hub._notices()
        hub._asked("r1")
        again = hub._notices()
    end = hub._notices()
    assert [json.loads(p)["t"] for _, p in sent] == ["not asked for"]
    assert [(json.loads(p)["o"], json.loads(p)["t"]) for _, p in more] == [(13, " yet")]
    assert [(json.loads(p)["o"], json.loads(p)["t"]) for _, p in again] == [
        (0, "not asked for yet")
    ]
    assert [json.loads(p).get("e") for _, p in end] == [1]
    assert not hub._runs


def test_a_long_text_is_split_into_notices_postgresql_accepts() -> None:
    text = texts.Text(step=1, gen="g")
    piece = 'é\n"' * 6000
    payloads = texts.payloads("r1", text, 0, piece, ends=True)
    assert len(payloads) > 1
    assert all(len(p.encode()) <= texts.PAYLOAD_BYTES for p in payloads)
    parts = [json.loads(p) for p in payloads]
    assert "".join(p["t"] for p in parts) == piece
    offsets = [p["o"] for p in parts]
    assert offsets == [sum(len(q["t"]) for q in parts[:i]) for i in range(len(parts))]
    assert [p.get("e") for p in parts] == [None] * (len(parts) - 1) + [1]  # the end, last


async def test_an_ask_to_keep_the_text_coming_sends_only_what_is_new() -> None:
    """A watching process asks again every ``INTEREST_S`` to keep a run's text coming: the
    carrying process goes on from where it was, and sends it all again only to a first
    ask (or a keep once the interest had lapsed)."""
    hub = DeltaHub(None)
    async with hub.stream("r1", 1) as write:
        write("so far")
        hub._asked("r1", keep=True)  # nothing was sent yet: a keep is a first ask
        first = hub._notices()
        hub._asked("r1", keep=True)
        idle = hub._notices()
        write(" and more")
        hub._asked("r1", keep=True)
        more = hub._notices()
    assert [(json.loads(p)["o"], json.loads(p)["t"]) for _, p in first] == [(0, "so far")]
    assert idle == []
    assert [(json.loads(p)["o"], json.loads(p).get("t")) for _, p in more] == [(6, " and more")]
