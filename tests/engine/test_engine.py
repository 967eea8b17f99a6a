"""The static-group engine: rounds, independent stopping, batch invariance, bad requests among good ones."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import FIXTURES, FIXTURE_NAMES, load_expected, make_request, random_model, serve_all
from minirt import LLM, SamplingParams
from minirt.engine.engine import Engine
from minirt.engine.runner import ModelRunner
from minirt.llm import run_steps
from minirt.errors import RequestError
from minirt.engine.sampler import log_softmax
from conftest import completions


def engine_for(model, batch_size, tokenizer=None, **kw):
    return Engine(ModelRunner(model), tokenizer, batch_size=batch_size, **kw)


def serve(engine, prompts, params, run_seed=0, logprobs=False):
    if isinstance(params, SamplingParams):
        params = [params] * len(prompts)
    requests = [
        make_request(engine, i, p, sp, run_seed=run_seed, want_logprobs=logprobs)
        for i, (p, sp) in enumerate(zip(prompts, params, strict=True))
    ]
    stats = serve_all(engine, requests)
    return requests, stats


@pytest.fixture(scope="module")
def model():
    return random_model(seed=11, vocab_size=60, n_positions=32)


# ------------------------------------------------------------------ the seed's exercise


def test_seed_exercise_static_group_of_three(model, monkeypatch):
    """Output lengths 2, 5 and 8 in a group of 3, then a fourth request."""
    engine = engine_for(model, batch_size=3)
    calls = []  # how many rows each forward pass really ran
    original = model.forward

    def spy(inputs, cache):
        calls.append(inputs.batch_size)
        return original(inputs, cache)

    monkeypatch.setattr(model, "forward", spy)
    params = [SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0) for n in (2, 5, 8, 4)]
    requests, stats = serve(engine, [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10]], params)
    first, fourth = stats.groups[0], requests[3]
    assert (first.first_round, first.last_round) == (1, 8)
    assert first.active_rows == [3, 3, 2, 2, 2, 1, 1, 1]
    assert calls[:8] == [3, 3, 2, 2, 2, 1, 1, 1]  # finished rows really left the compute
    assert [len(r.token_ids) for r in requests] == [2, 5, 8, 4]
    assert [(r.first_round, r.finish_round) for r in requests[:3]] == [(1, 2), (1, 5), (1, 8)]
    assert (
        fourth.rounds_waited == 8
        and fourth.first_round == 9
        and fourth.finish_round == 12
        and fourth.group == 2
    )
    assert stats.rounds == 12 and stats.utilization == pytest.approx(
        (15 + 4) / (3 * 8 + 1 * 4)
    )  # held rows


@settings(max_examples=30, deadline=None)
@given(lengths=st.lists(st.integers(1, 9), min_size=1, max_size=9), batch_size=st.integers(1, 4))
def test_rounds_are_set_by_each_groups_longest_member(model, lengths, batch_size):
    engine = engine_for(model, batch_size)
    params = [SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0) for n in lengths]
    requests, stats = serve(engine, [[i % 50 + 1] for i in range(len(lengths))], params)
    groups = [lengths[i : i + batch_size] for i in range(0, len(lengths), batch_size)]
    assert stats.rounds == sum(max(g) for g in groups)
    round_offset = 0
    for g, group_lengths in enumerate(groups):
        for j, n in enumerate(group_lengths):
            r = requests[g * batch_size + j]
            assert (r.group, r.first_round, r.finish_round, r.rounds_waited) == (
                g + 1,
                round_offset + 1,
                round_offset + n,
                round_offset,
            )
        round_offset += max(group_lengths)


# ------------------------------------------------------------------ batch invariance


params_strategy = st.builds(
    SamplingParams,
    max_new_tokens=st.integers(1, 8),
    temperature=st.sampled_from([0.0, 0.0, 0.7, 1.3]),
    top_k=st.sampled_from([0, 0, 3, 10]),
    top_p=st.sampled_from([1.0, 1.0, 0.9, 0.5]),
    seed=st.one_of(st.none(), st.integers(0, 2**32)),
    stop_token_ids=st.lists(st.integers(0, 59), max_size=2).map(tuple),
    ignore_eos=st.booleans(),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prompts=st.lists(st.lists(st.integers(0, 59), min_size=0, max_size=12), min_size=1, max_size=7),
    data=st.data(),
)
def test_a_requests_tokens_do_not_depend_on_its_batch(model, prompts, data):
    """Alone, in batches of several sizes, and shuffled: every request produces the same tokens."""
    params = [data.draw(params_strategy) for _ in prompts]
    alone = {}
    for i, (prompt, sp) in enumerate(zip(prompts, params, strict=True)):
        request = make_request(engine_for(model, 1), i, prompt, sp, run_seed=3)
        serve_all(engine_for(model, 1), [request])
        alone[i] = request.token_ids
    for batch_size in (2, 3, 7):
        order = data.draw(st.permutations(range(len(prompts))))
        engine = engine_for(model, batch_size)
        requests = [make_request(engine, i, prompts[i], params[i], run_seed=3) for i in order]
        serve_all(engine, requests)
        for request in requests:
            assert request.token_ids == alone[request.index], (batch_size, request.index)


def test_same_prompt_and_seed_give_the_same_tokens_in_one_batch(model):
    sp = SamplingParams(temperature=1.0, seed=42, max_tokens=12)
    requests, _ = serve(engine_for(model, 4), [[5, 6, 7], [1], [5, 6, 7], [2, 3]], sp)
    assert requests[0].token_ids == requests[2].token_ids
    other_seed, _ = serve(
        engine_for(model, 4),
        [[5, 6, 7]],
        SamplingParams(temperature=1.0, seed=43, max_tokens=12),
    )
    assert other_seed[0].token_ids != requests[0].token_ids


# ------------------------------------------------------------------ stopping, per request


def test_eos_stops_only_its_own_request_and_ignore_eos_goes_on(model):
    engine = engine_for(model, 3)
    probe, _ = serve(
        engine, [[9, 9]], SamplingParams(max_tokens=6, ignore_eos=True, temperature=0.0)
    )
    eos = probe[0].token_ids[2]  # make the third token this request produces the EOS
    engine.eos_token_id = eos
    requests, stats = serve(
        engine,
        [[9, 9], [9, 9], [1, 2]],
        [
            SamplingParams(max_tokens=6, temperature=0.0),
            SamplingParams(max_tokens=6, ignore_eos=True, temperature=0.0),
            SamplingParams(max_tokens=6, ignore_eos=True, temperature=0.0),
        ],
    )
    stopped, kept_going, peer = requests
    first_eos = probe[0].token_ids.index(eos)
    assert (
        stopped.finish_reason == "stop" and stopped.token_ids == probe[0].token_ids[: first_eos + 1]
    )
    assert kept_going.finish_reason == "length" and kept_going.token_ids == probe[0].token_ids
    assert len(peer.token_ids) == 6 and stats.rounds == 6


def test_stop_token_ids(model):
    engine = engine_for(model, 2)
    probe, _ = serve(
        engine, [[3, 4, 5]], SamplingParams(max_tokens=8, ignore_eos=True, temperature=0.0)
    )
    target = probe[0].token_ids[4]
    requests, _ = serve(
        engine,
        [[3, 4, 5]],
        SamplingParams(max_tokens=8, ignore_eos=True, stop_token_ids=(target,), temperature=0.0),
    )
    cut = probe[0].token_ids.index(target) + 1
    assert requests[0].token_ids == probe[0].token_ids[:cut] and requests[0].finish_reason == "stop"


def test_context_full_finishes_with_length(model):
    n_positions = model.config.n_positions  # 32
    requests, _ = serve(
        engine_for(model, 3),
        [list(range(30)), list(range(32)), [1]],
        SamplingParams(max_tokens=10, ignore_eos=True, temperature=0.0),
    )
    assert (
        len(requests[0].token_ids) == 2 and requests[0].finish_reason == "length"
    )  # 30 + 2 = 32 positions
    # A full prompt still gets one token.
    assert len(requests[1].token_ids) == 1 and requests[1].finish_reason == "length"
    assert len(requests[2].token_ids) == 10
    # Every token but the last is fed back, and each fed token needs a position.
    assert all(r.prompt_len + len(r.token_ids) - 1 <= n_positions for r in requests)
    engine = engine_for(model, 3)
    serve(
        engine, [list(range(30))], SamplingParams(max_tokens=10, ignore_eos=True, temperature=0.0)
    )
    assert engine.kv_cache is None and engine.free_slots == []  # released after the group


def test_a_bad_request_gets_its_own_error_and_peers_are_unchanged(model):
    good = [[1, 2, 3], [4, 5]]
    sp = SamplingParams(max_tokens=5, ignore_eos=True, temperature=0.0)
    clean, _ = serve(engine_for(model, 3), good, sp)
    mixed, stats = serve(engine_for(model, 3), [good[0], list(range(33)), [99], good[1]], sp)
    assert mixed[1].error and "more than the model's context of 32" in mixed[1].error
    assert mixed[1].finish_reason == "error"
    assert mixed[2].error and "outside the vocabulary" in mixed[2].error
    assert mixed[0].token_ids == clean[0].token_ids and mixed[3].token_ids == clean[1].token_ids
    assert stats.failed == 2 and len(stats.groups) == 1


def test_empty_prompt_starts_from_bos(model):
    from minirt.request_maker import RequestMaker

    c = model.config
    maker = RequestMaker(None, c.vocab_size, c.n_positions, bos_token_id=7)
    params = SamplingParams(max_tokens=4, ignore_eos=True, temperature=0.0)
    empty, explicit = maker.make(0, [], params), maker.make(0, [7], params)
    serve_all(engine_for(model, 2), [empty])
    serve_all(engine_for(model, 2), [explicit])
    assert empty.prompt_ids == [7] and empty.token_ids == explicit.token_ids


def test_kv_budget_limits_the_group_and_refuses_what_can_never_fit(model):
    engine = engine_for(model, batch_size=3)
    sp = SamplingParams(
        max_tokens=4, ignore_eos=True, temperature=0.0
    )  # 2-token prompts need 5 positions each
    engine.kv_budget_positions = 10  # room for two such slots, not three
    requests, stats = serve(engine, [[1, 2], [3, 4], [5, 6]], sp)
    assert [len(g.members) for g in stats.groups] == [2, 1]
    assert requests[2].rounds_waited == 4
    big, stats = serve(engine, [[1, 2], list(range(20)), [5, 6]], sp)  # 23 positions > budget alone
    assert big[1].error and "KV cache" in big[1].error
    assert big[0].token_ids == requests[0].token_ids and big[2].token_ids == requests[2].token_ids


def test_logprobs_are_the_raw_models_log_softmax(model):
    requests, _ = serve(
        engine_for(model, 2),
        [[1, 2, 3], [4]],
        SamplingParams(temperature=1.0, top_k=5, max_tokens=6, ignore_eos=True),
        logprobs=True,
    )
    for r in requests:
        full = model.logits([r.prompt_ids + r.token_ids])[0]  # [len, V], independent full recompute
        want = [
            float(log_softmax(full[r.prompt_len - 1 + k])[t]) for k, t in enumerate(r.token_ids)
        ]
        assert np.allclose(r.logprobs, want, atol=1e-4)


# ------------------------------------------------------------------ against transformers


@pytest.mark.parametrize("name", [n for n in FIXTURE_NAMES if "greedy_0" in load_expected(n)])
def test_engine_greedy_matches_transformers(name):
    expected = load_expected(name)
    prompts = [expected[f"prompt_{g}"].tolist() for g in range(2)]
    llm = LLM(FIXTURES / name, batch_size=2)
    outputs = completions(
        llm.generate(prompts, SamplingParams(max_tokens=32, ignore_eos=True, temperature=0.0))
    )
    for g, out in enumerate(outputs):
        assert out.token_ids == expected[f"greedy_{g}"].tolist()


# ------------------------------------------------------------------ text, stop strings, tokenizer


def test_stop_string_spanning_tokens_cuts_the_text(tiny_lm):
    llm = LLM(tiny_lm, batch_size=2)
    tok = llm.tokenizer
    prompt = "To be, or not"
    probe = completions(
        llm.generate([prompt], SamplingParams(max_tokens=24, ignore_eos=True, temperature=0.0))
    )[0]
    pieces = [tok.decode([t]) for t in probe.token_ids]
    spans = [
        i
        for i in range(len(pieces) - 1)
        if pieces[i].isascii()
        and pieces[i + 1].isascii()
        and pieces[i].strip()
        and pieces[i + 1].strip()
    ]
    assert spans, f"need two printable neighbouring tokens in {pieces}"
    i = spans[0]
    stop = pieces[i][-1] + pieces[i + 1][0]  # straddles the boundary between token i and i+1
    full = tok.decode(probe.token_ids)
    finish_at = next(
        k for k in range(1, len(probe.token_ids) + 1) if stop in tok.decode(probe.token_ids[:k])
    )
    out, peer = completions(
        llm.generate(
            [prompt, "Shall I"],
            [
                SamplingParams(
                    max_tokens=24, ignore_eos=True, stop=["zzz-never", stop], temperature=0.0
                ),
                SamplingParams(max_tokens=24, ignore_eos=True, temperature=0.0),
            ],
        )
    )
    assert out.finish_reason == "stop" and out.text == full[: full.find(stop)]
    assert out.token_ids == probe.token_ids[:finish_at] and out.finish_round == finish_at
    assert len(peer.token_ids) == 24  # the peer did not stop with it


def test_text_is_the_decoded_tokens_and_eos_text_is_left_out(tiny_lm):
    llm = LLM(tiny_lm, batch_size=3)
    outs = completions(
        llm.generate(
            ["All the world", "", "Café"], SamplingParams(max_tokens=16, temperature=1.0, seed=5)
        )
    )
    for out in outs:
        produced = [t for t in out.token_ids if t != llm.tokenizer.eos_token_id]
        assert out.text == llm.tokenizer.decode(produced)
        if out.finish_reason == "stop":
            assert out.token_ids[-1] == llm.tokenizer.eos_token_id
    assert outs[1].prompt_token_ids == [llm.tokenizer.bos_token_id]


def test_stop_strings_need_a_tokenizer():
    llm = LLM(FIXTURES / "base")
    out = completions(
        llm.generate([[1, 2]], SamplingParams(stop=["x"], temperature=0.0, max_tokens=64))
    )[0]
    assert out.finish_reason == "error" and "tokenizer" in out.error


def test_continuous_pool_stays_within_the_kv_budget(model, monkeypatch):
    engine = Engine(ModelRunner(model), None, batch_size=8, policy="continuous")
    engine.kv_budget_positions = 12  # two rows of the longest need (6 positions)
    sizes = []
    original = model.new_kv_cache
    monkeypatch.setattr(
        model,
        "new_kv_cache",
        lambda n_slots, capacity: sizes.append((n_slots, capacity)) or original(n_slots, capacity),
    )
    sp = SamplingParams(max_tokens=4, ignore_eos=True, temperature=0.0)
    requests = [make_request(engine, i, [1, 2, 3], sp) for i in range(5)]
    stats = serve_all(engine, requests)
    assert sizes == [(2, 6)] and all(len(r.token_ids) == 4 for r in requests)
    assert max(stats.active_rows_per_round) == 2


def test_a_vanishing_temperature_is_greedy(model):
    greedy, _ = serve(
        engine_for(model, 1),
        [[1, 2]],
        SamplingParams(max_tokens=5, ignore_eos=True, temperature=0.0),
    )
    tiny, _ = serve(
        engine_for(model, 1),
        [[1, 2]],
        SamplingParams(max_tokens=5, ignore_eos=True, temperature=1e-300),
    )
    assert tiny[0].token_ids == greedy[0].token_ids


# ------------------------------------------------------------------ the redesign's promises


@pytest.mark.parametrize(
    "policy, want_rows, want_line",
    [
        ("static", [2], "kv budget    held 1 group below 3 rows (rows: 2)"),
        ("continuous", [2], "kv budget    held the pool to 2 of 3 rows"),
    ],
)
def test_a_kv_cap_on_the_rows_is_reported(model, policy, want_rows, want_line):
    """Three 2-token prompts wanting 4 tokens need 5 positions each; a 10-position budget holds 2 rows."""
    from minirt.cli.summary import summary

    engine = engine_for(model, batch_size=3, policy=policy)
    engine.kv_budget_positions = 10
    requests, stats = serve(
        engine,
        [[1, 2], [3, 4], [5, 6]],
        SamplingParams(max_tokens=4, ignore_eos=True, temperature=0.0),
    )
    assert stats.kv_limited_rows == want_rows and max(stats.active_rows_per_round) == 2
    assert want_line in summary(stats, 0.0)
    roomy, stats = serve(
        engine_for(model, batch_size=3, policy=policy),
        [[1, 2], [3, 4], [5, 6]],
        SamplingParams(max_tokens=4, ignore_eos=True, temperature=0.0),
    )
    assert stats.kv_limited_rows == [] and "kv budget" not in summary(stats, 0.0)
    assert [r.token_ids for r in roomy] == [r.token_ids for r in requests]
    few = engine_for(
        model, batch_size=8, policy=policy
    )  # the budget holds 2 rows, but only 2 requests exist
    few.kv_budget_positions = 10
    _, stats = serve(
        few, [[1, 2], [3, 4]], SamplingParams(max_tokens=4, ignore_eos=True, temperature=0.0)
    )
    assert stats.kv_limited_rows == [] and "kv budget" not in summary(stats, 0.0)


@pytest.mark.parametrize("policy", ["static", "continuous"])
def test_submit_only_queues(model, policy):
    """refusal() and submit() change neither the request nor the scheduler's limits."""
    from minirt.engine.scheduler import SCHEDULERS

    scheduler = SCHEDULERS[policy](4, 12, model.config.n_positions, 3)
    fits, too_big = (
        make_request(
            Engine(ModelRunner(model), None), i, p, SamplingParams(max_tokens=n, temperature=0.0)
        )
        for i, (p, n) in enumerate([([1, 2], 3), ([1, 2, 3], 20)])
    )
    assert scheduler.refusal(fits) is None and "KV cache positions" in str(
        scheduler.refusal(too_big)
    )
    for request in (fits, too_big):
        scheduler.submit(request)
    assert list(scheduler.waiting) == [fits, too_big] and scheduler.max_rows == 4
    assert all(r.status.value == "waiting" and r.error is None for r in (fits, too_big))
    assert (
        getattr(scheduler, "pool", None) is None
    )  # the continuous pool is fixed by the first plan, not by submit


