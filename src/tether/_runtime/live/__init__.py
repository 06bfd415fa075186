"""Live output (private): a run's events as they are stored (``events``) and the model's
text as it is written (``deltas``), to the runs' watchers."""
