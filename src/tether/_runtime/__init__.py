"""Carrying runs: the machinery behind the Engine and the Worker (private)."""
