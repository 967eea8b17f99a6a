"""logit_bias, the repetition, presence and frequency penalties, and min-p.

Expected values come from hand computations (plain Python loops over the formulas in `by_hand`), and, where
torch and transformers import, from transformers' own RepetitionPenaltyLogitsProcessor, MinPLogitsWarper and
greedy `generate(repetition_penalty=1.3)`.  Batch invariance holds with every new field set.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import make_request, random_model, reference_available, serve_all
from minirt.engine.engine import Engine
from minirt.engine.runner import ModelRunner
from minirt.errors import RequestError
from minirt.engine.params import SamplingParams
from minirt.engine.sampler import filtered_distribution, processed_logits, top_logprobs
from conftest import completions

V = 13
logit_lists = st.lists(st.floats(-8, 8, allow_nan=False), min_size=V, max_size=V)
histories = st.lists(st.integers(0, V - 1), max_size=12)


def by_hand(logits, bias, repetition, presence, frequency, prompt, output):
    """The formulas, one token at a time: bias, then repetition over prompt and output (each token once),
    then frequency x count and presence x (count > 0) over the output."""
    x = [float(v) for v in logits]
    for token, b in bias.items():
        x[token] += b
    for token in set(prompt) | set(output):
        x[token] = x[token] / repetition if x[token] > 0 else x[token] * repetition
    for token in range(len(x)):
        count = output.count(token)
        x[token] -= frequency * count + presence * (1 if count else 0)
    return x


@settings(max_examples=200, deadline=None)
@given(
    logits=logit_lists,
    prompt=histories,
    output=histories,
    bias=st.dictionaries(st.integers(0, V - 1), st.floats(-5, 5), max_size=4),
    repetition=st.floats(0.2, 3.0),
    presence=st.floats(-2, 2),
    frequency=st.floats(-2, 2),
)
def test_biases_and_penalties_follow_their_formulas(
    logits, prompt, output, bias, repetition, presence, frequency
):
    params = SamplingParams(
        logit_bias=bias,
        repetition_penalty=repetition,
        presence_penalty=presence,
        frequency_penalty=frequency,
        temperature=0.0,
        max_tokens=64,
    )
    got = processed_logits(np.array(logits, dtype=np.float32), params, prompt, output)
    want = by_hand(
        np.array(logits, dtype=np.float32).tolist(),
        bias,
        repetition,
        presence,
        frequency,
        prompt,
        output,
    )
    assert np.allclose(got, want, rtol=1e-12, atol=1e-12)


@settings(max_examples=200, deadline=None)
@given(logits=logit_lists, min_p=st.floats(0.0, 1.0), temperature=st.floats(0.2, 3.0))
def test_min_p_keeps_what_is_at_least_min_p_of_the_top(logits, min_p, temperature):
    probs = filtered_distribution(
        np.array(logits), SamplingParams(temperature=temperature, min_p=min_p, max_tokens=64)
    )
    exps = [math.exp(v / temperature - max(logits) / temperature) for v in logits]
    p = [e / sum(exps) for e in exps]
    kept = [q if q >= min_p * max(p) else 0.0 for q in p]
    assert np.allclose(probs, [k / sum(kept) for k in kept], rtol=1e-9, atol=1e-12)
    assert probs[int(np.argmax(logits))] > 0  # the top token always stays


def test_json_keys_are_token_ids_and_bad_values_are_refused():
    assert SamplingParams(
        logit_bias={"7": 2.5, 3: -1}, temperature=0.0, max_tokens=64
    ).logit_bias == ((3, -1), (7, 2.5))
    for bad in ({"x": 1}, {"-1": 1}, {5: float("nan")}, {5: "big"}, [1, 2], "7:1"):
        with pytest.raises(RequestError, match="logit_bias"):
            SamplingParams(logit_bias=bad, temperature=0.0, max_tokens=64)
    for field, value in (
        ("repetition_penalty", 0),
        ("repetition_penalty", -1.0),
        ("presence_penalty", math.inf),
        ("frequency_penalty", "1"),
        ("min_p", 1.5),
        ("min_p", -0.1),
        ("min_p", math.nan),
    ):
        with pytest.raises(RequestError, match=field):
            SamplingParams(**{field: value})


def serve(engine, prompts, params):
    requests = [
        make_request(engine, i, p, sp)
        for i, (p, sp) in enumerate(zip(prompts, params, strict=True))
    ]
    serve_all(engine, requests)
    return [r.token_ids for r in requests]


@pytest.fixture(scope="module")
def model():
    return random_model(seed=4, vocab_size=40, n_positions=64)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    data=st.data(), batch_size=st.integers(1, 4), policy=st.sampled_from(["static", "continuous"])
)
def test_batch_invariance_holds_with_every_new_field(model, data, batch_size, policy):
    n = data.draw(st.integers(1, 5), label="requests")
    prompts = [
        data.draw(st.lists(st.integers(0, 39), min_size=1, max_size=6), label="prompt")
        for _ in range(n)
    ]
    params = [
        SamplingParams(
            max_tokens=data.draw(st.integers(1, 8)),
            temperature=data.draw(st.sampled_from([0.0, 0.9])),
            seed=i,
            ignore_eos=True,
            min_p=data.draw(st.sampled_from([0.0, 0.05])),
            repetition_penalty=data.draw(st.sampled_from([1.0, 1.3])),
            presence_penalty=data.draw(st.sampled_from([0.0, 0.5])),
            frequency_penalty=data.draw(st.sampled_from([0.0, 0.7])),
            logit_bias=data.draw(st.dictionaries(st.integers(0, 39), st.floats(-3, 3), max_size=2)),
            logprobs=data.draw(st.sampled_from([None, 0, 3])),
            prompt_logprobs=data.draw(st.sampled_from([None, 0])),
            n=data.draw(st.integers(1, 3)),
        )
        for i in range(n)
    ]
    together = served(
        Engine(ModelRunner(model), None, batch_size=batch_size, policy=policy), prompts, params
    )
    for (
        request
    ) in together:  # each sample alone, in a batch of one, is what it was beside its peers
        [alone] = [
            r
            for r in served(
                Engine(ModelRunner(model), None, batch_size=1),
                [prompts[request.index]],
                [params[request.index]],
            )
            if r.sample == request.sample
        ]
        assert alone.token_ids == request.token_ids
        assert len(alone.top_logprobs) == len(request.top_logprobs)
        for mine, theirs in zip(alone.top_logprobs, request.top_logprobs, strict=True):
            assert np.allclose([lp for _, lp in mine], [lp for _, lp in theirs], atol=1e-5)
            pairs = zip(mine, mine[1:], strict=False)  # each with the next: one shorter on purpose
            near_tie = any(abs(a[1] - b[1]) < 1e-5 for a, b in pairs)  # two may swap within 1e-5
            assert near_tie or [t for t, _ in mine] == [t for t, _ in theirs]
        assert np.allclose(alone.logprobs, request.logprobs, atol=1e-5)
        assert (alone.prompt_logprobs is None) == (request.prompt_logprobs is None)


def served(engine, prompts, params):
    """Every request, a prompt's n samples one after another, after serving them together."""
    requests = [
        make_request(engine, i, p, sp, sample=k)
        for i, (p, sp) in enumerate(zip(prompts, params, strict=True))
        for k in range(sp.n)
    ]
    serve_all(engine, requests)
    return requests


