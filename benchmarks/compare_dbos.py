"""DBOS Transact in ``compare.py``: the agent loop as a DBOS workflow.

The workflow ``agent`` keeps the message list in memory and calls two ``@DBOS.step``
functions per step: ``model`` (the scripted model: it gets the history, returns the
assistant turn) and ``fetch`` (the tool). DBOS records each step's output in its system
database (``operation_outputs``) as the step completes, and the workflow's inputs, status
and result in ``workflow_status``: that is the stored run. DBOS's default serializer
(pickle, base64) encodes the outputs. It runs with ``system_database_url`` set to the
database under test: a SQLite file, or a PostgreSQL database.

Durability. PostgreSQL: the database's sessions default to ``synchronous_commit=on``
(``ALTER DATABASE``). SQLite: the file is in WAL mode (set when it is created, kept by the
file), and a SQLAlchemy ``connect`` listener on the ``Engine`` class sets
``synchronous=FULL`` on every SQLite connection DBOS's engine opens (DBOS has no setting of
its own for it).

The warm-up is a 3-step workflow on the same launched DBOS. Each database gets its own
``DBOS(config)`` + ``DBOS.launch()``, and ``DBOS.destroy()`` after it.

Resumption is DBOS's own: recovery. The stored run is a workflow (``max_steps`` N+1) whose
process exits (``os._exit``) right after its Nth step's output is recorded, leaving it
PENDING. A fresh process creates ``DBOS(config)`` and calls ``DBOS.launch()``, which
recovers pending workflows: it runs the workflow function again from the start, each of
the 2N recorded step outputs is read back from the database instead of being executed,
and step N+1 (a model step and a tool step) runs; the workflow then returns (its step
limit). Timed from ``DBOS(config)`` to the workflow's result.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import time
import uuid
from typing import Any

import sqlalchemy as sa
from compare_common import (
    NEVER,
    SYSTEM_PROMPT,
    WARMUP_STEPS,
    Database,
    Resumed,
    Sample,
    assistant_turn,
    emit,
    expect,
    expect_result,
    question,
    scalar,
    stored_bytes,
    tool_result,
    verdict,
)
from dbos import DBOS, DBOSConfig, SetWorkflowID

HALTED = "halted: max_steps"


def _full_sync(dbapi_connection: Any, _record: Any) -> None:
    """Every SQLite connection this process opens: WAL, ``synchronous=FULL``."""
    if isinstance(dbapi_connection, sqlite3.Connection):
        dbapi_connection.execute("PRAGMA journal_mode=WAL")
        dbapi_connection.execute("PRAGMA synchronous=FULL")


sa.event.listen(sa.Engine, "connect", _full_sync)


def _model(messages: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """The scripted model: the next turn for a history."""
    return assistant_turn(sum(1 for m in messages if m["role"] == "assistant"), steps)


def _fetch(n: int) -> dict[str, Any]:
    """The read tool."""
    return tool_result(n)


model_step = DBOS.step(name="model")(_model)
fetch_step = DBOS.step(name="fetch")(_fetch)

# Set in the process that stores the run to resume: it exits after that many steps.
crash_after: dict[str, Any] = {"steps": None, "key": ""}
# When this process began to execute the workflow function (recovery's replay starts).
entered: list[float] = []


def _agent(text: str, steps: int, max_steps: int) -> str:
    """The agent loop: the model, then the tool it asks for, until it answers or has
    taken ``max_steps`` steps."""
    entered.append(time.perf_counter())
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": text},
    ]
    for taken in range(1, max_steps + 1):
        turn = model_step(messages, steps)
        messages.append(turn)
        calls = turn.get("tool_calls")
        if not calls:
            return str(turn["content"])
        result = fetch_step(json.loads(calls[0]["function"]["arguments"])["n"])
        messages.append(
            {"role": "tool", "tool_call_id": calls[0]["id"], "content": json.dumps(result)}
        )
        if crash_after["steps"] == taken:
            emit({"key": crash_after["key"]})
            os._exit(0)  # the process dies: the workflow stays PENDING
    return HALTED


agent = DBOS.workflow(name="agent")(_agent)


def launch(db: Database) -> None:
    config: DBOSConfig = {
        "name": "compare",
        "system_database_url": db.url,
        "application_version": "compare",
        "executor_id": "compare",
        "log_level": "WARNING",
    }
    DBOS(config=config)
    DBOS.launch()


def shutdown() -> None:
    DBOS.destroy(destroy_registry=False)


def _table(db: Database, name: str) -> str:
    return name if db.backend == "sqlite" else f"dbos.{name}"


def counted(db: Database, workflow_id: str, *, outputs: int, status: str) -> list[str]:
    """Counted in the system database: the workflow's recorded step outputs, its status."""
    failures: list[str] = []
    expect(
        failures,
        "recorded step outputs",
        scalar(
            db,
            f"SELECT COUNT(*) FROM {_table(db, 'operation_outputs')} WHERE workflow_uuid = :w",
            w=workflow_id,
        ),
        outputs,
    )
    expect(
        failures,
        "workflow status",
        scalar(
            db,
            f"SELECT status FROM {_table(db, 'workflow_status')} WHERE workflow_uuid = :w",
            w=workflow_id,
        ),
        status,
    )
    return failures


