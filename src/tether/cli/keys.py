"""``tether keys rotate`` (reference §20): every stored value re-sealed under the first key
of ``TETHER_ENCRYPTION_KEYS``, in batches, while workers run. It needs no agent."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer

from tether.cli.shared import IgnoredAgentOpt
from tether.telemetry.logs import configure

if TYPE_CHECKING:
    from tether.engine import Engine

keys_app = typer.Typer(help="The keys stored content is sealed with.", no_args_is_help=True)


@keys_app.command("rotate")
def keys_rotate(
    batch: Annotated[
        int, typer.Option(min=1, max=10_000, help="values re-sealed per transaction")
    ] = 500,
    agent: IgnoredAgentOpt = None,
) -> None:
    """Re-seal every stored value (clear ones too) under the first key of
    TETHER_ENCRYPTION_KEYS, then forget the keys no value needs. Prints
    {"key", "rotated", "retired"}. Safe to run again after an interruption; exits 1 with
    invalid_config naming a key a stored value needs that the list lacks."""
    configure("WARNING")
    from tether.cli.wiring import NO_AGENT, on_engine

    async def run(engine: Engine) -> None:
        done = await engine.operator.rotate_keys(batch=batch)
        print(json.dumps(done.to_json()))

    on_engine(NO_AGENT, run)
