"""vLLM's offline quickstart runs on minirt as pasted, with only the import line and the model path changed, and
the rest of what a vLLM user writes first (its SamplingParams fields, prompt forms and output fields) means what
it means in vLLM.

The quickstart's text is vLLM's (docs.vllm.ai, "Quickstart", offline batched inference). Expected values come
from outside minirt's generate path: the tokenizers library for text, a NumPy log-softmax of the model's own
scoring pass for logprobs and ranks, and the quickstart's own printed lines."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from conftest import ROOT, run_script
from minirt import LLM, SamplingParams

SHIPPED = ROOT / "weights" / "shakespeare-gpt2-tiny"

# vLLM's quickstart, as its docs print it, but for the two lines marked: the import, and the model path.
QUICKSTART = f"""
from minirt import LLM, SamplingParams  # vLLM: from vllm import LLM, SamplingParams

prompts = [
    "Hello, my name is",
    "The president of the United States is",
    "The capital of France is",
    "The future of AI is",
]
sampling_params = SamplingParams(temperature=0.8, top_p=0.95)

llm = LLM(model="{SHIPPED}")  # vLLM: LLM(model="facebook/opt-125m")

outputs = llm.generate(prompts, sampling_params)

for output in outputs:
    prompt = output.prompt
    generated_text = output.outputs[0].text
    print(f"Prompt: {{prompt!r}}, Generated text: {{generated_text!r}}")
"""

PROMPTS = [
    "Hello, my name is",
    "The president of the United States is",
    "The capital of France is",
    "The future of AI is",
]


@pytest.fixture(scope="module")
def llm():
    return LLM(model=str(SHIPPED))


@pytest.fixture(scope="module")
def hf_tokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(SHIPPED / "tokenizer.json"))


def raw_log_softmax(row: np.ndarray) -> np.ndarray:
    x = row.astype(np.float64)
    return x - x.max() - np.log(np.exp(x - x.max()).sum())


def test_the_quickstart_runs_as_pasted_and_prints_a_line_per_prompt(tmp_path):
    result = run_script(QUICKSTART, tmp_path, "quickstart.py")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 4
    for line, prompt in zip(lines, PROMPTS, strict=True):
        assert line.startswith(f"Prompt: {prompt!r}, Generated text: '") or line.startswith(
            f'Prompt: {prompt!r}, Generated text: "'
        )
    # Sampled, so the texts differ from one another.
    assert len({line.split("Generated text: ")[1] for line in lines}) == 4


def test_sampling_params_of_vllms_defaults_stop_after_16_tokens_at_temperature_1(llm, hf_tokenizer):
    params = SamplingParams()
    assert (params.max_tokens, params.temperature, params.top_p, params.n) == (16, 1.0, 1.0, 1)
    outputs = llm.generate(PROMPTS, params)
    assert [out.prompt for out in outputs] == PROMPTS
    for out in outputs:
        # What the model was fed is the tokenizers library's encoding of the prompt.
        assert out.prompt_token_ids == hf_tokenizer.encode(out.prompt).ids
        (completion,) = out.outputs
        assert len(completion.token_ids) == 16 or completion.finish_reason == "stop"
        assert completion.text == hf_tokenizer.decode(completion.token_ids)


def test_every_field_of_the_quickstart_family_means_what_it_means_in_vllm(llm, hf_tokenizer):
    """n samples, each seeded, cut at a stop string, with each token's logprob, its rank and the top 2: checked
    against one scoring pass of the prompt and completion and a NumPy log-softmax."""
    params = SamplingParams(
        temperature=0.9, top_p=0.95, max_tokens=12, n=3, seed=7, stop=["\n\n"], logprobs=2
    )
    prompts = [
        "ROMEO:",
        {"prompt": "JULIET:"},
        {"prompt_token_ids": hf_tokenizer.encode("To be").ids},
    ]
    outputs = llm.generate(prompts, params)
    assert len(outputs) == 3 and outputs[2].prompt == "To be"
    assert [o.request_id for o in outputs] == ["0", "1", "2"]
    for out in outputs:
        assert [c.index for c in out.outputs] == [0, 1, 2]
        assert len({tuple(c.token_ids) for c in out.outputs}) > 1  # each sample its own stream
        for completion in out.outputs:
            assert completion.finish_reason in ("stop", "length")
            assert "\n\n" not in completion.text
            assert len(completion.logprobs) == len(completion.token_ids)  # one entry a token
            scored = llm.model.logits([out.prompt_token_ids + completion.token_ids])[0]
            total = 0.0
            for i, (token, entry) in enumerate(
                zip(completion.token_ids, completion.logprobs, strict=True)
            ):
                raw = raw_log_softmax(scored[len(out.prompt_token_ids) + i - 1])
                assert list(entry)[0] == token  # the chosen token first
                assert entry[token].logprob == pytest.approx(raw[token], abs=1e-4)
                # The scoring pass is not the decode round bit for bit: near-ties may swap.
                surely_above = int(np.count_nonzero(raw > raw[token] + 1e-4))
                perhaps_above = int(np.count_nonzero(raw >= raw[token] - 1e-4))
                assert surely_above + 1 <= entry[token].rank <= perhaps_above
                assert entry[token].decoded_token == hf_tokenizer.decode([token])
                top_two = [int(t) for t in np.argsort(-raw, kind="stable")[:2]]
                assert set(entry) == {token, *top_two}
                total += entry[token].logprob
            assert completion.cumulative_logprob == pytest.approx(total, abs=1e-9)
    # Seeded: the same again, sample for sample.
    again = llm.generate(prompts, params)
    assert [[c.token_ids for c in o.outputs] for o in again] == [
        [c.token_ids for c in o.outputs] for o in outputs
    ]


def test_max_new_tokens_and_top_k_minus_one_are_vllms_words_for_the_same_settings(llm):
    """max_new_tokens (Hugging Face's name) is max_tokens; top_k=-1 (vLLM's "off") is top_k=0."""
    assert SamplingParams(max_new_tokens=5).max_tokens == 5
    assert SamplingParams(max_tokens=5).max_new_tokens == 5
    assert SamplingParams().updated(max_new_tokens=3) == SamplingParams(max_tokens=3)
    assert SamplingParams(top_k=-1) == SamplingParams(top_k=0)
    # One field: a copy that changes max_tokens is that copy, whichever name made the original.
    assert dataclasses.replace(SamplingParams(max_new_tokens=5), max_tokens=50) == SamplingParams(
        max_tokens=50
    )
    assert SamplingParams(max_tokens=9, max_new_tokens=9).max_tokens == 9
    greedy = [
        SamplingParams(temperature=0, max_new_tokens=7),
        SamplingParams(temperature=0, max_tokens=7),
    ]
    first, second = llm.generate(["ROMEO:", "ROMEO:"], greedy)
    assert (
        len(first.outputs[0].token_ids) == 7
        and first.outputs[0].token_ids == second.outputs[0].token_ids
    )


def test_prompt_logprobs_0_gives_each_prompt_tokens_logprob_after_a_none(llm):
    (out,) = llm.generate(["To be, or not to be"], SamplingParams(max_tokens=1, prompt_logprobs=0))
    ids = out.prompt_token_ids
    scored = llm.model.logits([ids])[0]
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(ids)
    for k in range(1, len(ids)):
        entry = out.prompt_logprobs[k]
        assert list(entry) == [ids[k]]
        assert entry[ids[k]].logprob == pytest.approx(
            raw_log_softmax(scored[k - 1])[ids[k]], abs=1e-4
        )
    assert len(out.outputs[0].token_ids) == 1