def test_the_continuous_pool_grows_for_a_longer_request_that_comes_later(model):
    from minirt.engine.scheduler import ContinuousScheduler, KVShape

    scheduler = ContinuousScheduler(4, 100, model.config.n_positions, 50)
    engine = Engine(ModelRunner(model), None)
    # Needs 4 positions: its prompt of 2, and 3 new tokens but the last.
    first = make_request(engine, 0, [1, 2], SamplingParams(max_tokens=3, temperature=0.0))
    scheduler.submit(first)
    # One request waits: one row, as long as its need.
    assert scheduler.plan(1).kv_shape == KVShape(rows=1, capacity=4)
    scheduler.complete(_plan_done(scheduler, 1))
    # Needs 11: within the budget, so it is not refused, though the pool's rows hold 4.
    later = make_request(engine, 1, [1, 2, 3], SamplingParams(max_tokens=9, temperature=0.0))
    assert scheduler.refusal(later) is None
    scheduler.submit(later)
    plan = scheduler.plan(2)
    # Two rows now (one running, one waiting), each as long as the longest need.
    assert plan.kv_shape == KVShape(rows=2, capacity=11)
    assert plan.admitted == [later]


def _plan_done(scheduler, round_number):
    """The plan of a round that ran (its requests still running), as `complete` is given it."""
    from minirt.engine.scheduler import RoundPlan

    return RoundPlan(round_number, list(scheduler.running), [])


