"""A SQLite store never loads psycopg: the PostgreSQL driver, its LISTEN and NOTIFY, and
its dialect's statements are imported only by a PostgreSQL store. Checked in a fresh
interpreter, since this test process has psycopg loaded already (the fixtures use it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

_SCRIPT = """
import sys
from tether.budget import Limits
from tether.store import Store, upgrade
from tether.store.backend.faults import is_transient

store = Store(sys.argv[1])
upgrade(store.engine)
store.create_run(
    run_id="r1", user_id="dana", question="q", route={}, limits=Limits(), scope={},
    versions={}, agent_version="v1", messages=[],
)
assert store.claim_ready("w1") is not None
store.claim_orphans(owner="reaper", stale_after_s=0.0, max_attempts=3, batch=5)
assert not is_transient(ValueError("not a database error"))
store.close()
print(sorted(m for m in sys.modules if m.split(".")[0] == "psycopg"))
print("tether.store.backend.postgres" in sys.modules)
"""


def test_a_sqlite_store_migrates_creates_and_claims_a_run_without_loading_psycopg(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'tether.db'}"
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, url], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[]", "False"]