def test_a_bias_steers_greedy_decoding(model):
    """+100 on token 5 makes greedy pick 5 every time; a repetition penalty alone changes nothing unless seen."""
    engine = Engine(ModelRunner(model), None, batch_size=2)
    biased = serve(
        engine,
        [[1, 2, 3]],
        [SamplingParams(max_tokens=4, logit_bias={5: 100.0}, ignore_eos=True, temperature=0.0)],
    )
    assert biased == [[5, 5, 5, 5]]
    plain, penalised = serve(
        engine,
        [[1, 2, 3], [1, 2, 3]],
        [
            SamplingParams(max_tokens=12, ignore_eos=True, temperature=0.0),
            SamplingParams(
                max_tokens=12, ignore_eos=True, repetition_penalty=50.0, temperature=0.0
            ),
        ],
    )
    assert len(set(penalised)) > len(set(plain)) or len(set(plain)) == 12  # it repeats itself less


@settings(max_examples=200, deadline=None)
@given(
    logits=st.lists(st.sampled_from([-2.0, -0.5, 0.0, 0.5, 1.0, 3.0]), min_size=V, max_size=V),
    n=st.integers(1, V),
)
def test_top_logprobs_are_the_most_likely_by_hand(logits, n):
    """Most likely first, ties to the lower id, values the log-softmax computed by hand."""
    total = math.log(sum(math.exp(v) for v in logits))
    ranked = sorted(range(V), key=lambda t: (-logits[t], t))[:n]
    got = top_logprobs(np.array(logits, dtype=np.float32), n)
    assert [t for t, _ in got] == ranked
    assert np.allclose([lp for _, lp in got], [logits[t] - total for t in ranked], atol=1e-9)