def test_an_interrupted_request_is_not_served_again_and_no_kv_cache_is_kept(model):
    engine = engine_for(model, 2)
    requests = [
        make_request(
            engine, i, [1 + i, 2], SamplingParams(max_tokens=6, ignore_eos=True, temperature=0.0)
        )
        for i in range(2)
    ]

    # Ctrl-C after the second round, in the loop over the run's steps.
    with pytest.raises(KeyboardInterrupt):
        with run_steps(engine, requests, "a test's run") as steps:
            for step in steps:
                if step.round_number == 2:
                    raise KeyboardInterrupt
    assert engine.kv_cache is None
    with pytest.raises(RequestError, match="already started running"):
        serve_all(engine, requests)


def test_scoring_never_allocates_a_kv_cache(model, monkeypatch):
    from minirt.model.kv_cache import KVCache

    def refuse_allocation(*args, **kwargs):
        raise AssertionError("scoring allocated a KV cache")

    monkeypatch.setattr(KVCache, "__init__", refuse_allocation)
    assert model.logits([[1, 2, 3], [4]]).shape == (2, 3, 60)


@settings(max_examples=50, deadline=None)
@given(
    rows=st.lists(
        st.lists(st.sampled_from([-1.0, 0.0, 0.5, 2.0]), min_size=5, max_size=5),
        min_size=1,
        max_size=4,
    )
)
def test_the_all_greedy_shortcut_picks_what_each_row_would(rows):
    """The device argmax (only B ids cross) and the per-row host path agree, ties included."""
    from types import SimpleNamespace

    from minirt.engine.sampler import choose_token, choose_tokens

    logits = np.array(rows, dtype=np.float32)
    greedy = [
        SimpleNamespace(
            params=SamplingParams(temperature=0.0, max_tokens=64), rng=None, want_logprobs=False
        )
        for _ in rows
    ]
    got = choose_tokens(random_model().backend, logits, greedy)
    greedy_params = SamplingParams(temperature=0.0, max_tokens=64)
    assert [choice.token for choice in got] == [
        choose_token(row, greedy_params, None, want_logprob=False)[0] for row in logits
    ]
    assert all(choice.logprob is None and choice.top is None for choice in got)


