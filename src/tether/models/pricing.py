"""Prices per million tokens, so spend can be computed from reported usage.

A model the table does not know uses ``DEFAULT_PRICE`` and is logged once, so budgets
always apply (reference §6). ``TETHER_PRICES`` (JSON ``{"model": [in, out]}``) is parsed once,
by ``Settings.from_env`` with ``parse_prices``, into ``Settings.prices``: the overrides a
caller passes as ``prices``.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Mapping

from tether.errors import ConfigError
from tether.models.base import Usage

log = logging.getLogger(__name__)

Price = tuple[float, float]

# USD per million tokens: (input, output).
PRICES: dict[str, Price] = {
    "gpt-4o": (2.50, 10.00),
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4.1": (2.00, 8.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-5": (1.25, 10.00),
    "gpt-5-mini": (0.25, 2.00),
    "claude-sonnet-4-5": (3.00, 15.00),
    "claude-opus-4-1": (15.00, 75.00),
    "claude-haiku-4-5": (1.00, 5.00),
    # Gemini's prices for prompts up to 200k tokens (longer ones cost more: spend errs low).
    "gemini-2.5-pro": (1.25, 10.00),
    "gemini-2.5-flash": (0.30, 2.50),
    "gemini-2.5-flash-lite": (0.10, 0.40),
    "gemini-3-pro-preview": (2.00, 12.00),
    # The scripted test model has a price so that spend budgets are exercised.
    "scripted": (1.00, 4.00),
}
DEFAULT_PRICE: Price = (5.00, 15.00)

_SHAPE = 'TETHER_PRICES must be JSON like {"model": [usd_per_mtok_in, usd_per_mtok_out]}'

_warned: set[str] = set()
_warned_lock = threading.Lock()


def parse_prices(raw: str) -> dict[str, Price]:
    """The price overrides in ``raw`` (``TETHER_PRICES``); ``ConfigError`` if malformed, so
    a typo fails at start-up rather than at a run's first model call."""
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
        table = {str(k): (float(v[0]), float(v[1])) for k, v in data.items()}
    except (ValueError, TypeError, IndexError, KeyError, AttributeError) as exc:
        raise ConfigError(f"{_SHAPE}, got {raw!r}") from exc
    for model, price in table.items():
        if not all(math.isfinite(p) and p >= 0 for p in price):
            raise ConfigError(f"{_SHAPE}: the prices of {model!r} must be non-negative numbers")
    return table


def price_for(
    model: str, prices: Mapping[str, Price] | None = None, *, entry: str | None = None
) -> Price:
    """The (input, output) USD per million tokens for ``model``: ``prices`` (the configured
    overrides) first, by the model's ``entry`` in ``TETHER_MODEL`` (``openai:gpt-4.1``,
    reference §21) and then by its name, then the built-in table, then the default (logged
    once)."""
    overrides = prices or {}
    found = (overrides.get(entry) if entry else None) or overrides.get(model) or PRICES.get(model)
    if found is not None:
        return found
    with _warned_lock:
        if model not in _warned:
            _warned.add(model)
            log.warning(
                "no price for model, using the default",
                extra={"action": "price_default", "model": model, "price": DEFAULT_PRICE},
            )
    return DEFAULT_PRICE


def spend_usd(
    model: str,
    usage: Usage,
    prices: Mapping[str, Price] | None = None,
    *,
    entry: str | None = None,
) -> float:
    """USD spent by one call of ``model`` (the ``entry`` of ``TETHER_MODEL`` that named
    it, if known) with ``usage``, at ``prices`` (the configured overrides,
    ``Settings.prices``) over the built-in table."""
    price_in, price_out = price_for(model, prices, entry=entry)
    return (usage.input_tokens * price_in + usage.output_tokens * price_out) / 1_000_000
