"""The model runner (minirt/engine/runner.py), through the engine's public path: what each round
feeds the model, row by row."""

import numpy as np

from conftest import make_request, random_model, serve_all
from minirt import SamplingParams
from minirt.engine.engine import Engine
from minirt.engine.runner import ModelRunner


def test_each_rounds_rows_go_in_slot_order_after_a_freed_slot_is_reused(monkeypatch):
    """Continuous batching: the first request ends in round 1, and the third takes its slot 0
    in round 2, after the second (slot 1) in the running list.  The model still sees the rows
    in slot order, so that a full pool is read as one view; each row feeds its own newest
    token (by hand: the third's prompt beside the second's first token, then the third's first
    token beside the second's second)."""
    model = random_model(seed=3, vocab_size=50, n_positions=32)
    engine = Engine(ModelRunner(model), None, batch_size=2, policy="continuous")
    seen = []
    original = model.forward

    def spy(batch, cache):
        rows = np.split(batch.token_ids, np.cumsum(batch.new_lens)[:-1])
        seen.append((batch.slots.tolist(), [row.tolist() for row in rows]))
        return original(batch, cache)

    monkeypatch.setattr(model, "forward", spy)
    lengths = (1, 3, 2)
    made = [
        make_request(
            engine,
            i,
            [10 + i, 20 + i],
            SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0),
        )
        for i, n in enumerate(lengths)
    ]
    for request in made:
        engine.add_request(request)
    while engine.has_unfinished():
        engine.step()
    first, second, third = made
    assert (first.slot, second.slot, third.slot) == (0, 1, 0)
    assert seen[0] == ([0, 1], [[10, 20], [11, 21]])
    assert seen[1] == ([0, 1], [[12, 22], [second.token_ids[0]]])
    assert seen[2] == ([0, 1], [[third.token_ids[0]], [second.token_ids[1]]])
    assert len(seen) == 3
    assert all(slots == sorted(slots) for slots, _ in seen)


def test_the_kv_budget_counts_kv_heads_not_query_heads():
    """One position costs keys and values in every layer for each K/V head: with 8 query heads
    sharing 2 K/V heads (grouped-query attention), 2 * 3 layers * 2 heads * 16 dims * 4 bytes =
    768 bytes, a quarter of what 8 K/V heads would cost."""
    from types import SimpleNamespace

    import numpy as np

    config = SimpleNamespace(
        n_layer=3,
        n_head=8,
        n_kv_head=2,
        head_dim=16,
        n_positions=64,
        vocab_size=100,
        eos_token_id=None,
        bos_token_id=None,
        eos_token_ids=(),
    )
    runner = ModelRunner(SimpleNamespace(config=config, dtype=np.dtype(np.float32)))
    assert runner.kv_bytes_per_position == 2 * 3 * 2 * 16 * 4 == 768
    assert runner.n_positions == 64 and runner.eos_token_ids == ()


def test_a_tokenizers_eos_stops_a_request_where_the_config_has_none():
    """A config without an EOS (the fixture's eos_token_id is None) and a tokenizer whose EOS is
    the token the model picks first: with the tokenizer, the request stops there after one
    token; without it, nothing stops it before max_new_tokens."""
    model = random_model(seed=4, vocab_size=50, n_positions=32)
    assert model.config.eos_token_id is None
    params = SamplingParams(max_tokens=4, temperature=0.0)
    alone = make_request(Engine(ModelRunner(model), None), 0, [1, 2], params)
    serve_all(Engine(ModelRunner(model), None), [alone])
    assert alone.finish_reason == "length" and len(alone.token_ids) == 4
    first = alone.token_ids[0]

    class Detokenizer:
        eos_token_id = first
        eos_token_ids = (first,)

        def decode(self, token_ids):
            return ""

        def stream(self, prompt_ids=()):
            return None

    engine = Engine(ModelRunner(model), Detokenizer())
    stopped = make_request(Engine(ModelRunner(model), None), 0, [1, 2], params)
    serve_all(engine, [stopped])
    assert stopped.token_ids == [first] and stopped.finish_reason == "stop"