def test_generate_refuses_counts_that_do_not_match_the_prompts():
    """zip would silently drop prompts: ids or params of another length are a ValueError naming them."""
    llm = LLM(FIXTURES / "base")
    for kwargs in (
        {"ids": ["a"]},
        {"sampling_params": [SamplingParams(temperature=0.0, max_tokens=64)] * 3},
    ):
        with pytest.raises(ValueError, match="2 prompts"):
            completions(llm.generate([[1, 2], [3]], **kwargs))


def test_a_slot_left_full_of_nan_by_a_failed_request_cannot_reach_its_next_occupant(tmp_path):
    """A request whose prompt holds a poisoned token fills its slot with NaN keys
    and values and fails; a short request then takes that slot while a longer neighbour keeps running, so the
    window attention reads for it reaches past its own keys into what the failed request left.  Masked, those
    positions still meet `weights @ values` as 0 x NaN = NaN unless the slot was zeroed when it was taken."""
    import shutil

    from safetensors.numpy import load_file, save_file

    folder = tmp_path / "poisoned"
    shutil.copytree(FIXTURES / "untied_head", folder)
    tensors = load_file(str(folder / "model.safetensors"))
    wte = next(name for name in tensors if name.endswith("wte.weight"))
    tensors[wte][7] = np.inf  # the head is untied: only rows that feed token 7 go non-finite
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})

    failing, long_neighbour, short_next = (
        [7, 1, 2, 3, 4, 5, 6, 8, 9, 10],
        list(range(11, 31)),
        [4, 5, 6],
    )
    params = SamplingParams(max_tokens=6, temperature=0.0)
    llm = LLM(folder, batch_size=2, policy="continuous")
    a, b, c = [
        llm.make_request(i, p, params) for i, p in enumerate([failing, long_neighbour, short_next])
    ]
    llm.run([a, b, c])  # the runtime's own records, which know their KV slots
    assert a.finish_reason == "error" and a.finish_round == 1  # it wrote its NaN keys, then failed
    assert c.first_round == 2 and c.slot == a.slot  # the short request took the failed one's slot
    alone = completions(LLM(folder, batch_size=1).generate([short_next], params))[0]
    assert c.error is None and c.token_ids == alone.token_ids and len(c.token_ids) == 6
    assert b.error is None