def test_logprobs_n_records_the_alternatives_of_every_step(tiny_lm, tmp_path):
    """--logprobs N: top_logprobs, N pairs per generated token, the greedy choice first; --logprobs alone records
    no alternatives, and a JSONL line's own "logprobs" N holds for that line whatever the flag."""
    import json

    from minirt.cli.command import run_command
    from minirt.generate import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "To be"}\n{"prompt": "To be", "logprobs": 1}\n')
    for flags, sizes in (
        (["--logprobs", "3"], [3, 1]),
        (["--logprobs"], [None, 1]),
        ([], [None, 1]),
    ):
        out = tmp_path / "o.jsonl"
        assert (
            run_command(
                main,
                [
                    "--model",
                    str(tiny_lm),
                    "--prompts",
                    str(prompts),
                    "--output",
                    str(out),
                    "--quiet",
                    "--max-new-tokens",
                    "5",
                    "--temperature",
                    "0",
                    "--no-progress",
                    *flags,
                ],
            )
            == 0
        )
        for record, size in zip(
            [json.loads(line) for line in out.read_text().splitlines()], sizes, strict=True
        ):
            if size is None:
                assert "top_logprobs" not in record
                continue
            assert [len(step) for step in record["top_logprobs"]] == [size] * len(
                record["token_ids"]
            )
            assert [step[0][0] for step in record["top_logprobs"]] == record[
                "token_ids"
            ]  # greedy: the top one
            assert [step[0][1] for step in record["top_logprobs"]] == record["logprobs"]
            assert all(
                step == sorted(step, key=lambda pair: -pair[1]) for step in record["top_logprobs"]
            )


@pytest.mark.parametrize("name", ["base", "untied_head", "odd_heads"])
def test_prompt_logprobs_equal_the_committed_transformers_logits(name):
    """The fixtures hold transformers' logits for whole sequences: their log-softmax at position i, taken at
    token i + 1, is that token's logprob given the ones before it."""
    from conftest import FIXTURES, load_expected
    from minirt import LLM

    expected = load_expected(name)
    llm = LLM(FIXTURES / name, backend="numpy")
    for b in range(5):
        seq = expected[f"seq_{b}"].tolist()
        out = completions(
            llm.generate([seq], SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0))
        )[0]
        logits = expected["logits"][b, : len(seq)].astype(np.float64)  # [L, V], transformers'
        logsumexp = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
        want = [logits[i, seq[i + 1]] - logsumexp[i] for i in range(len(seq) - 1)]
        assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(seq)
        assert np.allclose(out.prompt_logprobs[1:], want, atol=1e-4)


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    n=st.integers(1, 4),
    batch_size=st.integers(1, 5),
    seed=st.integers(0, 99),
    policy=st.sampled_from(["static", "continuous"]),
)
def test_sample_k_does_not_depend_on_n(tiny_lm, n, batch_size, seed, policy):
    """Each sample draws from its own stream, fixed by the request's seed and k: asking for more samples never
    changes the earlier ones, in any batch; samples share nothing that changes their tokens."""
    from minirt import LLM

    llm = LLM(tiny_lm, batch_size=batch_size, policy=policy)
    params = SamplingParams(max_tokens=6, temperature=1.0, ignore_eos=True, seed=seed)
    four = completions(llm.generate(["To be", "All the world"], params.updated(n=4)))
    some = completions(llm.generate(["To be", "All the world"], params.updated(n=n)))
    assert [(o.index, o.sample) for o in four] == [(i, k) for i in range(2) for k in range(4)]
    assert [(o.index, o.sample, o.token_ids) for o in some] == [
        (o.index, o.sample, o.token_ids) for o in four if o.sample < n
    ]
    alone = completions(LLM(tiny_lm, batch_size=1).generate(["All the world"], params))[0]
    assert alone.token_ids == four[4].token_ids  # sample 0 of prompt 1 is what n = 1 always drew


