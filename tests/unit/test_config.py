"""Settings read the environment once, at start-up: a malformed value fails there, never
in the middle of a run; the price overrides and the session secret live in Settings."""

from __future__ import annotations

import pytest

from tether.budget import Limits
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


def test_tether_max_limits_is_the_cap_of_every_run_and_defaults_to_the_continuation_cap() -> None:
    assert Settings.from_env({}).max_limits == Limits(
        max_steps=200, max_spend_usd=50.0, max_tool_calls=400, max_elapsed_ms=86_400_000
    )
    settings = Settings.from_env(
        {"TETHER_MAX_LIMITS": '{"max_steps": 10, "max_spend_usd": 0.5, "max_elapsed_ms": 3600000}'}
    )
    # A limit it does not name keeps its default cap.
    assert settings.max_limits == Limits(
        max_steps=10, max_spend_usd=0.5, max_tool_calls=400, max_elapsed_ms=3_600_000
    )
    # The default limits of a new run are lowered to the cap where it is lower.
    assert settings.default_limits == Limits(max_steps=10, max_spend_usd=0.5)


@pytest.mark.parametrize(
    "raw",
    [
        "not json",
        "[200]",
        '{"max_step": 200}',
        '{"max_steps": 0}',
        '{"max_steps": "200"}',
        '{"max_steps": true}',
        '{"max_spend_usd": -1}',
        '{"max_spend_usd": NaN}',
        '{"max_steps": 2.5}',
    ],
)
def test_a_malformed_tether_max_limits_fails_settings_at_start_up(raw: str) -> None:
    with pytest.raises(ConfigError, match="TETHER_MAX_LIMITS"):
        Settings.from_env({"TETHER_MAX_LIMITS": raw})


def test_the_model_rate_limits_are_positive_whole_numbers_or_unset() -> None:
    settings = Settings.from_env({"TETHER_MODEL_RPM": "300", "TETHER_MODEL_TPM": " "})
    assert settings.model_rpm == 300 and settings.model_tpm is None
    assert Settings.from_env({}).model_rpm is None
    assert Settings.from_env({"TETHER_MODEL_RATE_WINDOW_S": "2.5"}).model_rate_window_s == 2.5


@pytest.mark.parametrize("raw", ["0", "-5", "1.5", "many"])
@pytest.mark.parametrize("name", ["TETHER_MODEL_RPM", "TETHER_MODEL_TPM"])
def test_a_bad_model_rate_limit_fails_settings_at_start_up(name: str, raw: str) -> None:
    with pytest.raises(ConfigError, match=name):
        Settings.from_env({name: raw})


def test_a_model_rate_limit_set_in_code_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="model_tpm"):
        Settings(model_tpm=0)


def test_tether_max_priority_is_a_whole_number_from_minus_10_to_10_default_0() -> None:
    assert Settings.from_env({}).max_priority == 0
    assert Settings.from_env({"TETHER_MAX_PRIORITY": "-10"}).max_priority == -10
    assert Settings.from_env({"TETHER_MAX_PRIORITY": " 10 "}).max_priority == 10
    for raw in ("11", "-11", "1.5", "high"):
        with pytest.raises(ConfigError, match="TETHER_MAX_PRIORITY"):
            Settings.from_env({"TETHER_MAX_PRIORITY": raw})
    with pytest.raises(ConfigError, match="max_priority"):
        Settings(max_priority=11)


def test_no_proxy_is_trusted_unless_listed_and_the_list_is_normalised() -> None:
    assert Settings.from_env({}).trusted_proxies == ()
    listed = " 10.0.0.5, 10.0.0.0/8 ,fd00::/8,::1,10.0.0.5/32,"
    assert Settings.from_env({"TETHER_TRUSTED_PROXIES": listed}).trusted_proxies == (
        "10.0.0.5",
        "10.0.0.0/8",
        "fd00::/8",
        "::1",
    )


@pytest.mark.parametrize("entry", ["proxy.local", "*", "10.0.0.300", "10.0.0.1/8", "::1/129"])
def test_a_malformed_trusted_proxy_fails_settings_at_start_up_naming_it(entry: str) -> None:
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"TETHER_TRUSTED_PROXIES": f"10.0.0.5,{entry}"})
    assert refused.value.code == "invalid_config"
    assert f"TETHER_TRUSTED_PROXIES: {entry!r}" in refused.value.message


def test_streams_per_user_are_a_positive_whole_number_100_by_default() -> None:
    assert Settings.from_env({}).max_streams_per_user == 100
    assert Settings.from_env({"TETHER_MAX_STREAMS_PER_USER": "3"}).max_streams_per_user == 3
    for raw in ("0", "-1", "many", "2.5"):
        with pytest.raises(ConfigError, match="TETHER_MAX_STREAMS_PER_USER"):
            Settings.from_env({"TETHER_MAX_STREAMS_PER_USER": raw})
    with pytest.raises(ConfigError, match="max_streams_per_user"):
        Settings(max_streams_per_user=0)