def queued(index: int, prompt_len: int, max_new_tokens: int):
    from minirt.engine.request import Request

    return Request(
        index=index,
        id=str(index),
        prompt=None,
        prompt_ids=[1] * prompt_len,
        params=SamplingParams(max_tokens=max_new_tokens, temperature=0.0),
    )


@settings(max_examples=60, deadline=None)
@given(
    budget=st.integers(4, 40),
    reserved=st.integers(0, 40),
    prompt_len=st.integers(1, 10),
    max_new=st.integers(1, 10),
    token_budget=st.one_of(st.none(), st.integers(1, 30)),
    tokens=st.integers(0, 30),
    chunked=st.booleans(),
)
def test_continuous_admission_rule_keeps_both_budgets_by_itself(
    budget, reserved, prompt_len, max_new, token_budget, tokens, chunked
):
    """The rule is checked directly, not through the pool's shape, which happens to keep the budget too.  A
    candidate is admitted when its KV need fits beside what is reserved and some of its prompt fits beside
    this round's tokens: all of it, or, chunked, what the round's budget leaves.  The arithmetic by hand."""
    from minirt.engine.scheduler import ContinuousScheduler, KVShape

    scheduler = ContinuousScheduler(4, budget, 64, token_budget, chunked_prefill=chunked)
    scheduler.pool = KVShape(rows=4, capacity=64)
    if reserved:
        holder = queued(1, reserved, 1)  # its prompt in, it reserves `reserved` positions
        holder.prefilled = reserved
        scheduler.running = [holder]
    candidate = queued(0, prompt_len, max_new)
    scheduler.submit(candidate)
    need = prompt_len + max_new - 1  # its prompt and every output token but the last
    if token_budget is None or tokens + prompt_len <= token_budget:
        fed = prompt_len
    elif chunked:
        fed = max(0, token_budget - tokens)
    else:
        fed = 0
    prefill_to = {}
    admitted = scheduler.admissions(tokens, prefill_to)
    if reserved + need <= budget and fed > 0:
        assert admitted == [candidate] and prefill_to == {candidate: fed}
    else:
        assert admitted == [] and prefill_to == {}


