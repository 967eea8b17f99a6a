"""The Llama family's own parts: its config read as transformers reads it (and refused where the
layers cannot honour it), RoPE from each token's own position, grouped-query attention's smaller
KV cache, and its checkpoints' names.  Logits against transformers are in
tests/reference/test_fixtures.py (every fixture folder, Llama-family ones included); the padded,
cached, permuted invariants run on random Llama-family models too (conftest's model_choice).

Expected values: transformers' fixtures, hand computations (cos and sin in float64, a rotation's
dot products), and invariants."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import FIXTURES, random_llama, relative_error
from minirt.errors import CheckpointError
from minirt.loading.checkpoint import load_checkpoint
from minirt.model.backend import numpy_backend
from minirt.model.batch import Batch
from minirt.model.fusion import elementwise_chains
from minirt.model.llama_config import LlamaConfig
from minirt.model.rope import RopeSettings, inverse_frequencies, rotary_tables, rotate

import minirt

BASE = {
    "model_type": "llama",
    "vocab_size": 100,
    "max_position_embeddings": 64,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def config(**changes) -> LlamaConfig:
    raw = {**BASE, **changes}
    return LlamaConfig.from_dict({k: v for k, v in raw.items() if v is not None}, "m/config.json")


# ------------------------------------------------------------------ config.json


def test_transformers_4_and_5_spell_the_same_rope():
    """Llama 3.2's config.json as the hub has it (transformers 4: rope_theta, rope_scaling with
    `type` or `rope_type`) and as transformers 5 writes it (rope_parameters) read alike."""
    scaling = {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    scaling["original_max_position_embeddings"] = 8192
    v4 = config(rope_theta=500000.0, rope_scaling={"rope_type": "llama3", **scaling})
    v4_old = config(rope_theta=500000.0, rope_scaling={"type": "llama3", **scaling})
    v5 = config(rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, **scaling})
    assert v4.rope == v4_old.rope == v5.rope
    assert v5.rope == RopeSettings(500000.0, "llama3", 32.0, 1.0, 4.0, 8192)
    assert config().rope == RopeSettings()


def test_a_top_level_rope_theta_counts_beside_rope_parameters_without_one():
    """transformers 5 folds a top-level rope_theta into rope_parameters that lack one."""
    both = config(rope_theta=50.0, rope_parameters={"rope_type": "default"})
    assert both.rope.theta == 50.0
    inner = config(rope_theta=50.0, rope_parameters={"rope_type": "default", "rope_theta": 7.0})
    assert inner.rope.theta == 7.0


def test_fields_left_out_take_transformers_defaults_for_the_model_type():
    """save_pretrained writes only what differs from the config class's defaults: Mistral's
    8 K/V heads and 4096 window, Qwen's 32 K/V heads, Qwen3's head_dim 128 (transformers 5.25's
    MistralConfig, Qwen2Config, Qwen3Config)."""
    wide = {"hidden_size": 256, "num_attention_heads": 32, "max_position_embeddings": 8192}
    mistral = config(model_type="mistral", num_key_value_heads=None, **wide)
    assert mistral.n_kv_head == 8 and mistral.n_positions == 4096
    qwen2 = config(model_type="qwen2", num_key_value_heads=None, **wide)
    assert qwen2.n_kv_head == 32 and qwen2.head_dim == 8
    qwen3 = config(model_type="qwen3", num_key_value_heads=None, **wide)
    assert qwen3.n_kv_head == 32 and qwen3.head_dim == 128
    llama = config(num_key_value_heads=None, **wide)
    assert llama.n_kv_head == 32 and llama.head_dim == 8
    # null keeps its meaning: K/V heads as many as the query heads, no window.
    explicit = {k: v for k, v in {**BASE, **wide}.items()}
    raw = {**explicit, "model_type": "mistral", "num_key_value_heads": None}
    nulls = LlamaConfig.from_dict({**raw, "sliding_window": None}, "config.json")
    assert nulls.n_kv_head == 32 and nulls.n_positions == 8192


def test_the_family_differences_are_read_from_model_type_and_flags():
    assert (config().qkv_bias, config().o_bias, config().qk_norm) == (False, False, False)
    qwen2 = config(model_type="qwen2")
    assert qwen2.qkv_bias and not qwen2.o_bias and not qwen2.qk_norm
    qwen3 = config(model_type="qwen3", head_dim=24)
    assert qwen3.qk_norm and qwen3.head_dim == 24 and qwen3.n_embd == 32
    llama_bias = config(attention_bias=True, mlp_bias=True)
    assert llama_bias.qkv_bias and llama_bias.o_bias and llama_bias.mlp_bias
    # No K/V head count: every query head has its own (Llama 2 7B).
    assert config(num_key_value_heads=None).n_kv_head == 4
    # Several end ids (Llama 3's config): all kept, the first is the id messages name.
    many = config(eos_token_id=[128001, 128008, 128009])
    assert many.eos_token_id == 128001 and many.eos_token_ids == (128001, 128008, 128009)


@pytest.mark.parametrize(
    "changes, fragment",
    [
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "rope_type 'yarn'"),
        ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope_scaling has rope_type"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"num_key_value_heads": 3}, "multiple of num_key_value_heads (3)"),
        ({"head_dim": 7}, "head_dim is 7"),
        ({"hidden_size": 30}, "hidden_size (30) must be divisible"),
        ({"pretraining_tp": 2}, "pretraining_tp"),
        ({"rms_norm_eps": 0}, "rms_norm_eps"),
        ({"intermediate_size": None}, "intermediate_size must be a positive integer"),
        ({"rope_parameters": {"rope_type": "linear"}}, "factor must be a positive number"),
        ({"tie_word_embeddings": "yes"}, "tie_word_embeddings must be true or false"),
        ({"is_encoder_decoder": True}, "is_encoder_decoder"),
    ],
)
def test_what_the_layers_cannot_compute_is_refused_naming_the_field(changes, fragment):
    with pytest.raises(CheckpointError) as refused:
        config(**changes)
    message = str(refused.value)
    assert message.startswith("m/config.json: ") and fragment in message and "\n" not in message


def test_a_sliding_window_shorter_than_the_context_becomes_the_context():
    """Mistral 7B v0.1: a 4096 window of a 32768 context.  A request within the window sees every
    key, as the window lets it; a longer one is refused as past the context."""
    mistral = config(model_type="mistral", max_position_embeddings=32768, sliding_window=4096)
    assert mistral.n_positions == 4096 and mistral.max_position_embeddings == 32768
    assert "sliding window" in mistral.summary
    # Off (Qwen's switch), absent or as long as the context: the context stays.
    qwen = config(model_type="qwen2", use_sliding_window=False, sliding_window=16)
    wide = config(model_type="mistral", sliding_window=64)
    assert qwen.n_positions == wide.n_positions == config(model_type="mistral").n_positions == 64
    assert config(model_type="qwen2", use_sliding_window=True, sliding_window=16).n_positions == 16


def test_n_weights_counts_what_the_checkpoint_holds():
    for name in ("llama_gqa2", "qwen2_bias", "qwen3_norms", "llama3_rope_scaling"):
        checkpoint = load_checkpoint(FIXTURES / name)
        tensors = {id(a): a for a in checkpoint.tensors.values()}.values()
        assert checkpoint.config.n_weights == sum(a.size for a in tensors), name


# ------------------------------------------------------------------ RoPE


def test_the_frequencies_are_one_over_theta_to_the_pair_index():
    frequencies = inverse_frequencies(RopeSettings(theta=10000.0), 8)
    want = [1.0, 10000 ** (-2 / 8), 10000 ** (-4 / 8), 10000 ** (-6 / 8)]
    assert np.allclose(frequencies, want, rtol=1e-6) and frequencies.dtype == np.float32


def test_llama3_scaling_keeps_high_frequencies_and_slows_low_ones():
    """Llama 3.1's rule by hand: a wavelength under original/high_freq_factor is kept, one over
    original/low_freq_factor is divided by the factor, those between are blended."""
    plain = RopeSettings(theta=500000.0)
    scaled = RopeSettings(500000.0, "llama3", 8.0, 1.0, 4.0, 64)
    before = inverse_frequencies(plain, 16).astype(np.float64)
    after = inverse_frequencies(scaled, 16).astype(np.float64)
    wavelengths = 2 * math.pi / before
    kept = wavelengths < 64 / 4
    slowed = wavelengths > 64 / 1
    assert kept.any() and slowed.any() and (~kept & ~slowed).any()
    assert np.allclose(after[kept], before[kept], rtol=1e-6)
    assert np.allclose(after[slowed], before[slowed] / 8, rtol=1e-6)
    middle = ~kept & ~slowed
    assert ((after[middle] < before[middle]) & (after[middle] > before[middle] / 8)).all()


def test_a_padded_rows_rotation_is_its_solo_rotation():
    """Row 1 (3 new tokens after 7 cached) padded beside a longer row: its tokens are turned by
    positions 7, 8, 9, its own, bitwise as alone, and as cos/sin of position * frequency."""
    backend = numpy_backend()
    frequencies = inverse_frequencies(RopeSettings(theta=10000.0), 8)
    padded = Batch([list(range(6)), [1, 2, 3]], backend, past_lens=[0, 7])
    solo = Batch([[1, 2, 3]], backend, past_lens=[7])
    assert padded.positions.tolist() == [0, 1, 2, 3, 4, 5, 7, 8, 9]
    in_batch = rotary_tables(np, frequencies, padded.device.positions, np.float32)
    alone = rotary_tables(np, frequencies, solo.device.positions, np.float32)
    assert np.array_equal(in_batch.cos[6:], alone.cos)
    assert np.array_equal(in_batch.signed_sin[6:], alone.signed_sin)
    angles = np.array([7, 8, 9], np.float64)[:, None] * frequencies.astype(np.float64)
    assert np.allclose(alone.cos[:, 0, :4], np.cos(angles), atol=1e-6)
    assert np.allclose(alone.signed_sin[:, 0, 4:], np.sin(angles), atol=1e-6)
    assert np.allclose(alone.signed_sin[:, 0, :4], -np.sin(angles), atol=1e-6)


@settings(max_examples=30, deadline=None)
@given(m=st.integers(0, 200), n=st.integers(0, 200), shift=st.integers(0, 200))
def test_a_rotated_query_key_product_depends_on_their_distance_alone(m, n, shift):
    """What RoPE is for: <rotate(q, m), rotate(k, n)> is a function of m - n."""
    rng = np.random.default_rng(m * 7919 + n)
    q = rng.standard_normal((1, 1, 16)).astype(np.float32)
    k = rng.standard_normal((1, 1, 16)).astype(np.float32)
    frequencies = inverse_frequencies(RopeSettings(theta=10000.0), 16)
    chains = elementwise_chains(np)

    def turned(x, position):
        tables = rotary_tables(np, frequencies, np.array([position]), np.float32)
        return rotate(np, chains, x, tables).astype(np.float64)

    here = (turned(q, m) * turned(k, n)).sum()
    there = (turned(q, m + shift) * turned(k, n + shift)).sum()
    assert abs(here - there) <= 1e-3 * max(1.0, abs(here))
    # A rotation keeps each pair's length.
    assert np.isclose(np.linalg.norm(turned(q, m)), np.linalg.norm(q), rtol=1e-5)


def test_positions_come_from_the_batch_metadata_not_the_padded_column():
    """The same sequence decoded one token at a time after its history (past_lens) gives the
    logits of scoring it whole: positions continue the slot's own history."""
    model = random_llama(seed=3)
    sequence = [5, 9, 2, 33, 7, 1, 18]
    whole = model.logits([sequence])[0]  # [T, V]
    cache = model.new_kv_cache(n_slots=2, capacity=16)
    # Slot 1, beside an empty slot 0, so that slot and row differ.
    model.forward(Batch([sequence[:4]], model.backend, slots=[1]), cache)
    for t in range(4, len(sequence)):
        batch = Batch([[sequence[t]]], model.backend, slots=[1], past_lens=[t])
        step = model.forward(batch, cache)  # [1, V]
        assert relative_error(step[0], whole[t]) <= 1e-5


