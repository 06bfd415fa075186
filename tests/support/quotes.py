"""The typed answer of the typed-output tests (reference §11): a quote, one valid answer and
one with two errors."""

from __future__ import annotations

from pydantic import BaseModel, Field


class Line(BaseModel):
    sku: str
    quantity: int = Field(gt=0)


class Quote(BaseModel):
    account_id: str
    lines: list[Line]
    total: float


VALID = {"account_id": "4471", "lines": [{"sku": "SKU-4411", "quantity": 200}], "total": 950.0}
# Two errors: a constraint deep in a list, and a missing field.
INVALID = {"account_id": "4471", "lines": [{"sku": "SKU-4411", "quantity": 0}]}
