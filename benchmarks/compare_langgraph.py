"""LangGraph in ``compare.py``: a two-node ``StateGraph`` checkpointed every super-step.

The graph: ``model`` (the scripted model: an ``AIMessage`` with one ``fetch`` tool call, or
the answer) and ``tools`` (a ``ToolMessage`` holding the tool's JSON result); ``model`` →
``tools`` while the model asks for a tool, ``tools`` → ``model`` until the run has taken its
``max_steps``. The state is one channel, ``messages``, a list of langchain-core messages:

* ``langgraph``: the default reducer channel, ``Annotated[list, add_messages]``;
* ``langgraph-delta``: LangGraph 1.2's ``DeltaChannel`` (beta), with the batch reducer
  LangGraph provides for messages (``langgraph.graph.message._messages_delta_reducer``, as
  the channel's documentation shows) and its default ``snapshot_frequency`` (100). A delta
  channel stores each super-step's writes and, every 100 updates, a snapshot, instead of
  the whole list at every checkpoint.

Each run is one ``invoke(..., durability="sync")`` on a thread of its own: the checkpoint of
every super-step is written before the next one starts. Checkpointers: ``SqliteSaver`` on
a ``sqlite3`` connection with ``synchronous=FULL`` (its ``setup()`` sets WAL) and
``PostgresSaver.from_conn_string`` (the database's sessions default to
``synchronous_commit=on``). Run-scoped settings (the script's length, the step limit) are
the graph's ``context``.

Resumption: a thread whose run ended after N tool steps (``tools`` → END at its step
limit) is resumed in a fresh process by a new checkpointer and a newly compiled graph with
the same ``thread_id``: ``invoke`` once more with a user message ("Go on.") and a limit of
N+1 steps, which loads the thread's state and takes one model step and one tool step.
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated, Any, TypedDict

from compare_common import (
    ANSWER,
    NEVER,
    SYSTEM_PROMPT,
    WARMUP_STEPS,
    Database,
    Resumed,
    Sample,
    call_id,
    expect,
    expect_result,
    question,
    scalar,
    stored_bytes,
    tool_text,
    verdict,
    wants_tool,
)
from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langgraph.channels import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import _messages_delta_reducer, add_messages
from langgraph.runtime import Runtime


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


class DeltaState(TypedDict):
    messages: Annotated[list[AnyMessage], DeltaChannel(_messages_delta_reducer)]


@dataclass(frozen=True)
class Context:
    steps: int  # the script's length: the model answers at this step
    max_steps: int  # the run ends after this many tool steps


def model(state: dict[str, Any], runtime: Runtime[Context]) -> dict[str, Any]:
    """The scripted model."""
    turns = sum(1 for m in state["messages"] if isinstance(m, AIMessage))
    if not wants_tool(turns, runtime.context.steps):
        return {"messages": [AIMessage(content=ANSWER)]}
    call = {"name": "fetch", "args": {"n": turns}, "id": call_id(turns), "type": "tool_call"}
    return {"messages": [AIMessage(content="", tool_calls=[call])]}


def tools(state: dict[str, Any]) -> dict[str, Any]:
    """The read tool, for the call the last model turn asked for."""
    call = state["messages"][-1].tool_calls[0]
    text = tool_text(int(call["args"]["n"]))
    return {"messages": [ToolMessage(content=text, tool_call_id=call["id"], name="fetch")]}


def after_model(state: dict[str, Any]) -> str:
    return "tools" if state["messages"][-1].tool_calls else END


def after_tools(state: dict[str, Any], runtime: Runtime[Context]) -> str:
    turns = sum(1 for m in state["messages"] if isinstance(m, AIMessage))
    return END if turns >= runtime.context.max_steps else "model"


def graph(system: str, saver: BaseCheckpointSaver[Any]) -> Any:
    builder: Any = StateGraph(
        DeltaState if system == "langgraph-delta" else State, context_schema=Context
    )
    builder.add_node("model", model)
    builder.add_node("tools", tools)
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", after_model, ["tools", END])
    builder.add_conditional_edges("tools", after_tools, ["model", END])
    return builder.compile(checkpointer=saver)


@contextmanager
def checkpointer(db: Database, *, setup: bool) -> Iterator[BaseCheckpointSaver[Any]]:
    """The backend's saver on a connection of its own (its tables made with ``setup``)."""
    if db.backend == "sqlite":
        conn = sqlite3.connect(db.path, check_same_thread=False)
        conn.execute("PRAGMA synchronous=FULL")
        try:
            saver: BaseCheckpointSaver[Any] = SqliteSaver(conn)
            if setup:
                SqliteSaver(conn).setup()
            if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                raise RuntimeError("the checkpointer's database is not in WAL mode")
            yield saver
        finally:
            conn.close()
    else:
        with PostgresSaver.from_conn_string(db.url) as pg:
            if setup:
                pg.setup()
            yield pg


