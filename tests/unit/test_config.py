"""Settings read the environment once, at start-up: a malformed value fails there, never
in the middle of a run; the price overrides and the session secret live in Settings."""

from __future__ import annotations

import pytest

from tether.config import Settings
from tether.errors import ConfigError
from tether.models.base import Usage
from tether.models.pricing import PRICES, parse_prices, spend_usd

MILLION_IN = Usage(input_tokens=1_000_000, output_tokens=0)


@pytest.mark.parametrize(
    "raw",
    [
        "not json",
        '["gpt-4o", 1, 2]',
        '{"gpt-4o": 3}',
        '{"gpt-4o": [1]}',
        '{"gpt-4o": ["cheap", 2]}',
        '{"gpt-4o": [-1, 2]}',
        '{"gpt-4o": [NaN, 2]}',
    ],
)
def test_a_malformed_tether_prices_fails_settings_at_start_up(raw: str) -> None:
    with pytest.raises(ConfigError, match="TETHER_PRICES"):
        Settings.from_env({"TETHER_PRICES": raw})


def test_tether_prices_are_parsed_once_into_settings_and_override_the_table() -> None:
    settings = Settings.from_env({"TETHER_PRICES": '{"scripted": [2, 8], "house-model": [3, 9]}'})
    assert settings.prices == {"scripted": (2.0, 8.0), "house-model": (3.0, 9.0)}
    assert spend_usd("scripted", MILLION_IN, settings.prices) == 2.0
    assert spend_usd("house-model", MILLION_IN, settings.prices) == 3.0
    # Without overrides the built-in table applies, unchanged by the settings above.
    assert spend_usd("scripted", MILLION_IN) == PRICES["scripted"][0] == 1.0


def test_no_tether_prices_means_no_overrides() -> None:
    assert Settings.from_env({}).prices == {}
    assert parse_prices("  ") == {}


def test_the_session_secret_comes_from_settings_and_stays_out_of_repr() -> None:
    settings = Settings.from_env({"TETHER_SESSION_SECRET": "s3cret-value"})
    assert settings.session_secret == "s3cret-value"
    assert "s3cret-value" not in repr(settings)
    assert Settings.from_env({"TETHER_SESSION_SECRET": ""}).session_secret is None


@pytest.mark.parametrize(
    "raw",
    [
        "localhost:8000",
        "ftp://tether.example.com",
        "https://",
        "http:///approve",
        "tether.example",
        "http://tether.example:port",
    ],
)
def test_a_public_url_without_http_and_a_host_fails_settings_at_start_up(raw: str) -> None:
    with pytest.raises(ConfigError, match="TETHER_PUBLIC_URL"):
        Settings.from_env({"TETHER_PUBLIC_URL": raw})


def test_the_public_url_is_read_without_its_trailing_slash() -> None:
    settings = Settings.from_env({"TETHER_PUBLIC_URL": "https://tether.example.com/ops/"})
    assert settings.public_url == "https://tether.example.com/ops"
    assert Settings.from_env({}).public_url is None


@pytest.mark.parametrize(("raw", "value"), [("1", True), ("true", True), ("0", False), ("", False)])
def test_logging_approval_links_is_off_unless_asked_for(raw: str, value: bool) -> None:
    assert Settings.from_env({"TETHER_LOG_APPROVAL_LINKS": raw}).log_approval_links is value
    with pytest.raises(ConfigError, match="TETHER_LOG_APPROVAL_LINKS"):
        Settings.from_env({"TETHER_LOG_APPROVAL_LINKS": "sometimes"})
