"""`python -m minirt.evaluate`: the sliding-window definition, and the loss against transformers."""

import json
import math

import numpy as np
import pytest

from conftest import requires_reference
from minirt.cli.command import EXIT_OK, EXIT_USAGE, run_command
from minirt.errors import MinirtError
from minirt.evaluate import main, text_loss, windows
from minirt.llm import LLM


def test_windows_by_hand():
    # 10 tokens, window 4, stride 2: targets 1..9 each scored exactly once.
    assert windows(10, 4, 2) == [(0, 4, 1), (2, 6, 4), (4, 8, 6), (6, 10, 8)]
    assert windows(3, 8, 4) == [(0, 3, 1)]  # shorter than one window
    assert windows(1, 8, 4) == []
    for bad_stride in (0, 4, 5):  # windows that do not overlap would leave boundary tokens unscored
        with pytest.raises(MinirtError):
            windows(10, 4, bad_stride)


@pytest.mark.parametrize(
    "n, window, stride", [(10, 4, 2), (11, 4, 3), (50, 8, 7), (50, 8, 1), (7, 7, 3), (8, 7, 3)]
)
def test_every_target_is_scored_once(n, window, stride):
    scored = []
    for start, stop, first in windows(n, window, stride):
        assert stop - start <= window and first > start
        scored += list(range(first, stop))
    assert scored == list(range(1, n))


def test_loss_by_full_recompute(tiny_lm):
    """With a window as long as the text, the loss is the mean of -log softmax over one logits call."""
    llm = LLM(tiny_lm, backend="numpy")
    ids = llm.tokenizer.encode("To be, or not to be, that is the question")
    total, count = text_loss(llm.model, ids, window=64, stride=32)
    logits = llm.model.logits([ids])[0].astype(np.float64)  # [n, V]
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    want = -np.mean([logp[i, ids[i + 1]] for i in range(len(ids) - 1)])
    assert count == len(ids) - 1 and total / count == pytest.approx(want, rel=1e-6)


@requires_reference
def test_sliding_window_loss_matches_transformers(tiny_lm):
    """A text longer than the context (64), scored by minirt and by the training tool's torch code."""
    import torch
    from train_tiny import sliding_window_loss
    from transformers import GPT2LMHeadModel

    llm = LLM(tiny_lm, backend="numpy")
    text = "Shall I compare thee to a summer's day? Thou art more lovely and more temperate. " * 12
    ids = llm.tokenizer.encode(text)
    assert len(ids) > 3 * 64
    total, count = text_loss(llm.model, ids, window=64, stride=24)
    reference = GPT2LMHeadModel.from_pretrained(
        tiny_lm, local_files_only=True, torch_dtype=torch.float32
    ).eval()
    want = sliding_window_loss(reference, np.array(ids), 64, 24)
    assert count == len(ids) - 1
    assert abs(total / count - want) / want <= 1e-4


def test_command_json_and_errors(tiny_lm, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("All the world's a stage, and all the men and women merely players. " * 5)
    assert (
        run_command(
            main, ["--model", str(tiny_lm), "--text", str(text), "--json", "--backend", "numpy"]
        )
        == EXIT_OK
    )
    result = json.loads(capsys.readouterr().out)
    assert result["window"] == 64 and result["stride"] == 32
    assert result["backend"] == "numpy float32"
    assert result["perplexity"] == pytest.approx(math.exp(result["loss"]))
    for argv, fragment in [
        (["--text", str(tmp_path / "missing.txt")], "does not exist"),
        (["--text", str(text), "--window", "65"], "longer than the model's context"),
        (["--text", str(text), "--stride", "100"], "stride"),
    ]:
        assert (
            run_command(main, argv + ["--model", str(tiny_lm)], prog="minirt.evaluate")
            == EXIT_USAGE
        )
        err = capsys.readouterr().err
        assert fragment in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_the_text_report_says_which_backend_and_dtype_computed_it(tiny_lm, tmp_path, capsys, dtype):
    text = tmp_path / "t.txt"
    text.write_text("Now is the winter of our discontent. " * 4)
    argv = ["--model", str(tiny_lm), "--text", str(text), "--backend", "numpy", "--dtype", dtype]
    assert run_command(main, argv) == EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    assert f"backend      numpy {dtype}" in lines