# ------------------------------------------------------------------ grouped-query attention


def test_the_kv_cache_holds_kv_heads_only():
    """G K/V heads of H query heads: the cache is H / G times smaller than one per query head."""
    grouped = random_llama(seed=0, num_key_value_heads=1)
    full = random_llama(seed=0, num_key_value_heads=4)
    small = grouped.new_kv_cache(n_slots=2, capacity=8)
    large = full.new_kv_cache(n_slots=2, capacity=8)
    assert small.keys.shape[2] == 1 and large.keys.shape[2] == 4
    assert large.keys.nbytes == 4 * small.keys.nbytes


# ------------------------------------------------------------------ checkpoints


def test_llama_2s_rotary_buffers_are_skipped_and_a_foreign_tensor_is_named(tmp_path):
    from safetensors.numpy import load_file, save_file

    folder = tmp_path / "model"
    shutil.copytree(FIXTURES / "llama_gqa2", folder)
    tensors = load_file(folder / "model.safetensors")
    inv_freq = np.ones(8, np.float32)
    save_file(
        {**tensors, "model.layers.0.self_attn.rotary_emb.inv_freq": inv_freq},
        folder / "model.safetensors",
    )
    reference = minirt.load_model(FIXTURES / "llama_gqa2").logits([[1, 2, 3]])
    assert np.array_equal(minirt.load_model(folder).logits([[1, 2, 3]]), reference)
    save_file({**tensors, "transformer.wpe.weight": inv_freq}, folder / "model.safetensors")
    with pytest.raises(CheckpointError) as refused:
        load_checkpoint(folder)
    assert "'transformer.wpe.weight'" in str(refused.value)
    assert "not a LlamaForCausalLM checkpoint" in str(refused.value)


