"""The engine as a service, as lesson 11 reads it: CLI arguments (``args``), process launch and
lifecycle (``launch``), the HTTP API (``app`` builds it from ``errors``, ``frontend``, ``generation``,
``openai_routes`` and ``native_routes``; request schemas in ``protocol``), every worker process's entry
point (``scheduler_worker``, ``tokenizer_worker``, ``detokenizer_worker``), and the terminal chat
(``shell``). What serving many users adds (the connection guard, middleware, metrics, data
parallelism) is in ``ops/``."""
