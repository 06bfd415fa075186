"""The API's documentation page and the headers of every answer, over ASGI on a SQLite
file (``tether.api.web.apidocs``, ``tether.api.headers``): ``/docs`` is our own page, with
every operation of the OpenAPI document and no script; ``/redoc`` leads to it; and every
answer of the app, pages, API, documents and files alike, carries a Content-Security-Policy
that lets no other origin's script run."""

from __future__ import annotations

import re

from inbox_web import web

METHODS = ("get", "post", "put", "patch", "delete")


async def test_the_docs_page_lists_every_operation_with_no_script(sqlite_url: str) -> None:
    app = await web(sqlite_url)
    try:
        async with app.client() as client:
            spec = (await client.get("/openapi.json")).json()
            docs = await client.get("/docs")
            redoc = await client.get("/redoc")
    finally:
        app.close()
    assert docs.status_code == 200 and docs.headers["content-type"].startswith("text/html")
    assert "<script" not in docs.text and "cdn." not in docs.text
    for path, operations in spec["paths"].items():
        for method in METHODS:
            if method in operations:
                assert f"<code>{method.upper()} {path}</code>" in docs.text, (method, path)
    for name in spec["components"]["schemas"]:
        assert f'id="schema-{name}"' in docs.text
    assert redoc.status_code == 308 and redoc.headers["location"] == "/docs"


async def test_every_answer_carries_a_policy_that_runs_no_other_origin_s_script(
    sqlite_url: str,
) -> None:
    app = await web(sqlite_url)
    try:
        async with app.client() as client:
            answers = [
                await client.get(path)
                for path in (
                    "/docs",
                    "/openapi.json",
                    "/static/tether.css",
                    "/static/live.js",
                    "/login",
                    "/healthz",
                    "/v1/runs",  # 401
                    "/no-such-page",  # 404
                )
            ]
    finally:
        app.close()
    for answer in answers:
        policy = answer.headers.get("content-security-policy", "")
        directives = {}
        for part in filter(None, re.split(r";\s*", policy)):
            name, _, value = part.partition(" ")
            directives[name] = value
        assert directives.get("script-src") == "'self'", (answer.url, policy)
        assert directives.get("default-src") == "'none'", (answer.url, policy)
        assert answer.headers["x-content-type-options"] == "nosniff"