def test_a_qwen3_missing_its_norms_is_refused_naming_them(tmp_path):
    from safetensors.numpy import load_file, save_file

    folder = tmp_path / "model"
    shutil.copytree(FIXTURES / "qwen3_norms", folder)
    tensors = load_file(folder / "model.safetensors")
    kept = {name: array for name, array in tensors.items() if "q_norm" not in name}
    save_file(kept, folder / "model.safetensors")
    with pytest.raises(CheckpointError) as refused:
        load_checkpoint(folder)
    assert "missing tensors" in str(refused.value) and "q_norm" in str(refused.value)


def test_config_json_of_each_fixture_names_its_family():
    for name, architecture in [
        ("llama_gqa2", "LlamaForCausalLM"),
        ("mistral_gqa", "MistralForCausalLM"),
        ("qwen2_bias", "Qwen2ForCausalLM"),
        ("qwen3_norms", "Qwen3ForCausalLM"),
    ]:
        raw = json.loads((FIXTURES / name / "config.json").read_text())
        assert raw["architectures"] == [architecture]
        assert load_checkpoint(FIXTURES / name).config.architecture == architecture


def test_linear_scaling_divides_every_frequency_by_its_factor():
    plain = inverse_frequencies(RopeSettings(theta=10000.0), 8)
    linear = inverse_frequencies(RopeSettings(theta=10000.0, rope_type="linear", factor=4.0), 8)
    assert np.allclose(linear, plain / 4, rtol=1e-6)


