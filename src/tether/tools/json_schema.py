"""Tool arguments described by a JSON schema rather than a Python signature.

A tool served by another system (an MCP server, say) publishes the JSON schema of its
arguments; that schema is what the model must see, unchanged, and what the model's
arguments are checked against before anything runs. ``json_arguments`` builds the
pydantic model a ``Tool`` takes as ``args_model`` from it, so the rest of tether (the
validation of the model's and an approver's edited arguments, the stored arguments, the
inbox's form fields) treats such a tool like any other. Validation is the ``jsonschema``
library's (installed with ``tether[mcp]``), imported only when such a model is built.
"""

from __future__ import annotations

import copy
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from tether.errors import ConfigError


class JsonArguments(BaseModel):
    """Arguments checked against a JSON schema. The validated arguments are the fields
    (``args.model_dump()``, or ``args.title`` for a plain name); a subclass per schema."""

    model_config = ConfigDict(extra="allow", frozen=True)
    json_schema: ClassVar[dict[str, Any]] = {"type": "object"}
    validator: ClassVar[Any] = None

    @model_validator(mode="before")
    @classmethod
    def _check(cls, data: Any) -> Any:
        """Every violation of the schema, each at its path (as pydantic reports its own)."""
        problems = sorted(
            cls.validator.iter_errors(data), key=lambda e: [str(part) for part in e.absolute_path]
        )
        if not problems:
            return data
        raise ValidationError.from_exception_data(
            cls.__name__,
            [
                InitErrorDetails(
                    type=PydanticCustomError("json_schema", "{reason}", {"reason": p.message}),
                    loc=tuple(p.absolute_path),
                    input=p.instance,
                )
                for p in problems
            ],
        )

    @classmethod
    def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The schema as published: the model sees exactly what the tool declared."""
        return copy.deepcopy(cls.json_schema)


def json_arguments(name: str, schema: dict[str, Any]) -> type[JsonArguments]:
    """The arguments model of ``schema`` (a JSON schema whose root is an object). A schema
    that is not valid JSON schema is a ``ConfigError`` naming the tool."""
    from jsonschema import exceptions, validators

    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        raise ConfigError(f"tool {name}: its arguments' schema must be an object schema")
    kind = validators.validator_for(schema)
    try:
        kind.check_schema(schema)
    except exceptions.SchemaError as exc:
        raise ConfigError(f"tool {name}: invalid JSON schema: {exc.message}") from exc
    attributes = {
        "json_schema": copy.deepcopy(schema),
        "validator": kind(schema, format_checker=kind.FORMAT_CHECKER),
        "__module__": __name__,
    }
    return type(f"{name}_arguments", (JsonArguments,), attributes)
