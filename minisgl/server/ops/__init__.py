"""What running the server for many users takes, apart from what lesson 11 teaches (``server/``: the
processes, the HTTP routes, the request schemas): the connection guard against slow and silent clients
(``connections``), the API key check and the request-size limit (``middleware``), the
Prometheus metrics (``metrics``), and data parallelism behind sglang-router (``dp``, its flags in
``router_args``, the front that checks the key before the router: ``front``), and SGLang's spellings of
the flags (``sglang_args``)."""