def test_n_gives_one_record_per_sample(tiny_lm, tmp_path):
    import json

    from minirt.cli.command import EXIT_USAGE, run_command
    from minirt.generate import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        '{"prompt": "To be", "id": "a", "n": 3}\n{"prompt": "Now"}\n{"prompt": "x", "n": 0}\n'
    )
    out = tmp_path / "o.jsonl"
    run_command(
        main,
        [
            "--model",
            str(tiny_lm),
            "--prompts",
            str(prompts),
            "--output",
            str(out),
            "--quiet",
            "--max-new-tokens",
            "5",
            "--temperature",
            "1",
            "--no-progress",
        ],
    )
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["index"], r["id"], r.get("sample")) for r in records] == [
        (0, "a", 0),
        (0, "a", 1),
        (0, "a", 2),
        (1, "1", None),
        (2, "2", None),
    ]
    assert len({tuple(r["token_ids"]) for r in records[:3]}) > 1  # independent streams
    assert "n must be an integer from 1" in records[4]["error"]
    assert run_command(main, ["--model", str(tiny_lm), "--prompt", "x", "--n", "0"]) == EXIT_USAGE


# ----------------------------------------------------------------------------- against live transformers

live = pytest.mark.skipif(
    not reference_available(),
    reason="torch/transformers not installed (CPU torch first, README 'CPU-only PyTorch'; then pip install -e .[reference])",
)


@pytest.mark.reference
@live
@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 10**6), penalty=st.floats(0.3, 3.0), min_p=st.floats(0.0, 1.0))
def test_processors_equal_transformers(seed, penalty, min_p):
    import torch
    from transformers import MinPLogitsWarper, RepetitionPenaltyLogitsProcessor

    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 3, size=(1, 50)).astype(np.float32)
    ids = rng.integers(0, 50, size=(1, 9))
    want = RepetitionPenaltyLogitsProcessor(penalty)(
        torch.tensor(ids), torch.tensor(logits)
    ).numpy()[0]
    got = processed_logits(
        logits[0],
        SamplingParams(repetition_penalty=penalty, temperature=0.0, max_tokens=64),
        ids[0, :4].tolist(),
        ids[0, 4:].tolist(),
    )
    assert np.allclose(got, want, rtol=1e-6, atol=1e-6)
    warped = MinPLogitsWarper(min_p=min_p)(torch.tensor(ids), torch.tensor(logits)).numpy()[0]
    want_probs = np.exp(warped - warped.max()) / np.exp(warped - warped.max()).sum()
    got_probs = filtered_distribution(
        logits[0], SamplingParams(temperature=1.0, min_p=min_p, max_tokens=64)
    )
    assert np.array_equal(got_probs > 0, want_probs > 0) and np.allclose(
        got_probs, want_probs, atol=1e-6
    )


