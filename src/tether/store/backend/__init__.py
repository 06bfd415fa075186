"""What differs between SQLite and PostgreSQL, and the connection to either: the engine by
URL (``connect``, ``pooling``), the ``Dialect`` and its two backends, the database's clock,
transient faults and settling a cut-off COMMIT, ``LISTEN`` and the notices announced. It
imports no operation part of the store."""