def test_requests_submitted_while_the_pool_runs_are_admitted_within_the_budget():
    """Mid-run submissions go through the same rule: never more KV reserved than the budget, in any round."""
    from minirt.engine.scheduler import ContinuousScheduler

    scheduler = ContinuousScheduler(3, 12, 64, None)
    for i in range(3):
        scheduler.submit(queued(i, 2, 3))  # need 4 each: the pool is 3 rows of 4
    for round_number in range(1, 9):
        plan = scheduler.plan(round_number)
        assert sum(scheduler.kv_positions_needed(r) for r in scheduler.running) <= 12
        for request in plan.active:  # each finishes after two rounds; a new one arrives every round
            request.token_ids.append(0)
            if len(request.token_ids) == 2:
                from minirt.engine.request import Status

                request.status = Status.FINISHED
        scheduler.complete(plan)
        scheduler.submit(queued(10 + round_number, 1 + round_number % 3, 2))


def test_two_stop_strings_in_one_piece_of_text_cut_before_the_earlier():
    """By hand: "xyz" starts at 13 and "ab" at 6, in the text that arrives in one step: the cut is at 6."""
    from minirt.engine.request import Request, found_stop_string

    for stops in (("xyz", "ab"), ("ab", "xyz")):
        request = Request(
            index=0,
            id="0",
            prompt="p",
            prompt_ids=[1],
            params=SamplingParams(stop=stops, temperature=0.0, max_tokens=64),
        )
        assert found_stop_string(request, "hello ab then xyz")
        assert request.text == "hello "


