"""The HTTP API's documentation page (``/docs``): our own page, rendered on the server from
the app's OpenAPI document (``/openapi.json``), with no script at all. FastAPI's Swagger UI
and ReDoc pages load their scripts from a CDN, and no script from another origin may run
on the origin that carries the inbox's session (reference §6); ``/redoc`` leads here."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from tether.api.web.pages import page

router = APIRouter(include_in_schema=False)

_METHODS = ("get", "post", "put", "patch", "delete")
_REF = "#/components/schemas/"


@dataclass(frozen=True, kw_only=True)
class Field:
    """A parameter, or a property of a schema: its name, type, whether it is required."""

    name: str
    type: str
    required: bool
    description: str = ""
    where: str = ""  # a parameter's place: path, query, header


@dataclass(frozen=True, kw_only=True)
class Operation:
    """One method on one path, as the page shows it."""

    method: str
    path: str
    summary: str
    description: str
    parameters: tuple[Field, ...]
    body: str | None  # the request body's schema name
    responses: tuple[tuple[str, str, str | None], ...]  # status, description, schema name

    @property
    def anchor(self) -> str:
        slug = "".join(c if c.isalnum() else "-" for c in self.path.lower()).strip("-")
        return f"op-{self.method}-{'-'.join(filter(None, slug.split('-')))}"


def type_of(schema: Mapping[str, Any]) -> str:
    """A JSON schema's type in a few characters: a schema's name, ``X | null``, ``[X]``."""
    ref = schema.get("$ref")
    if isinstance(ref, str):
        return ref.removeprefix(_REF)
    for key in ("anyOf", "oneOf"):
        choices = schema.get(key)
        if isinstance(choices, list):
            return " | ".join(type_of(c) for c in choices if isinstance(c, Mapping))
    if isinstance(schema.get("enum"), list):
        return " | ".join(f'"{value}"' for value in schema["enum"])
    kind = str(schema.get("type") or "any")
    if kind == "array" and isinstance(schema.get("items"), Mapping):
        return f"[{type_of(schema['items'])}]"
    return kind


def _schema_name(content: Any) -> str | None:
    schema = (content or {}).get("application/json", {}).get("schema", {})
    return type_of(schema) if schema else None


def _operations(spec: Mapping[str, Any]) -> Iterator[Operation]:
    for path, methods in spec.get("paths", {}).items():
        for method in _METHODS:
            op = methods.get(method)
            if op is None:
                continue
            parameters = tuple(
                Field(
                    name=p["name"],
                    type=type_of(p.get("schema", {})),
                    required=bool(p.get("required")),
                    description=str(p.get("description") or ""),
                    where=str(p.get("in") or ""),
                )
                for p in op.get("parameters", ())
            )
            responses = tuple(
                (status, str(r.get("description") or ""), _schema_name(r.get("content")))
                for status, r in op.get("responses", {}).items()
            )
            yield Operation(
                method=method,
                path=path,
                summary=str(op.get("summary") or ""),
                description=str(op.get("description") or ""),
                parameters=parameters,
                body=_schema_name((op.get("requestBody") or {}).get("content")),
                responses=responses,
            )


def _schemas(spec: Mapping[str, Any]) -> list[tuple[str, str, tuple[Field, ...]]]:
    """Every schema of the document: its name, description and properties."""
    shown = []
    for name, schema in spec.get("components", {}).get("schemas", {}).items():
        required = set(schema.get("required") or ())
        fields = tuple(
            Field(
                name=prop,
                type=type_of(inner),
                required=prop in required,
                description=str(inner.get("description") or ""),
            )
            for prop, inner in (schema.get("properties") or {}).items()
        )
        shown.append((name, str(schema.get("description") or ""), fields))
    return shown


@router.get("/docs")
async def api_docs(request: Request) -> Response:
    """The API's reference, from its OpenAPI document; no script, nothing from elsewhere."""
    spec = request.app.openapi()
    context = {
        "info": spec.get("info", {}),
        "operations": list(_operations(spec)),
        "schemas": _schemas(spec),
    }
    return page(request, "api_docs.html", context, session=None)


@router.get("/redoc")
async def redoc() -> RedirectResponse:
    """The one documentation page is ``/docs``."""
    return RedirectResponse("/docs", status_code=308)
