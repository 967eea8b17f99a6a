"""minirt against the committed transformers fixtures (no torch needed to run these).

Each fixture's logits were computed by transformers with every sequence run
alone; minirt runs all of a fixture's sequences together in one padded batch,
so these tests also check that padding never leaks into a real token.
"""

import numpy as np
import pytest

import minirt
from conftest import FIXTURE_NAMES, FIXTURES, greedy_decode, load_expected, relative_error

FP32_TOLERANCE = 1e-4  # the fp32 contract's bound; observed errors are ~1e-6


def test_every_fixture_kind_is_present():
    """The odd-corner configs (tools/fixtures/make_fixtures.py) are all committed (so a deleted fixture fails loudly)."""
    assert set(FIXTURE_NAMES) >= {
        "base",
        "odd_heads",
        "tiny_vocab_short_ctx",
        "fp16_file",
        "bf16_file",
        "no_prefix_with_mask_buffers",
        "untied_head",
        "erf_gelu_eps_noscale",
        "sharded",
    }


@pytest.mark.parametrize(
    "scratch", [None, 1, 3000], ids=["one tile", "a token a tile", "a few tokens a tile"]
)
@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_padded_batch_logits_match_transformers(name, scratch, monkeypatch):
    if (
        scratch is not None
    ):  # scratch budgets shrunk until a prompt spans many attention and MLP tiles
        monkeypatch.setattr(minirt.model.layers, "ATTENTION_SCRATCH_BYTES", scratch)
        monkeypatch.setattr(minirt.model.layers, "MLP_SCRATCH_BYTES", scratch)
    expected = load_expected(name)
    sequences = [
        expected[f"seq_{b}"].tolist() for b in range(sum(k.startswith("seq_") for k in expected))
    ]
    assert len({len(s) for s in sequences}) > 2, (
        "the fixture must mix lengths, or padding goes untested"
    )
    model = minirt.load_model(FIXTURES / name)
    got = model.logits(sequences)  # [B, max_len, V]
    assert got.shape == expected["logits"].shape
    for b, seq in enumerate(sequences):
        n = len(seq)
        err = relative_error(got[b, :n], expected["logits"][b, :n])
        assert err <= FP32_TOLERANCE, f"{name} row {b} (len {n}): relative error {err:.2e}"


@pytest.mark.parametrize("name", [n for n in FIXTURE_NAMES if "greedy_0" in load_expected(n)])
def test_batched_greedy_with_kv_cache_matches_transformers(name):
    """32 greedy steps, decoded with the KV cache in one batch, equal the reference's full recompute."""
    expected = load_expected(name)
    n_prompts = sum(k.startswith("prompt_") for k in expected)
    prompts = [expected[f"prompt_{g}"].tolist() for g in range(n_prompts)]
    for g in range(n_prompts):  # the fixtures were drawn so that no step is a near-tie
        assert expected[f"margin_{g}"].min() >= 1e-3
    model = minirt.load_model(FIXTURES / name)
    outputs = greedy_decode(model, prompts, steps=32)
    for g, out in enumerate(outputs):
        assert out == expected[f"greedy_{g}"].tolist(), f"{name} prompt {g}"


def test_no_prefix_fixture_really_has_no_prefix_and_mask_buffers():
    from minirt.loading.safetensors_header import read_safetensors_header

    entries, _ = read_safetensors_header(
        FIXTURES / "no_prefix_with_mask_buffers" / "model.safetensors"
    )
    assert not any(n.startswith("transformer.") for n in entries)
    assert any(n.endswith(".attn.bias") for n in entries)


@pytest.mark.parametrize("name, code", [("fp16_file", "F16"), ("bf16_file", "BF16")])
def test_half_precision_files_are_what_they_claim(name, code):
    ckpt = minirt.load_checkpoint(FIXTURES / name)
    assert set(ckpt.file_dtypes.values()) == {code}
    model = minirt.load_model(FIXTURES / name)
    assert (
        model.params["wpe.weight"].dtype == model.wte_t.dtype == np.float32
    )  # computed in fp32 by default


def test_sharded_fixture_is_sharded():
    assert len(list((FIXTURES / "sharded").glob("model-*.safetensors"))) == 3
    assert (FIXTURES / "sharded" / "model.safetensors.index.json").is_file()


def test_untied_head_is_used_when_present():
    ckpt = minirt.load_checkpoint(FIXTURES / "untied_head")
    assert not ckpt.head_is_tied
    assert not np.array_equal(ckpt.tensors["lm_head.weight"], ckpt.tensors["wte.weight"])
    tied = minirt.load_checkpoint(FIXTURES / "base")
    assert tied.head_is_tied and tied.tensors["lm_head.weight"] is tied.tensors["wte.weight"]