@settings(max_examples=30, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=7),
    batch_size=st.integers(1, 8),
    policy=st.sampled_from(["static", "continuous"]),
)
def test_utilization_is_active_over_held_row_rounds(model, lengths, batch_size, policy):
    """Held rows, by hand: a static group holds one row per member from its first round to its last; the
    continuous pool holds min(batch size, requests) rows every round.  A single request is 100% utilized."""
    engine = engine_for(model, batch_size, policy=policy)
    requests, stats = serve(
        engine,
        [[1 + i] for i in range(len(lengths))],
        [SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0) for n in lengths],
    )
    if policy == "static":
        held = sum(len(g.members) * (g.last_round - g.first_round + 1) for g in stats.groups)
    else:
        held = min(batch_size, len(lengths)) * stats.rounds
    assert stats.utilization == pytest.approx(sum(lengths) / held)
    if len(lengths) == 1:
        assert stats.utilization == 1.0


# ------------------------------------------------------------------ a KV budget in a fraction of a MiB

# tiny_lm: 2 layers, 4 heads of 8, float32.  One position's keys and values: 2 (K and V) x 2 layers
# x 4 heads x 8 x 4 bytes = 512 bytes.  0.0195 MiB is 0.0195 x 2**20 = 20447.232 bytes: 39
# positions (39 x 512 = 19968; 40 would need 20480).  In decimal megabytes it would be 38.
FRACTION_MIB = 0.0195
FRACTION_POSITIONS = 39