def opening(text: str) -> list[AnyMessage]:
    """A new thread's first messages."""
    return [SystemMessage(content=SYSTEM_PROMPT), HumanMessage(content=text)]


def invoke(app: Any, thread: str, new: list[AnyMessage], context: Context) -> dict[str, Any]:
    """One run of the graph on ``thread``, from the new messages ``new``."""
    config = {"configurable": {"thread_id": thread}, "recursion_limit": 2 * context.steps + 10}
    if context.max_steps < NEVER:
        config["recursion_limit"] = 2 * context.max_steps + 10
    result: dict[str, Any] = app.invoke(
        {"messages": new}, config, context=context, durability="sync"
    )
    return result


def check(
    system: str, db: Database, thread: str, *, checkpoints: int, messages: int, last_n: int
) -> list[str]:
    """Counted in the database: the thread's checkpoints; read back by a new checkpointer
    (for the delta channel: rebuilt from the stored writes), its messages and the last
    tool result whole."""
    failures: list[str] = []
    counted = scalar(db, "SELECT COUNT(*) FROM checkpoints WHERE thread_id = :t", t=thread)
    expect(failures, "stored checkpoints", counted, checkpoints)
    with checkpointer(db, setup=False) as saver:
        state = graph(system, saver).get_state({"configurable": {"thread_id": thread}})
    stored = state.values.get("messages", [])
    expect(failures, "messages in the stored state", len(stored), messages)
    results = [m.content for m in stored if isinstance(m, ToolMessage)]
    expect_result(failures, str(results[-1]) if results else None, last_n)
    return failures


def measure(system: str, db: Database, steps: int) -> Sample:
    thread = uuid.uuid4().hex
    with checkpointer(db, setup=True) as saver:
        app = graph(system, saver)
        invoke(app, "warm-up", opening(question(WARMUP_STEPS)), Context(WARMUP_STEPS, NEVER))
        before = stored_bytes(db)
        start = time.perf_counter()
        result = invoke(app, thread, opening(question(steps)), Context(steps, NEVER))
        seconds = time.perf_counter() - start
        stored = stored_bytes(db) - before
    # One checkpoint for the input, one per super-step: START, N model steps and N-1 tool
    # steps. The state: the system prompt, the question, N assistant turns, N-1 results.
    failures = check(
        system, db, thread, checkpoints=2 * steps + 1, messages=2 * steps + 1, last_n=steps - 2
    )
    expect(failures, "answer", result["messages"][-1].content, ANSWER)
    return Sample.checked(system, db, steps, seconds, stored, failures)


def prepare(system: str, db: Database, steps: int) -> str:
    """A thread whose run ended at its step limit after ``steps`` tool steps."""
    thread = uuid.uuid4().hex
    with checkpointer(db, setup=True) as saver:
        invoke(graph(system, saver), thread, opening(question(NEVER)), Context(NEVER, steps))
    return thread


def resume(system: str, db: Database, key: str, steps: int) -> Resumed:
    """A new checkpointer and graph on the thread: one more step."""
    failures = check(
        system, db, key, checkpoints=2 * steps + 2, messages=2 * steps + 2, last_n=steps - 1
    )
    # The resumed run adds 4 checkpoints: its input, START, the model step, the tool step.
    start = time.perf_counter()
    with checkpointer(db, setup=False) as saver:
        invoke(
            graph(system, saver), key, [HumanMessage(content="Go on.")], Context(NEVER, steps + 1)
        )
        seconds = time.perf_counter() - start
    failures += check(
        system, db, key, checkpoints=2 * steps + 6, messages=2 * steps + 5, last_n=steps
    )
    return Resumed(system=system, backend=db.backend, seconds=seconds, check=verdict(failures))