@pytest.mark.reference
@live
def test_greedy_with_repetition_penalty_equals_transformers_generate(tiny_lm):
    import torch
    from transformers import GPT2LMHeadModel

    from minirt import LLM

    reference = GPT2LMHeadModel.from_pretrained(tiny_lm).eval()
    llm = LLM(tiny_lm, backend="numpy")
    for prompt in ([5, 6, 7, 8], [40, 41], [3, 3, 3, 9, 1]):
        with torch.no_grad():
            out = reference.generate(
                torch.tensor([prompt]),
                do_sample=False,
                max_new_tokens=20,
                min_new_tokens=20,
                repetition_penalty=1.3,
                pad_token_id=0,
            )
        want = out[0, len(prompt) :].tolist()
        got = completions(
            llm.generate(
                [prompt],
                SamplingParams(
                    max_tokens=20, repetition_penalty=1.3, ignore_eos=True, temperature=0.0
                ),
            )
        )[0]
        assert got.token_ids == want


def test_jsonl_fields_and_flags_reach_each_request(tiny_lm, tmp_path):
    """A JSONL line's fields override the flags for that request; a bad value fails that request alone; a bias
    on a token the model does not have is refused as the request's own error."""
    import json

    from minirt.cli.command import EXIT_REQUEST_FAILED, run_command
    from minirt.generate import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "\n".join(
            json.dumps(row)
            for row in [
                {"prompt": "To be", "logit_bias": {"5": 100}},
                {"prompt": "To be"},
                {"prompt": "To be", "min_p": 7},
                {"prompt": "To be", "logit_bias": {"100000": 1}},
            ]
        )
        + "\n"
    )
    out = tmp_path / "o.jsonl"
    code = run_command(
        main,
        [
            "--model",
            str(tiny_lm),
            "--prompts",
            str(prompts),
            "--output",
            str(out),
            "--quiet",
            "--max-new-tokens",
            "4",
            "--temperature",
            "0",
            "--logit-bias",
            "7=100",
            "--ignore-eos",
            "--no-progress",
        ],
    )
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert code == EXIT_REQUEST_FAILED
    assert records[0]["token_ids"] == [5] * 4  # its own bias replaces the flag's
    assert records[1]["token_ids"] == [7] * 4  # the flag's
    assert "min_p must be in [0, 1]" in records[2]["error"]
    assert "logit_bias" in records[3]["error"] and records[3]["token_ids"] == []


@pytest.mark.reference
@live
def test_top_logprobs_equal_transformers_log_softmax(tiny_lm):
    import torch
    from transformers import GPT2LMHeadModel

    from minirt import LLM

    reference = GPT2LMHeadModel.from_pretrained(tiny_lm).eval()
    prompt = [5, 6, 7, 8]
    out = completions(
        LLM(tiny_lm, backend="numpy").generate(
            [prompt],
            SamplingParams(max_tokens=8, temperature=1.0, seed=2, logprobs=5, ignore_eos=True),
        ),
        top_n=5,
    )[0]
    for step, alternatives in enumerate(out.top_logprobs):
        with torch.no_grad():
            raw = reference(torch.tensor([prompt + out.token_ids[:step]])).logits[0, -1].double()
        want = torch.log_softmax(raw, dim=-1)
        want_ids = torch.argsort(-want, stable=True)[:5].tolist()
        assert [t for t, _ in alternatives] == want_ids
        assert np.allclose([lp for _, lp in alternatives], want[want_ids].numpy(), atol=1e-4)