def test_a_kv_budget_of_a_fraction_of_a_mib_holds_the_positions_counted_by_hand(tiny_lm):
    """Run through generation: requests needing 13 positions (a 1-token prompt and 13 tokens but
    the last) form groups of 3 (39 exactly), not 4; one needing 39 runs alone; one needing 40 is
    refused, naming the budget in positions.  The rounds waited show the limit holding."""
    llm = LLM(tiny_lm, batch_size=4, kv_budget_mib=FRACTION_MIB)
    assert llm.engine.kv_budget_positions == FRACTION_POSITIONS
    params = [
        SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0)
        for n in (13, 13, 13, 13, 39, 40)
    ]
    outputs = completions(llm.generate([[5]] * len(params), params))
    assert [o.group for o in outputs] == [1, 1, 1, 2, 3, None]
    assert [o.first_round for o in outputs] == [1, 1, 1, 14, 27, None]
    assert [o.rounds_waited for o in outputs] == [0, 0, 0, 13, 26, None]
    assert [len(o.token_ids) for o in outputs] == [13, 13, 13, 13, 39, 0]
    assert outputs[5].finish_reason == "error"
    assert f"over the budget of {FRACTION_POSITIONS}" in outputs[5].error
    # Held below 4 rows: the first group at 3, the second at 1 (with the next, 2 x 39 > 39).
    assert llm.last_stats.kv_limited_rows == [3, 1]
