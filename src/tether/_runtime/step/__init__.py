"""The step (private): one claimed run carried to its next stop. The loop, the run's
session (lease, messages, budget), one tool call from resolution to reconciliation, the
calls of a turn that run together, suspending a turn and carrying out its decisions,
dry runs, compaction, a failed model call and a run's turn at the model's rate."""