@pytest.mark.reference
@live
def test_prompt_logprobs_equal_transformers(tiny_lm, tmp_path):
    import json

    import torch
    from transformers import GPT2LMHeadModel

    from minirt.cli.command import run_command
    from minirt.generate import main

    reference = GPT2LMHeadModel.from_pretrained(tiny_lm).eval()
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": [5, 6, 7, 8, 30, 31]}\n{"prompt": [9]}\n')
    out = tmp_path / "o.jsonl"
    assert (
        run_command(
            main,
            [
                "--model",
                str(tiny_lm),
                "--prompts",
                str(prompts),
                "--output",
                str(out),
                "--prompt-logprobs",
                "--max-new-tokens",
                "2",
                "--quiet",
                "--no-progress",
            ],
        )
        == 0
    )
    first, second = [json.loads(line) for line in out.read_text().splitlines()]
    with torch.no_grad():
        raw = reference(torch.tensor([[5, 6, 7, 8, 30, 31]])).logits[0].double()
    want = torch.log_softmax(raw, -1)[torch.arange(5), torch.tensor([6, 7, 8, 30, 31])].numpy()
    assert first["prompt_logprobs"][0] is None and np.allclose(
        first["prompt_logprobs"][1:], want, atol=1e-4
    )
    assert second["prompt_logprobs"] == [None]  # one token: nothing before it


def test_timings_are_ordered_and_a_group_waits_for_the_last(model):
    """arrival <= first token <= finish <= the run's wall time; a request the engine refused has no first token;
    under static groups, group 2's first tokens come after every group-1 member's finish."""
    from minirt.cli.summary import summary

    engine = Engine(ModelRunner(model), None, batch_size=2)
    params = [SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0) for n in (2, 6, 3, 1)]
    requests = [make_request(engine, i, [1 + i], sp) for i, sp in enumerate(params)]
    # Refused (a token outside the vocabulary), so it never runs.
    requests.append(
        make_request(engine, 4, [10**6], SamplingParams(temperature=0.0, max_tokens=64))
    )
    stats = serve_all(engine, requests)
    served, refused = requests[:4], requests[4]
    assert all(
        r.arrival_s == 0.0 <= r.first_token_s <= r.finish_s <= stats.wall_seconds for r in served
    )
    assert refused.error and refused.first_token_s is None and refused.finish_s is not None
    assert min(r.first_token_s for r in served if r.group == 2) >= max(
        r.finish_s for r in served if r.group == 1
    )
    assert sorted(stats.first_token_seconds) == sorted(r.first_token_s for r in served)
    assert "first token  " in summary(stats, 0.0)


@pytest.mark.reference
@live
def test_greedy_with_presence_and_frequency_equals_a_hand_loop_on_transformers_logits(tiny_lm):
    """At each step: transformers' raw logits for the sequence so far, minus frequency x count + presence x
    (count > 0) over the output so far (the formula, in a plain loop), then the argmax."""
    import torch
    from transformers import GPT2LMHeadModel

    from minirt import LLM

    reference = GPT2LMHeadModel.from_pretrained(tiny_lm).eval()
    llm = LLM(tiny_lm, backend="numpy")
    for prompt, presence, frequency in (
        ([5, 6, 7, 8], 0.8, 0.3),
        ([40, 41], 0.0, 1.5),
        ([3, 3, 9], 2.0, 0.0),
    ):
        output: list[int] = []
        for _ in range(16):
            with torch.no_grad():
                logits = reference(torch.tensor([prompt + output])).logits[0, -1].double().tolist()
            for token in set(output):
                logits[token] -= frequency * output.count(token) + presence
            output.append(max(range(len(logits)), key=lambda t: (logits[t], -t)))
        got = completions(
            llm.generate(
                [prompt],
                SamplingParams(
                    max_tokens=16,
                    presence_penalty=presence,
                    frequency_penalty=frequency,
                    ignore_eos=True,
                    temperature=0.0,
                ),
            )
        )[0]
        assert got.token_ids == output


# ------------------------------------------------------------------ each control alone, end to end
# Through `LLM.generate` on a tiny model with a tokenizer, each control set alone (the sampling
# filters at temperature 1, which leaves the logits as they are; the biases and penalties greedy),
# against `hand_decode` (tests/conftest.py): the model's own logits from a separate forward of the
# whole sequence, the documented formula in plain Python, and numpy's own Generator for a draw.

ALONE_PROMPTS = ([5, 6, 7], [40, 41, 40, 41], [3])

