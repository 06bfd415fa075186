"""The model's text as it is written, to the watchers of its run (reference §16).

One ``DeltaHub`` per database in a process (``hub_for``), shared by its engines. The
process that carries a step hands the model's text to it piece by piece (``stream``); it
keeps the step's text so far, so a watcher that arrives mid-step first gets it as one
delta at offset 0. Each model call is a new *generation*: a repeated call (after a crash
or a retry) starts again at 0, and a watcher replaces that step's text. Nothing here is
durable: the stored ``model_turn`` event carries the whole text.

Watchers in this process subscribe (``subscribe``); each has a bounded queue, and one that
falls behind is dropped to a catch-up (the text so far at offset 0 once it reads again).
On PostgreSQL, other processes' watchers get notices (heard on the process's one ``LISTEN``
connection, ``tether.store.backend.listening``; sent on a connection of the hub's own):
- a watching process asks for a run on ``WATCH_CHANNEL`` (on subscribing, when its
  listener (re)connects, every ``INTEREST_S`` while it watches, and at once when a process
  that carries steps begins to listen: its roll call on ``DELTAS_CHANNEL``);
- a process carrying a step of a run asked for within ``INTEREST_TTL_S`` sends its text on
  ``DELTAS_CHANNEL`` (batched by the announcer's thread; a new ask makes it send the text
  so far again from 0), and an end marker when the model call returns;
- a run nobody asked for sends nothing: with no watchers a piece costs one append.
A receiving process forwards only text that follows what its watchers hold (a repeat is
trimmed, a gap asks again). On SQLite only watchers in the carrying process get deltas.

Every delta of a step comes before its ``model_turn`` event (reference §16), across
processes too, by two commitments: the carrying process stores a step's turn only once the
step's text, to its end marker, is committed as notices (``stream`` waits for that batch);
and a watching process that reads a ``model_turn`` whose step's text it does not hold to its
end sends a notice of its own (a *sync*) on ``DELTAS_CHANNEL`` and sends the event once that
notice came back (``caught_up``). PostgreSQL hands each listener notices in the order their
transactions committed, so every delta committed before the turn has come by then.
"""

from tether._runtime.live.deltas.hub import DeltaHub, hub_for, release
from tether._runtime.live.deltas.texts import DeltaSubscription

__all__ = ["DeltaHub", "DeltaSubscription", "hub_for", "release"]
