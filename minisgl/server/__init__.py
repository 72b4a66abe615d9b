"""The engine as a service: CLI arguments (``args``), process launch and lifecycle (``launch``),
the HTTP API (``app`` builds it from ``errors``, ``middleware``, ``frontend``, ``generation``,
``openai_routes`` and ``native_routes``; request schemas in ``protocol``), every worker process's
entry point (``scheduler_worker``, ``tokenizer_worker``, ``detokenizer_worker``), and the terminal
chat (``shell``)."""
