"""Which connection failures are refusals (never retried, reported with what to change) and
which stay transient (``tether.store.backend.faults``)."""

from __future__ import annotations

import psycopg
import pytest

from tether.store.backend import faults

SERVER = 'connection failed: connection to server at "127.0.0.1", port 5432 failed: '


@pytest.mark.parametrize(
    ("said", "hint"),
    [
        ('FATAL:  database "shop" does not exist', "createdb shop"),
        ('FATAL:  role "shop" does not exist', "createuser shop"),
        ('FATAL:  password authentication failed for user "shop"', "user and password"),
        ("FATAL:  no pg_hba.conf entry for host", "user and password"),
        ("[Errno -2] Name or service not known", "host name"),
        ('connection is bad: invalid sslmode value: "bogus"', "options"),
    ],
)
def test_a_refusal_names_what_the_server_said_and_what_to_change(said: str, hint: str) -> None:
    reason = faults.refusal(psycopg.OperationalError(SERVER + said))
    assert reason is not None
    assert " ".join(said.split()) in reason and hint in reason


@pytest.mark.parametrize(
    "said",
    [
        "Connection refused\n\tIs the server running on that host?",
        "FATAL:  the database system is starting up",
        "[Errno -3] Temporary failure in name resolution",
        "FATAL:  sorry, too many clients already",
    ],
)
def test_an_outage_is_no_refusal_and_stays_transient(said: str) -> None:
    error = psycopg.OperationalError(SERVER + said)
    assert faults.refusal(error) is None
    assert faults.is_transient(error)
