"""The demo: a sandbox CRM (``sandbox/``), a sales agent whose tools call it (``agent``),
its users, and the story ``tether demo`` tells (``story``). It imports tether; tether's
core never imports it (the CLI names ``tether.demo.agent:build_agent`` as its default)."""
