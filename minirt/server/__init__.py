"""`minirt serve`: an OpenAI-compatible HTTP server (the `serve` extra), the only part of minirt
that imports the web stack.

    protocol.py     the request bodies (pydantic), checked, and each prompt's SamplingParams
    handover.py     completions to the engine's client (minirt/engine/client.py, the one
                    interface to the engine) and its events back; refusals worded as HTTP errors
    completion_flow.py  a completion's way once its choices are made, for both generating
                    routes: the answer awaited, the client watched, whole or streamed
    responses.py    completions in OpenAI's shapes, whole or as server-sent events
    chat.py         POST /v1/chat/completions: a conversation rendered, encoded and served
    chat_responses.py  chat completions in OpenAI's shapes, whole or streamed
    metrics.py      Prometheus metrics, in vLLM's names with a `minirt:` prefix
    api_errors.py   OpenAI's error object
    app.py          the routes (Starlette), the API key, the body limit
    run.py          the socket, uvicorn, signals and the graceful shutdown

The command line is minirt/serve.py.
"""
