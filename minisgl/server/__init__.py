"""The engine as a service: CLI arguments (``args``), process launch and lifecycle (``launch``),
the HTTP API (``api``, ``protocol``), the scheduler process (``scheduler_worker``), and the
terminal chat (``shell``). The tokenizer / detokenizer workers live in ``minisgl.tokenizer``."""