def check(db: Database, workflow_id: str, *, outputs: int, status: str, last_n: int) -> list[str]:
    """``counted``, and the last tool output (read back by ``DBOS.list_workflow_steps``,
    so DBOS must be launched) whole."""
    failures = counted(db, workflow_id, outputs=outputs, status=status)
    steps = DBOS.list_workflow_steps(workflow_id)
    fetched = [s["output"] for s in steps if s["function_name"] == "fetch"]
    expect_result(failures, json.dumps(fetched[-1]) if fetched else None, last_n)
    return failures


def measure(system: str, db: Database, steps: int) -> Sample:
    launch(db)
    try:
        agent(question(WARMUP_STEPS), WARMUP_STEPS, NEVER)
        before = stored_bytes(db)
        workflow_id = uuid.uuid4().hex
        start = time.perf_counter()
        with SetWorkflowID(workflow_id):
            answer = agent(question(steps), steps, NEVER)
        seconds = time.perf_counter() - start
        stored = stored_bytes(db) - before
        # each step's model output and (but the last) its tool output
        failures = check(db, workflow_id, outputs=2 * steps - 1, status="SUCCESS", last_n=steps - 2)
        expect(failures, "answer", answer, "done")
    finally:
        shutdown()
    return Sample.checked(system, db, steps, seconds, stored, failures)


def prepare(system: str, db: Database, steps: int) -> str:
    """A PENDING workflow of ``steps`` recorded tool steps: this process exits after them
    (``emit`` hands the parent the workflow id first)."""
    workflow_id = uuid.uuid4().hex
    crash_after.update(steps=steps, key=workflow_id)
    launch(db)
    with SetWorkflowID(workflow_id):
        agent(question(NEVER), NEVER, steps + 1)
    raise RuntimeError("the workflow went on past its crash point")


def resume(system: str, db: Database, key: str, steps: int) -> Resumed:
    """A fresh process launches DBOS, which recovers the PENDING workflow."""
    failures = counted(db, key, outputs=2 * steps, status="PENDING")
    start = time.perf_counter()
    launch(db)
    try:
        # Polled at 1 ms: DBOS's default (1 s) would round the figure up to whole seconds.
        result: str = DBOS.retrieve_workflow(key).get_result(polling_interval_sec=0.001)
        done = time.perf_counter()
        seconds = done - start
        failures += check(db, key, outputs=2 * steps + 2, status="SUCCESS", last_n=steps)
        expect(failures, "result", result, HALTED)
    finally:
        shutdown()
    return Resumed(
        system=system,
        backend=db.backend,
        seconds=seconds,
        check=verdict(failures),
        waited=entered[0] - start if entered else math.nan,
    )
