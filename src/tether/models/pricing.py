"""Prices per million tokens, so spend can be computed from reported usage.

A model the table does not know uses ``DEFAULT_PRICE`` and is logged once, so budgets
always apply (SPEC §6). ``TETHER_PRICES`` (JSON ``{"model": [in, out]}``) overrides.
"""

from __future__ import annotations

import json
import logging
import os
import threading

from tether.errors import ConfigError
from tether.models.base import Usage

log = logging.getLogger(__name__)

# USD per million tokens: (input, output).
PRICES: dict[str, tuple[float, float]] = {
    "gpt-4o": (2.50, 10.00),
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4.1": (2.00, 8.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-5": (1.25, 10.00),
    "gpt-5-mini": (0.25, 2.00),
    "claude-sonnet-4-5": (3.00, 15.00),
    "claude-opus-4-1": (15.00, 75.00),
    "claude-haiku-4-5": (1.00, 5.00),
    # The scripted test model has a price so that spend budgets are exercised.
    "scripted": (1.00, 4.00),
}
DEFAULT_PRICE: tuple[float, float] = (5.00, 15.00)

_warned: set[str] = set()
_warned_lock = threading.Lock()


def _overrides() -> dict[str, tuple[float, float]]:
    raw = os.environ.get("TETHER_PRICES")
    if not raw:
        return {}
    try:
        data = json.loads(raw)
        return {str(k): (float(v[0]), float(v[1])) for k, v in data.items()}
    except (ValueError, TypeError, IndexError, AttributeError) as exc:
        raise ConfigError(
            'TETHER_PRICES must be JSON like {"model": [usd_per_mtok_in, usd_per_mtok_out]}'
        ) from exc


def price_for(model: str) -> tuple[float, float]:
    """The (input, output) USD per million tokens for ``model``; the default if unknown."""
    table = {**PRICES, **_overrides()}
    if model in table:
        return table[model]
    with _warned_lock:
        if model not in _warned:
            _warned.add(model)
            log.warning(
                "no price for model, using the default",
                extra={"action": "price_default", "model": model, "price": DEFAULT_PRICE},
            )
    return DEFAULT_PRICE


def spend_usd(model: str, usage: Usage) -> float:
    """USD spent by one call of ``model`` with ``usage``."""
    price_in, price_out = price_for(model)
    return (usage.input_tokens * price_in + usage.output_tokens * price_out) / 1_000_000
