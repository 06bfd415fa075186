"""What a run tells operators: traces, metrics and structured logs."""
