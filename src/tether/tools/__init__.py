"""Tools: ``Tool`` and ``@tool`` declared from typed Python functions (``tool.py``), their
timeouts (``_timeouts.py``), and arguments described by a JSON schema (``json_schema.py``).
The names a user types are exported by ``tether`` itself."""