ROTARY = json.loads((FIXTURES / "rope" / "rotary.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("shape", ROTARY["shapes"], ids=lambda shape: shape["name"])
def test_rotary_tables_are_transformers_at_real_shapes_and_long_positions(shape):
    """transformers' LlamaRotaryEmbedding (tests/fixtures/rope/rotary.json) at SmolLM2's,
    Qwen2.5's, Qwen3's, Llama 2's and Llama 3.2's shapes: the same frequencies to the last place
    (NumPy's float32 pow alone is a unit off for some pairs, and a position multiplies that), so
    cos and sin agree to a few 1e-6 out to position 131071."""
    raw = {**BASE, "hidden_size": 4 * shape["head_dim"], "head_dim": shape["head_dim"]}
    settings = LlamaConfig.from_dict({**raw, **shape["config"]}, "config.json").rope
    frequencies = inverse_frequencies(settings, shape["head_dim"])
    want = np.array(shape["inv_freq"], np.float32)
    assert (frequencies != want).sum() <= 1 and np.allclose(frequencies, want, rtol=1.2e-7)
    positions = np.array(ROTARY["positions"])
    tables = rotary_tables(np, frequencies, positions, np.float32)
    half = shape["head_dim"] // 2
    cos = np.array(shape["cos"], np.float32)  # [positions, D]
    sin = np.array(shape["sin"], np.float32)  # [positions, D]
    assert np.abs(tables.cos[:, 0] - cos).max() <= 5e-6
    assert np.abs(tables.signed_sin[:, 0, half:] - sin[:, half:]).max() <= 5e-6
    assert np.abs(tables.signed_sin[:, 0, :half] + sin[:, :half]).max() <= 5e-6
