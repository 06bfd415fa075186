"""The settings of a model that is down (reference §5, §10) and the backoff they give."""

from __future__ import annotations

import pytest

from tether._runtime.step.model_failures import backoff_s
from tether.config import Settings
from tether.errors import ConfigError


def test_max_model_attempts_defaults_to_five_and_reads_the_environment() -> None:
    assert Settings.from_env({}).max_model_attempts == 5
    assert Settings.from_env({"TETHER_MAX_MODEL_ATTEMPTS": "3"}).max_model_attempts == 3
    assert Settings.from_env({"TETHER_MAX_MODEL_ATTEMPTS": " "}).max_model_attempts == 5


@pytest.mark.parametrize("raw", ["0", "-2", "1.5", "five"])
def test_max_model_attempts_that_is_not_a_positive_whole_number_is_a_config_error(
    raw: str,
) -> None:
    with pytest.raises(ConfigError, match="TETHER_MAX_MODEL_ATTEMPTS") as caught:
        Settings.from_env({"TETHER_MAX_MODEL_ATTEMPTS": raw})
    assert caught.value.code == "invalid_config"


def test_the_first_model_retry_delay_defaults_to_one_second_and_may_be_set() -> None:
    assert Settings.from_env({}).model_retry_first_s == 1.0
    assert Settings.from_env({"TETHER_MODEL_RETRY_FIRST_S": "0.25"}).model_retry_first_s == 0.25
    assert Settings().model_retry_max_s == 300.0


@pytest.mark.parametrize("raw", ["0", "-1", "soon", "301"])
def test_a_first_model_retry_delay_out_of_range_is_a_config_error(raw: str) -> None:
    with pytest.raises(ConfigError):
        Settings.from_env({"TETHER_MODEL_RETRY_FIRST_S": raw})


def test_backoff_doubles_from_the_first_delay_with_at_most_a_tenth_of_jitter() -> None:
    settings = Settings()
    for attempt, base in [(1, 1.0), (2, 2.0), (3, 4.0), (6, 32.0)]:
        delays = [backoff_s(attempt, settings) for _ in range(50)]
        assert all(base <= d <= base * 1.1 for d in delays), (attempt, delays)


def test_backoff_is_capped_at_five_minutes_however_many_failures() -> None:
    settings = Settings()
    assert backoff_s(10, settings) == 300.0  # 512 s, capped
    assert backoff_s(10_000, settings) == 300.0
    short = Settings(model_retry_first_s=0.01, model_retry_max_s=0.05)
    assert backoff_s(1, short) <= 0.011 and backoff_s(4, short) == 0.05
