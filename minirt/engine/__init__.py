"""The engine: requests in, one round at a time, results out.

    params.py     SamplingParams: what a request asks for
    request.py    Request: one request's own state, and its stop rules; Refusal, as values
    scheduler.py  who runs in each round: static groups, or continuous batching (and how much
                  of each prompt a round feeds: chunked prefill); it owns the KV owner
    kv_manager.py KVManager: the KV budget, the KV cache allocated now and its slots, and the
                  prefix cache's share of the budget
    prefix_cache.py  PrefixCache: prompt prefixes' keys and values, kept for later requests
    sampler.py    each request's next token, from its own logits and its own random stream
    engine.py     Engine: add_request(s), step (one round), abort, and the offline loop over step
    client.py     EngineClient: the engine's own thread, the small interface a server talks to
    stats.py      RunStats: what a run counted
    output.py     RequestOutput, CompletionOutput and TokenEvent: what a caller is handed
    round_record.py  RoundRecord: what one round did, row by row, for a round grid

Must not know: command-line flags, files or output formats (tests/test_layout.py holds this).
"""