CONTROLS_ALONE = {
    "temperature": st.floats(0.3, 2.5).map(lambda t: {"temperature": t}),
    "top_k": st.integers(1, 30).map(lambda k: {"temperature": 1.0, "top_k": k}),
    "top_p": st.floats(0.02, 1.0).map(lambda p: {"temperature": 1.0, "top_p": p}),
    "min_p": st.floats(0.0, 0.9).map(lambda m: {"temperature": 1.0, "min_p": m}),
    "repetition_penalty": st.floats(0.3, 5.0).map(lambda r: {"repetition_penalty": r}),
    "presence_penalty": st.floats(-2.0, 2.0).map(lambda p: {"presence_penalty": p}),
    "frequency_penalty": st.floats(-2.0, 2.0).map(lambda f: {"frequency_penalty": f}),
    "logit_bias": st.dictionaries(
        st.integers(0, 200), st.floats(-100, 100), min_size=1, max_size=3
    ).map(lambda bias: {"logit_bias": bias}),
}


@pytest.fixture(scope="module")
def tiny_llm(tiny_lm):
    from minirt import LLM

    return LLM(tiny_lm, batch_size=4)


def generated_alone_and_by_hand(llm, fields: dict, seed: int, n: int = 8):
    """Each prompt's tokens through `LLM.generate` (all in one batch), and by hand."""
    from conftest import hand_decode

    params = SamplingParams(
        max_tokens=n, ignore_eos=True, seed=seed, **{"temperature": 0.0, **fields}
    )
    outputs = completions(llm.generate(list(ALONE_PROMPTS), params))
    by_hand = [
        hand_decode(llm.model, list(p), n, rng=np.random.default_rng(seed), **fields)
        for p in ALONE_PROMPTS
    ]
    return [o.token_ids for o in outputs], by_hand


@pytest.mark.parametrize("control", sorted(CONTROLS_ALONE))
def test_one_control_alone_chooses_the_hand_computed_tokens(tiny_llm, control):
    @settings(max_examples=6, deadline=None)
    @given(fields=CONTROLS_ALONE[control], seed=st.integers(0, 2**32))
    def check(fields, seed):
        got, want = generated_alone_and_by_hand(tiny_llm, fields, seed)
        assert got == want

    check()


@pytest.mark.parametrize(
    "fields",
    [
        {"temperature": 1.0, "top_k": 1},
        {"temperature": 1.0, "top_p": 1e-9},
        {"temperature": 1.0, "min_p": 1.0},
    ],
)
def test_a_filter_that_keeps_only_the_top_token_is_greedy(tiny_llm, fields):
    """top_k 1, a vanishing top_p and min_p 1 each leave the most likely token alone: the tokens
    are the argmax of the model's own logits, whatever the seed."""
    from conftest import hand_decode

    for seed in (0, 1, 2):
        got, _ = generated_alone_and_by_hand(tiny_llm, fields, seed)
        assert got == [hand_decode(tiny_llm.model, list(p), 8) for p in ALONE_PROMPTS]


def test_a_bias_of_100_forces_its_token_and_penalties_alone_change_greedy_choices(tiny_llm):
    """logit_bias +100 on one token makes it every greedy choice, and on another every choice
    too, whatever the logits.  Each penalty alone, at a strength that changes the greedy tokens
    of these prompts (checked by hand: the plain argmax repeats itself), is applied as its
    formula says."""
    from conftest import hand_decode

    for token in (17, 123):
        got, _ = generated_alone_and_by_hand(tiny_llm, {"logit_bias": {token: 100.0}}, 0)
        assert got == [[token] * 8] * len(ALONE_PROMPTS)
    plain = [hand_decode(tiny_llm.model, list(p), 8) for p in ALONE_PROMPTS]
    for fields in (
        {"presence_penalty": 2.0},
        {"frequency_penalty": 2.0},
        {"repetition_penalty": 5.0},
    ):
        got, want = generated_alone_and_by_hand(tiny_llm, fields, 0)
        assert got == want
        assert want != plain, f"{fields} changes nothing here: the check would be empty"
