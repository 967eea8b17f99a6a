"""`minirt serve`: an OpenAI-compatible HTTP server (the `serve` extra), the only part of minirt
that imports the web stack.

    protocol.py     the request bodies (pydantic), checked, and each prompt's SamplingParams
    engine_loop.py  the engine's own thread, and how requests and tokens cross to the handlers
    responses.py    completions in OpenAI's shapes, whole or as server-sent events
    metrics.py      Prometheus metrics, in vLLM's names with a `minirt:` prefix
    api_errors.py   OpenAI's error object
    app.py          the routes (Starlette), the API key, the body limit
    run.py          the socket, uvicorn, signals and the graceful shutdown

The command line is minirt/serve.py.
"""
