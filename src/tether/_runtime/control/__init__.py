"""Acting on runs from outside their loop (private): creating a run (validated, scoped,
idempotent), its owner's continue and cancel, and forks. The Engine calls these."""
