"""``python -m tether``: the CLI."""

from __future__ import annotations

from tether.cli.app import main

main()
