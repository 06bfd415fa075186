"""The store's schema and statements, built once at import: the tables, the step path's
statements (``steps``), the claims' conditions and order (``claims``, ``claim_order``,
``fair_pick``), the state changes (``transitions``), a run's snapshot. It imports no
operation part of the store."""
