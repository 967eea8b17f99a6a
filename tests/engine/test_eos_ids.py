"""A model with several end ids (Llama 3's <|end_of_text|>, <|eom_id|>, <|eot_id|>): any of them
stops a request with finish_reason "stop" and leaves its text out; ignore_eos ignores them all.

Checked on the model-free runner, on a random model whose greedy tokens are known, and end to end
through `LLM` on a folder whose generation_config.json lists two end ids (as vLLM reads it: the
tokenizer's EOS and generation_config.json's, all of them stop ids).
"""

from __future__ import annotations

import json
from types import SimpleNamespace

from conftest import completions, make_request, random_model, serve_all
from conftest import stub_request as stub

from minirt.engine.engine import Engine
from minirt.engine.model_free_runner import ModelFreeRunner
from minirt.engine.params import SamplingParams
from minirt.engine.runner import ModelRunner, config_eos_ids


def test_the_model_free_runner_stops_at_the_second_of_two_end_ids():
    """Its rows always get token 0: with end ids (7, 0), a request that heeds EOS stops after
    one token; one that ignores EOS runs to its length."""
    runner = ModelFreeRunner()
    runner.eos_token_ids = (7, 0)
    heeds = stub(0, 2, 3)
    heeds.params = SamplingParams(max_tokens=3, temperature=0.0)
    ignores = stub(1, 2, 3)
    serve_all(Engine(runner, None, batch_size=2), [heeds, ignores])
    assert (heeds.token_ids, heeds.finish_reason) == ([0], "stop")
    assert (ignores.token_ids, ignores.finish_reason) == ([0, 0, 0], "length")


def greedy(max_tokens: int, ignore_eos: bool = False) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=ignore_eos)


def first_new_token(tokens: list[int], after: int) -> int:
    """The place of the first token at or past `after` that did not come before it."""
    return next(k for k in range(after, len(tokens)) if tokens[k] not in tokens[:k])


def test_a_model_stops_at_whichever_end_id_comes_first():
    model = random_model(seed=4, vocab_size=50, n_positions=32)
    engine = Engine(ModelRunner(model), None)
    probe = make_request(engine, 0, [1, 2], greedy(8, ignore_eos=True))
    serve_all(engine, [probe])
    tokens = probe.token_ids
    stop_at = first_new_token(tokens, 2)
    never = next(t for t in range(50) if t not in tokens)
    engine.eos_token_ids = (never, tokens[stop_at])
    # The primary id is the first: the one reports name.
    assert engine.eos_token_id == never
    stopped = make_request(engine, 0, [1, 2], greedy(8))
    ignoring = make_request(engine, 1, [1, 2], greedy(8, ignore_eos=True))
    serve_all(engine, [stopped, ignoring])
    assert stopped.token_ids == tokens[: stop_at + 1] and stopped.finish_reason == "stop"
    assert ignoring.token_ids == tokens and ignoring.finish_reason == "length"


def test_a_configs_list_of_end_ids_is_the_runners_inside_its_vocabulary():
    config = SimpleNamespace(
        eos_token_id=9, bos_token_id=None, vocab_size=100, eos_token_ids=(9, 120, 4, 9)
    )
    assert config_eos_ids(config) == (9, 4)
    # A config that keeps one id (GPT-2's) has that one alone; none outside the vocabulary.
    one = SimpleNamespace(eos_token_id=9, bos_token_id=None, vocab_size=100, eos_token_ids=(9,))
    assert config_eos_ids(one) == (9,)
    outside = SimpleNamespace(
        eos_token_id=100, bos_token_id=None, vocab_size=100, eos_token_ids=(100,)
    )
    assert config_eos_ids(outside) == ()


def test_generation_configs_second_end_id_stops_a_completion_and_leaves_its_text_out(
    tiny_lm, tmp_path
):
    """The tiny model's folder, with generation_config.json's eos_token_id [<|endoftext|>, X],
    X the first new token of its greedy completion past its second: the completion stops at X,
    "stop", and its text is the tokens' before X; ignore_eos runs on past it."""
    from minirt import LLM

    folder = tmp_path / "model"
    folder.mkdir()
    for path in tiny_lm.iterdir():
        (folder / path.name).symlink_to(path)
    prompt = "To be, or not"
    probe = completions(LLM(folder).generate([prompt], greedy(12, ignore_eos=True)))[0]
    llm = LLM(folder)
    tokens = probe.token_ids
    stop_at = first_new_token(tokens, 2)
    endoftext = llm.tokenizer.eos_token_id
    assert endoftext not in tokens[: stop_at + 1]
    generation = {"eos_token_id": [endoftext, tokens[stop_at]], "do_sample": False}
    (folder / "generation_config.json").write_text(json.dumps(generation))
    llm = LLM(folder)
    assert llm.tokenizer.eos_token_ids == (endoftext, tokens[stop_at])
    stopped, ignoring = completions(
        llm.generate([prompt, prompt], [greedy(12), greedy(12, ignore_eos=True)])
    )
    assert stopped.token_ids == tokens[: stop_at + 1] and stopped.finish_reason == "stop"
    assert stopped.text == llm.tokenizer.decode(tokens[:stop_at])
    assert ignoring.token_ids == tokens and ignoring.finish_reason == "length"
