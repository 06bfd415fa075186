// tether inbox: pages follow runs as they go (reference §16). Every page is whole without
// this script and its forms post as they always do; this only keeps what is shown fresh.
//
// A run's page ([data-live-stream]) listens to the run's stream: the model's text of the
// step in flight is written into [data-live-text] as it comes (a delta at offset 0
// replaces the step's text, any other appends at its offset, counted in code points), and
// each stored event has the page ([data-live-page]) fetched again and its [data-live]
// parts swapped in. EventSource reconnects by itself with the last event id it saw.
//
// A list ([data-live-list]) opens one stream of signals for the rows marked
// [data-live-run] (the viewer's runs that are not terminal) and is fetched again on each,
// and every [data-live-poll] seconds while the tab is visible. A run's page in a tree of
// sub-agents names the list stream too: while it follows its own run, it also follows the
// signals of the tree's other runs its rows mark (a child that suspends tells its own
// stream, not its parent's).
//
// A part in which the viewer is typing (focus inside, or a field changed from what was
// sent) is left alone until a later fetch finds it free. A page that answers a form (a
// refusal, with what was typed) is not followed: it is not at its own address.
"use strict";

(() => {
  const root = document.querySelector(".live-follow");
  if (!root) return;
  const page = root.dataset.livePage;
  if (location.pathname + location.search !== page) return;
  // The events after which a run's stream has nothing more to say (its terminal states).
  const LAST = new Set(["answered", "failed", "cancelled"]);
  let source = null; // the page's stream: a run's own, or a list's signals
  let rows = null; // a run page's signals of the other runs of its tree
  let following = "";
  let ended = ""; // the rows whose signals ended: not followed again until they change
  let fetching = false;
  let fetched = 0;
  let again = false;
  const afterFetch = [];

  const status = (state) => { root.dataset.liveState = state; };

  const edited = (field) => {
    if (field.type === "hidden" || field.type === "submit") return false;
    if (field.type === "checkbox" || field.type === "radio") {
      return field.checked !== field.defaultChecked;
    }
    if (field.tagName === "SELECT") {
      return Array.from(field.options).some((o) => o.selected !== o.defaultSelected);
    }
    return field.value !== field.defaultValue;
  };

  const inUse = (part) => {
    const active = document.activeElement;
    if (active && active !== document.body && part.contains(active)) return true;
    return Array.from(part.querySelectorAll("input, textarea, select")).some(edited);
  };

  const swap = (fresh) => {
    for (const part of document.querySelectorAll("[data-live]")) {
      const name = part.dataset.live;
      const next = Array.from(fresh.querySelectorAll("[data-live]")).find(
        (el) => el.dataset.live === name);
      if (!next || next.innerHTML === part.innerHTML || inUse(part)) continue;
      part.innerHTML = next.innerHTML;
    }
  };

  const refresh = async () => {
    if (fetching) { again = true; return; }
    fetching = true;
    try {
      do {
        again = false;
        const answer = await fetch(page, {
          credentials: "same-origin", cache: "no-store", redirect: "manual",
          headers: { Accept: "text/html" },
        });
        if (answer.type === "opaqueredirect" || !answer.ok) { stop(); return; }
        const fresh = new DOMParser().parseFromString(await answer.text(), "text/html");
        swap(fresh);
        fetched += 1;
        root.dataset.liveFetched = String(fetched);
        for (const then of afterFetch.splice(0)) then(fresh);
        const freshRoot = fresh.querySelector(".live-follow");
        if (root.dataset.liveStream && !(freshRoot && freshRoot.dataset.liveStream)) stop();
        if (root.dataset.liveList && (source || !root.dataset.liveStream)) followRows();
      } while (again);
    } catch (error) {
      // The network failed: the next event, poll or reconnection fetches again.
    } finally {
      fetching = false;
    }
  };

  const unfollowRows = () => {
    if (rows) rows.close();
    rows = null;
  };

  const stop = () => {
    if (source) source.close();
    source = null;
    unfollowRows();
    status("closed");
  };

  // A stream of the page: a run's own ("run"), a list's signals ("list"), or a run page's
  // signals of its tree ("tree", whose state is not the page's).
  const open = (url, listen, kind) => {
    const events = new EventSource(url);
    const main = kind !== "tree";
    if (main) status("connecting");
    let opened = false;
    events.addEventListener("open", () => {
      if (main) status("open");
      // After a reconnection (or, for signals, once the stream is there) the page is
      // fetched again: what happened meanwhile shows.
      if (opened || kind !== "run") refresh();
      opened = true;
    });
    events.addEventListener("error", () => {
      if (main && events.readyState === EventSource.CLOSED) status("closed");
    });
    listen(events);
    return events;
  };

  // -- a run's page ---------------------------------------------------------------------

  const followRun = (url) => {
    const box = document.querySelector("[data-live-text]");
    const shown = box && box.querySelector("pre");
    let step = 0;
    let chars = [];
    const write = (delta) => {
      if (delta.step < step) return;
      if (delta.step > step) { step = delta.step; chars = []; }
      if (delta.offset > chars.length) return; // a gap: the catch-up at 0 mends it
      chars = chars.slice(0, delta.offset).concat(Array.from(delta.text));
      if (!shown) return;
      shown.textContent = chars.join("");
      box.dataset.step = String(step);
      box.hidden = false;
    };
    const stored = (turn) => {
      // The stored turn holds the whole text: once the page shows it, the draft goes.
      if (turn < step || !box) return;
      afterFetch.push(() => {
        if (step > turn) return;
        chars = [];
        box.hidden = true;
        shown.textContent = "";
      });
    };
    if (source) source.close();
    source = open(url, (events) => {
      events.addEventListener("delta", (e) => write(JSON.parse(e.data)));
      // Every stored event comes unnamed (a "message"), its kind in its data.
      events.addEventListener("message", (e) => {
        const event = JSON.parse(e.data);
        if (event.kind === "model_turn") stored(Number(event.data.step || 0));
        if (LAST.has(event.kind)) stop();
        refresh();
      });
    }, "run");
  };

  // -- a list ---------------------------------------------------------------------------

  // A list's rows, as its one stream; or, beside a run's own stream, its tree's.
  const followRows = () => {
    const onList = !root.dataset.liveStream;
    const current = onList ? source : rows;
    const ids = Array.from(document.querySelectorAll("[data-live-run]"),
      (row) => row.dataset.liveRun);
    const wanted = Array.from(new Set(ids)).sort().join(",");
    if (wanted === ended || (wanted === following && current)) return;
    following = wanted;
    const ending = () => { if (onList) stop(); else unfollowRows(); };
    if (!wanted) { if (current) ending(); return; }
    if (current) current.close();
    const query = new URLSearchParams();
    for (const id of wanted.split(",")) query.append("run", id);
    const signals = open(root.dataset.liveList + "?" + query.toString(), (events) => {
      events.addEventListener("changed", () => refresh());
      events.addEventListener("done", () => { ended = wanted; ending(); refresh(); });
    }, onList ? "list" : "tree");
    if (onList) source = signals; else rows = signals;
  };

  if (root.dataset.liveStream) {
    followRun(root.dataset.liveStream);
    if (root.dataset.liveList) followRows();
  } else if (root.dataset.liveList) {
    followRows();
    const every = Number(root.dataset.livePoll || 0) * 1000;
    if (every > 0) {
      setInterval(() => { if (!document.hidden) refresh(); }, every);
    }
  }
})();
