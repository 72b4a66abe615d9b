"""The engine as a service: CLI arguments (``args``), process launch and lifecycle (``launch``),
the HTTP API (``app`` builds it from ``errors``, ``middleware``, ``frontend``, ``generation``,
``openai_routes`` and ``native_routes``; request schemas in ``protocol``), the scheduler process
(``scheduler_worker``), and the terminal chat (``shell``). The tokenizer / detokenizer workers
live in ``minisgl.tokenizer``."""
