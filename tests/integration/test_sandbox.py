"""The sandbox CRM over real HTTP: seed, idempotency, injected failures, re-rendering, admin."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest
from demo_procs import PREVIEW_KEYS

from tether.sandbox import RunningSandbox, start_in_thread

HENDERSON_ORDER: dict[str, Any] = {"account_id": "4471", "sku": "SKU-4411", "quantity": 200}
SEND_ROUTE = "POST /quotes/{quote_id}/send"


@pytest.fixture
def sandbox(sandbox_server: RunningSandbox) -> RunningSandbox:
    """The session's sandbox, put back to its seed (and failures disarmed) for each test."""
    response = httpx.post(f"{sandbox_server.url}/admin/reset")
    assert response.json() == {"ok": True}
    return sandbox_server


@pytest.fixture
def admin(sandbox: RunningSandbox) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=sandbox.url, timeout=10) as client:
        yield client


@pytest.fixture
def dana(sandbox: RunningSandbox) -> Iterator[httpx.Client]:
    with _client_as(sandbox, "dana") as client:
        yield client


@pytest.fixture
def miguel(sandbox: RunningSandbox) -> Iterator[httpx.Client]:
    with _client_as(sandbox, "miguel") as client:
        yield client


def _client_as(sandbox: RunningSandbox, user: str) -> httpx.Client:
    return httpx.Client(base_url=sandbox.url, headers={"X-Sandbox-User": user}, timeout=10)


def _create(client: httpx.Client, key: str, **order: Any) -> httpx.Response:
    return client.post(
        "/quotes", json={**HENDERSON_ORDER, **order}, headers={"Idempotency-Key": key}
    )


def _send(client: httpx.Client, quote_id: str, key: str) -> httpx.Response:
    return client.post(f"/quotes/{quote_id}/send", json={}, headers={"Idempotency-Key": key})


def _counts(admin: httpx.Client, account_id: str = "4471") -> tuple[int, int]:
    body = admin.get("/admin/quotes", params={"account_id": account_id}).json()
    return body["drafted"], body["sent"]


def _arm(admin: httpx.Client, route: str, kind: str) -> None:
    response = admin.post("/admin/failures", json={"route": route, "kind": kind})
    assert response.status_code == 200, response.text


def _assert_error(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error"] == code
    assert isinstance(body["message"], str) and body["message"]


def _dump(db_path: str) -> list[str]:
    """Every row of the sandbox database, to prove a refused request changed nothing."""
    with closing(sqlite3.connect(db_path)) as conn:
        return list(conn.iterdump())


# --- seed ------------------------------------------------------------------------------


def test_seed_has_henderson_at_silver_without_credit_hold(dana: httpx.Client) -> None:
    henderson = {
        "id": "4471",
        "name": "Henderson",
        "discount_tier": "silver",
        "discount_pct": 5,
        "credit_hold": False,
    }
    assert dana.get("/accounts/4471").json() == henderson
    assert dana.get("/accounts", params={"query": "henderson"}).json() == {"items": [henderson]}
    pricing = dana.get("/pricing", params={**HENDERSON_ORDER}).json()
    assert pricing == {
        "account_id": "4471",
        "sku": "SKU-4411",
        "quantity": 200,
        "list_price": 12.5,
        "discount_tier": "silver",
        "discount_pct": 5,
        "unit_price": 11.88,
        "total": 2376.0,
    }


def test_seed_gives_dana_and_miguel_their_permissions(admin: httpx.Client) -> None:
    assert admin.get("/users/dana/permissions").json() == {
        "user_id": "dana",
        "role": "inside_sales",
        "accounts": ["4471", "4472"],
        "can_draft_quotes": True,
        "can_send_quotes": True,
        "max_discount_pct": 10,
        "manager": "miguel",
        "team": [],
    }
    miguel = admin.get("/users/miguel/permissions").json()
    assert miguel["role"] == "sales_manager"
    assert {"4471", "4472"} <= set(miguel["accounts"])
    assert miguel["can_draft_quotes"] and miguel["can_send_quotes"]
    assert miguel["max_discount_pct"] == 15
    assert miguel["manager"] is None
    assert miguel["team"] == ["dana"]
    _assert_error(admin.get("/users/nobody/permissions"), 404, "not_found")


def test_restart_keeps_the_data_instead_of_reseeding(tmp_path: Path) -> None:
    db_path = str(tmp_path / "sandbox.db")
    with start_in_thread(db_path) as first, _client_as(first, "dana") as dana:
        assert _create(dana, "k-restart").status_code == 201
        dana.patch("/admin/accounts/4471", json={"discount_tier": "gold"}).raise_for_status()
    with start_in_thread(db_path) as second, _client_as(second, "dana") as dana:
        assert dana.get("/accounts/4471").json()["discount_tier"] == "gold"
        assert dana.get("/quotes/Q-1001").json()["created_key"] == "k-restart"


def test_stop_releases_the_port(tmp_path: Path) -> None:
    running = start_in_thread(str(tmp_path / "sandbox.db"))
    assert httpx.get(f"{running.url}/healthz").json() == {"ok": True}
    running.stop()
    running.stop()  # a second stop is harmless
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{running.url}/healthz")


# --- users and visibility ----------------------------------------------------------------


def test_requests_without_a_known_user_are_unauthenticated(admin: httpx.Client) -> None:
    _assert_error(admin.get("/accounts"), 401, "unauthenticated")
    _assert_error(
        admin.get("/accounts", headers={"X-Sandbox-User": "mallory"}), 401, "unauthenticated"
    )
    _assert_error(_create(admin, "k-anon"), 401, "unauthenticated")
    assert _counts(admin) == (0, 0)


def test_accounts_are_searched_and_shown_only_to_their_users(
    dana: httpx.Client, miguel: httpx.Client
) -> None:
    def ids(client: httpx.Client, query: str) -> list[str]:
        return [
            item["id"] for item in client.get("/accounts", params={"query": query}).json()["items"]
        ]

    assert ids(dana, "") == ["4471", "4472"]
    assert ids(dana, "ALVAREZ") == ["4472"]
    assert ids(dana, "4472") == ["4472"]
    assert ids(dana, "bright") == []
    assert ids(dana, "5100") == []
    assert "4473" in ids(miguel, "")
    _assert_error(dana.get("/accounts/5100"), 404, "not_found")
    _assert_error(dana.get("/accounts/9999"), 404, "not_found")
    pricing = dana.get("/pricing", params={"account_id": "5100", "sku": "SKU-4411", "quantity": 1})
    _assert_error(pricing, 404, "not_found")


# --- quotes and idempotency -----------------------------------------------------------


def test_create_drafts_a_quote_priced_at_the_accounts_tier(dana: httpx.Client) -> None:
    response = _create(dana, "k-create")
    assert response.status_code == 201
    quote = response.json()
    assert quote["quote_id"] == "Q-1001"
    assert quote["account_name"] == "Henderson"
    assert quote["lines"] == [{"sku": "SKU-4411", "quantity": 200, "unit_price": 11.88}]
    assert (quote["discount_tier"], quote["discount_pct"], quote["total"]) == ("silver", 5, 2376.0)
    assert quote["status"] == "draft"
    assert dana.get("/quotes/Q-1001").json() == quote
    assert _create(dana, "k-create-2").json()["quote_id"] == "Q-1002"


def test_repeated_key_with_the_same_body_returns_the_first_response_once(
    dana: httpx.Client, admin: httpx.Client
) -> None:
    first = _create(dana, "k-same")
    # Same parameters in another key order: the same request.
    repeat = dana.post(
        "/quotes",
        content=b'{"quantity": 200, "sku": "SKU-4411", "account_id": "4471"}',
        headers={"Idempotency-Key": "k-same", "Content-Type": "application/json"},
    )
    assert (repeat.status_code, repeat.json()) == (first.status_code, first.json())
    assert repeat.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert _counts(admin) == (1, 0)


def test_reused_key_with_another_body_or_path_is_rejected(
    dana: httpx.Client, admin: httpx.Client
) -> None:
    quote_id = _create(dana, "k-reuse").json()["quote_id"]
    _assert_error(_create(dana, "k-reuse", quantity=5), 422, "idempotency_key_reuse")
    _assert_error(_send(dana, quote_id, "k-reuse"), 422, "idempotency_key_reuse")
    assert _counts(admin) == (1, 0)
    assert dana.get(f"/quotes/{quote_id}").json()["status"] == "draft"


def test_write_without_idempotency_key_is_400(dana: httpx.Client, admin: httpx.Client) -> None:
    _assert_error(dana.post("/quotes", json=HENDERSON_ORDER), 400, "idempotency_key_required")
    quote_id = _create(dana, "k-ok").json()["quote_id"]
    _assert_error(dana.post(f"/quotes/{quote_id}/send", json={}), 400, "idempotency_key_required")
    blank = dana.post("/quotes", json=HENDERSON_ORDER, headers={"Idempotency-Key": ""})
    _assert_error(blank, 400, "idempotency_key_required")
    assert _counts(admin) == (1, 0)


def test_by_key_finds_creates_and_sends_and_404s_otherwise(dana: httpx.Client) -> None:
    created = _create(dana, "run-1:call-1").json()
    sent = _send(dana, created["quote_id"], "run-1:call-2").json()
    by_create = dana.get("/quotes/by-key/run-1:call-1").json()
    assert by_create["action"] == "created"
    assert by_create["quote"]["quote_id"] == created["quote_id"]
    assert by_create["response"] == {"status": 201, "body": created}
    by_send = dana.get("/quotes/by-key/run-1:call-2").json()
    assert (by_send["action"], by_send["quote"]) == ("sent", sent)
    _assert_error(dana.get("/quotes/by-key/run-1:call-3"), 404, "not_found")


def test_concurrent_posts_with_one_key_create_exactly_one_quote(
    sandbox: RunningSandbox, admin: httpx.Client
) -> None:
    threads = 10
    barrier = threading.Barrier(threads)

    def post() -> tuple[int, dict[str, Any]]:
        with _client_as(sandbox, "dana") as client:
            barrier.wait(timeout=10)
            response = _create(client, "k-race")
            return response.status_code, response.json()

    with ThreadPoolExecutor(threads) as pool:
        results = [future.result() for future in [pool.submit(post) for _ in range(threads)]]

    assert {status for status, _ in results} == {201}
    assert {body["quote_id"] for _, body in results} == {"Q-1001"}
    assert _counts(admin) == (1, 0)


def test_concurrent_posts_with_distinct_keys_get_distinct_sequential_ids(
    sandbox: RunningSandbox, admin: httpx.Client
) -> None:
    threads = 10
    barrier = threading.Barrier(threads)

    def post(index: int) -> str:
        with _client_as(sandbox, "dana") as client:
            barrier.wait(timeout=10)
            response = _create(client, f"k-distinct-{index}")
            assert response.status_code == 201, response.text
            quote_id: str = response.json()["quote_id"]
            return quote_id

    with ThreadPoolExecutor(threads) as pool:
        quote_ids = list(pool.map(post, range(threads)))

    assert sorted(quote_ids) == [f"Q-{1001 + i}" for i in range(threads)]
    assert _counts(admin) == (threads, 0)


# --- injected failures ------------------------------------------------------------------


def test_crash_after_commit_on_create_is_recovered_by_retry_and_by_key(
    dana: httpx.Client, admin: httpx.Client
) -> None:
    _arm(admin, "POST /quotes", "crash_after_commit")
    _assert_error(_create(dana, "k-crash"), 500, "injected_failure")
    assert _counts(admin) == (1, 0)

    found = dana.get("/quotes/by-key/k-crash").json()
    assert found["action"] == "created"
    retry = _create(dana, "k-crash")
    assert retry.status_code == 201
    assert retry.json() == found["quote"] == found["response"]["body"]
    assert _counts(admin) == (1, 0)
    assert admin.get("/healthz").json() == {"ok": True}


def test_crash_after_commit_on_send_commits_the_send(
    dana: httpx.Client, admin: httpx.Client
) -> None:
    quote_id = _create(dana, "k-draft").json()["quote_id"]
    _arm(admin, SEND_ROUTE, "crash_after_commit")
    _assert_error(_send(dana, quote_id, "k-send"), 500, "injected_failure")

    assert dana.get(f"/quotes/{quote_id}").json()["status"] == "sent"
    assert dana.get("/quotes/by-key/k-send").json()["action"] == "sent"
    retry = _send(dana, quote_id, "k-send")
    assert retry.status_code == 200
    assert retry.json()["status"] == "sent"
    assert _counts(admin) == (1, 1)


def test_fail_before_commit_writes_nothing(
    sandbox: RunningSandbox, dana: httpx.Client, admin: httpx.Client
) -> None:
    before = _dump(sandbox.db_path)
    _arm(admin, "POST /quotes", "fail_before_commit")
    _assert_error(_create(dana, "k-fail"), 500, "injected_failure")

    assert _dump(sandbox.db_path) == before
    _assert_error(dana.get("/quotes/by-key/k-fail"), 404, "not_found")
    retry = _create(dana, "k-fail")  # nothing was recorded, so the key is still free
    assert retry.status_code == 201
    assert _counts(admin) == (1, 0)


def test_injected_failure_fires_once_and_only_on_its_route(
    dana: httpx.Client, admin: httpx.Client
) -> None:
    _arm(admin, SEND_ROUTE, "fail_before_commit")
    created = _create(dana, "k-other-route")
    assert created.status_code == 201
    quote_id = created.json()["quote_id"]
    _assert_error(_send(dana, quote_id, "k-send-1"), 500, "injected_failure")
    assert _send(dana, quote_id, "k-send-1").status_code == 200
    unknown = admin.post(
        "/admin/failures", json={"route": "POST /nowhere", "kind": "crash_after_commit"}
    )
    _assert_error(unknown, 422, "unknown_route")


# --- re-rendering, guards and permissions ----------------------------------------------


def test_preview_rerenders_at_the_current_tier(dana: httpx.Client, admin: httpx.Client) -> None:
    quote_id = _create(dana, "k-preview").json()["quote_id"]
    silver = dana.get(f"/quotes/{quote_id}/preview").json()
    assert silver == {
        "quote_id": quote_id,
        "account_id": "4471",
        "account_name": "Henderson",
        "lines": [{"sku": "SKU-4411", "quantity": 200, "unit_price": 11.88}],
        "discount_tier": "silver",
        "discount_pct": 5,
        "total": 2376.0,
    }

    admin.patch("/admin/accounts/4471", json={"discount_tier": "gold"}).raise_for_status()
    gold = dana.get(f"/quotes/{quote_id}/preview").json()
    assert set(gold) == PREVIEW_KEYS
    assert (gold["discount_tier"], gold["discount_pct"], gold["total"]) == ("gold", 10, 2250.0)
    assert gold["lines"] == [{"sku": "SKU-4411", "quantity": 200, "unit_price": 11.25}]
    assert dana.get(f"/quotes/{quote_id}").json()["total"] == 2376.0  # stored draft unchanged

    sent = _send(dana, quote_id, "k-preview-send").json()
    assert sent["status"] == "sent" and sent["sent_at"]
    assert {key: sent[key] for key in PREVIEW_KEYS} == gold


def test_send_on_credit_hold_is_409_and_sends_nothing(
    dana: httpx.Client, admin: httpx.Client
) -> None:
    quote_id = _create(dana, "k-hold").json()["quote_id"]
    admin.patch("/admin/accounts/4471", json={"credit_hold": True}).raise_for_status()
    _assert_error(_send(dana, quote_id, "k-hold-send"), 409, "credit_hold")
    assert dana.get(f"/quotes/{quote_id}").json()["status"] == "draft"
    assert _counts(admin) == (1, 0)

    admin.patch("/admin/accounts/4471", json={"credit_hold": False}).raise_for_status()
    assert _send(dana, quote_id, "k-hold-send").status_code == 200  # refusals are not recorded


def test_second_send_with_another_key_is_already_sent(
    dana: httpx.Client, admin: httpx.Client
) -> None:
    quote_id = _create(dana, "k-twice").json()["quote_id"]
    assert _send(dana, quote_id, "k-twice-1").status_code == 200
    _assert_error(_send(dana, quote_id, "k-twice-2"), 409, "already_sent")
    assert _counts(admin) == (1, 1)


def test_revoked_permissions_are_403(dana: httpx.Client, admin: httpx.Client) -> None:
    def revoke(**changes: Any) -> None:
        admin.patch("/admin/users/dana/permissions", json=changes).raise_for_status()

    revoke(can_draft_quotes=False)
    _assert_error(_create(dana, "k-perm-1"), 403, "forbidden")
    revoke(can_draft_quotes=True)
    quote_id = _create(dana, "k-perm-2").json()["quote_id"]

    revoke(can_send_quotes=False)
    _assert_error(_send(dana, quote_id, "k-perm-3"), 403, "forbidden")
    revoke(can_send_quotes=True, accounts=["4472"])
    assert admin.get("/users/dana/permissions").json()["accounts"] == ["4472"]
    _assert_error(_send(dana, quote_id, "k-perm-4"), 403, "forbidden")
    _assert_error(_create(dana, "k-perm-5"), 403, "forbidden")
    _assert_error(_create(dana, "k-perm-6", account_id="5100"), 403, "forbidden")
    assert _counts(admin) == (1, 0)


def test_admin_counts_drafted_and_sent_per_account(dana: httpx.Client, admin: httpx.Client) -> None:
    ids = [_create(dana, f"k-count-{i}").json()["quote_id"] for i in range(3)]
    _create(dana, "k-count-alvarez", account_id="4472").raise_for_status()
    _send(dana, ids[0], "k-count-send").raise_for_status()

    henderson = admin.get("/admin/quotes", params={"account_id": "4471"}).json()
    assert (henderson["drafted"], henderson["sent"]) == (3, 1)
    assert [quote["quote_id"] for quote in henderson["quotes"]] == ids
    assert _counts(admin, "4472") == (1, 0)
    assert _counts(admin, "5100") == (0, 0)
    _assert_error(admin.get("/admin/quotes", params={"account_id": "9999"}), 404, "not_found")


def test_reset_restores_the_seed_and_disarms_failures(
    dana: httpx.Client, admin: httpx.Client
) -> None:
    _create(dana, "k-before-reset").raise_for_status()
    admin.patch("/admin/accounts/4471", json={"discount_tier": "platinum", "credit_hold": True})
    admin.patch("/admin/users/dana/permissions", json={"can_send_quotes": False})
    _arm(admin, "POST /quotes", "fail_before_commit")

    assert admin.post("/admin/reset").json() == {"ok": True}

    account = dana.get("/accounts/4471").json()
    assert (account["discount_tier"], account["credit_hold"]) == ("silver", False)
    assert admin.get("/users/dana/permissions").json()["can_send_quotes"] is True
    assert _counts(admin) == (0, 0)
    _assert_error(dana.get("/quotes/by-key/k-before-reset"), 404, "not_found")
    again = _create(dana, "k-before-reset")
    assert (again.status_code, again.json()["quote_id"]) == (201, "Q-1001")


# --- malformed input --------------------------------------------------------------------

MALFORMED: list[tuple[str, str, dict[str, Any], int, str]] = [
    ("POST", "/quotes", {"content": b"{not json"}, 422, "invalid_json"),
    ("POST", "/quotes", {"json": []}, 422, "invalid_request"),
    ("POST", "/quotes", {"json": {**HENDERSON_ORDER, "quantity": 0}}, 422, "invalid_request"),
    ("POST", "/quotes", {"json": {**HENDERSON_ORDER, "quantity": -3}}, 422, "invalid_request"),
    ("POST", "/quotes", {"json": {**HENDERSON_ORDER, "quantity": "5"}}, 422, "invalid_request"),
    ("POST", "/quotes", {"json": {**HENDERSON_ORDER, "quantity": 2.5}}, 422, "invalid_request"),
    ("POST", "/quotes", {"json": {**HENDERSON_ORDER, "quantity": True}}, 422, "invalid_request"),
    ("POST", "/quotes", {"json": {**HENDERSON_ORDER, "quantity": 10**30}}, 422, "invalid_request"),
    ("POST", "/quotes", {"json": {**HENDERSON_ORDER, "account_id": 4471}}, 422, "invalid_request"),
    ("POST", "/quotes", {"json": {"account_id": "4471", "quantity": 1}}, 422, "invalid_request"),
    ("POST", "/quotes", {"json": {**HENDERSON_ORDER, "discount": 50}}, 422, "invalid_request"),
    ("POST", "/quotes", {"json": {**HENDERSON_ORDER, "sku": "SKU-0000"}}, 422, "unknown_sku"),
    ("POST", "/quotes", {"json": {**HENDERSON_ORDER, "account_id": "9999"}}, 403, "forbidden"),
    ("POST", "/quotes/Q-1001/send", {"json": {"force": True}}, 422, "invalid_request"),
    ("POST", "/quotes/Q-9999/send", {"json": {}}, 404, "not_found"),
    ("GET", "/pricing", {"params": {**HENDERSON_ORDER, "quantity": "x"}}, 422, "invalid_request"),
    ("GET", "/pricing", {"params": {**HENDERSON_ORDER, "quantity": 0}}, 422, "invalid_request"),
    ("GET", "/pricing", {"params": {"account_id": "4471"}}, 422, "invalid_request"),
    ("GET", "/pricing", {"params": {**HENDERSON_ORDER, "sku": "SKU-0"}}, 422, "unknown_sku"),
    ("GET", "/quotes/Q-9999", {}, 404, "not_found"),
    ("PATCH", "/admin/accounts/4471", {"json": {"discount_tier": "diamond"}}, 422, "unknown_tier"),
    ("PATCH", "/admin/accounts/4471", {"json": {"credit_hold": "yes"}}, 422, "invalid_request"),
    ("PATCH", "/admin/accounts/9999", {"json": {"credit_hold": True}}, 404, "not_found"),
    (
        "PATCH",
        "/admin/users/dana/permissions",
        {"json": {"accounts": ["4471", "nope"]}},
        422,
        "unknown_account",
    ),
    (
        "PATCH",
        "/admin/users/dana/permissions",
        {"json": {"max_discount_pct": 150}},
        422,
        "invalid_request",
    ),
    (
        "PATCH",
        "/admin/users/dana/permissions",
        {"json": {"can_send_quotes": "false"}},
        422,
        "invalid_request",
    ),
    ("PATCH", "/admin/users/nobody/permissions", {"json": {}}, 404, "not_found"),
    (
        "POST",
        "/admin/failures",
        {"json": {"route": "POST /quotes", "kind": "explode"}},
        422,
        "invalid_request",
    ),
    ("GET", "/nowhere", {}, 404, "not_found"),
    ("DELETE", "/quotes", {}, 405, "method_not_allowed"),
]


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status", "code"),
    MALFORMED,
    ids=[f"{method} {path} {status} {code}" for method, path, _, status, code in MALFORMED],
)
def test_malformed_input_is_a_4xx_with_the_error_shape_and_changes_nothing(
    sandbox: RunningSandbox,
    dana: httpx.Client,
    method: str,
    path: str,
    kwargs: dict[str, Any],
    status: int,
    code: str,
) -> None:
    assert _create(dana, "k-existing").json()["quote_id"] == "Q-1001"
    before = _dump(sandbox.db_path)
    headers = {"Idempotency-Key": "k-malformed"}
    if "content" in kwargs:
        headers["Content-Type"] = "application/json"

    response = dana.request(method, path, headers=headers, **kwargs)

    _assert_error(response, status, code)
    assert response.json()["ok"] is False
    assert _dump(sandbox.db_path) == before
