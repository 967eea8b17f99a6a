"""Checkpoint loading: where models are found, zero-copy reads, and one-line errors for bad ones."""

import json
import shutil
import struct

import numpy as np
import pytest

import minirt
from conftest import FIXTURES
from minirt.loading.checkpoint import load_checkpoint, resolve_model_folder
from minirt.errors import CheckpointError


@pytest.fixture
def model_dir(tmp_path):
    """A writable copy of the base fixture."""
    target = tmp_path / "model"
    shutil.copytree(FIXTURES / "base", target)
    return target


def write_safetensors(path, tensors, dtype_codes=None):
    """A hand-written safetensors file (no library), so the format is checked independently."""
    dtype_codes = dtype_codes or {}
    header, blobs, offset = {}, [], 0
    for name, array in tensors.items():
        data = np.ascontiguousarray(array).tobytes()
        code = dtype_codes.get(
            name, {np.float32: "F32", np.float16: "F16", np.int64: "I64"}[array.dtype.type]
        )
        header[name] = {
            "dtype": code,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    header_bytes = json.dumps(header).encode()
    header_bytes += b" " * (-len(header_bytes) % 8)
    path.write_bytes(struct.pack("<Q", len(header_bytes)) + header_bytes + b"".join(blobs))


def assert_one_line_error(exc_info, *fragments):
    message = str(exc_info.value)
    assert "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, message


# ---------------------------------------------------------------- finding models


def test_missing_folder(tmp_path):
    with pytest.raises(CheckpointError) as exc:
        load_checkpoint(tmp_path / "nope")
    assert_one_line_error(exc, "does not exist")


def test_missing_config(model_dir):
    (model_dir / "config.json").unlink()
    with pytest.raises(CheckpointError) as exc:
        load_checkpoint(model_dir)
    assert_one_line_error(exc, "config.json")


def test_missing_weights_file(model_dir):
    (model_dir / "model.safetensors").unlink()
    with pytest.raises(CheckpointError) as exc:
        load_checkpoint(model_dir)
    assert_one_line_error(exc, "model.safetensors")


def test_pytorch_bin_only_says_how_to_convert(model_dir):
    (model_dir / "model.safetensors").rename(model_dir / "pytorch_model.bin")
    with pytest.raises(CheckpointError) as exc:
        load_checkpoint(model_dir)
    assert_one_line_error(exc, "pytorch_model.bin", "safe_serialization=True")


def test_missing_shard(tmp_path):
    target = tmp_path / "sharded"
    shutil.copytree(FIXTURES / "sharded", target)
    (target / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(CheckpointError) as exc:
        load_checkpoint(target)
    assert_one_line_error(exc, "model-00002-of-00003.safetensors", "missing")


def make_hub_cache(root, repo_id, source, commit="abc123", with_ref=True):
    repo = root / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    shutil.copytree(source, snapshot)
    if with_ref:
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text(commit)
    return snapshot


def test_hub_id_found_in_hf_hub_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    snapshot = make_hub_cache(cache, "openai-community/gpt2", FIXTURES / "base")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert resolve_model_folder("openai-community/gpt2") == snapshot
    assert resolve_model_folder("gpt2") == snapshot  # the bare id finds the moved repo
    model = minirt.load_model("gpt2")
    assert model.config.n_layer == 2


def test_refs_main_picks_the_snapshot(tmp_path, monkeypatch):
    cache = tmp_path / "hf_home" / "hub"
    make_hub_cache(cache, "someone/tiny", FIXTURES / "odd_heads", commit="old", with_ref=False)
    current = make_hub_cache(cache, "someone/tiny", FIXTURES / "base", commit="new", with_ref=False)
    (cache / "models--someone--tiny" / "refs").mkdir()
    (cache / "models--someone--tiny" / "refs" / "main").write_text("new\n")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    assert resolve_model_folder("someone/tiny") == current


def test_search_order_hf_hub_cache_before_hf_home(tmp_path, monkeypatch):
    first = make_hub_cache(tmp_path / "a", "gpt2", FIXTURES / "base")
    make_hub_cache(tmp_path / "b" / "hub", "gpt2", FIXTURES / "odd_heads")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "a"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "b"))
    assert resolve_model_folder("gpt2") == first


def test_home_cache_is_the_last_resort(tmp_path, monkeypatch):
    snapshot = make_hub_cache(
        tmp_path / "home" / ".cache" / "huggingface" / "hub", "distilgpt2", FIXTURES / "base"
    )
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert resolve_model_folder("distilgpt2") == snapshot


def test_unknown_hub_id_lists_every_place_looked(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "c1"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "c2"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with pytest.raises(CheckpointError) as exc:
        resolve_model_folder("gpt2")
    assert_one_line_error(
        exc,
        str(tmp_path / "c1" / "models--gpt2"),
        str(tmp_path / "c1" / "models--openai-community--gpt2"),
        str(tmp_path / "c2" / "hub" / "models--gpt2"),
        str(tmp_path / "home" / ".cache" / "huggingface" / "hub" / "models--gpt2"),
        "never downloads",
    )


# ---------------------------------------------------------------- reading weights


def test_fp32_weights_are_memory_mapped_not_copied():
    ckpt = load_checkpoint(FIXTURES / "base")
    for name, array in ckpt.tensors.items():
        assert not array.flags.owndata and not array.flags.writeable, name
        base = array
        while base.base is not None and not isinstance(base, np.memmap):
            base = base.base
        assert isinstance(base, np.memmap), name
    model = minirt.load_model(FIXTURES / "base")
    for (
        name,
        array,
    ) in model.params.items():  # fp32 file, fp32 compute: the model holds the mapped bytes
        assert not array.flags.owndata and not array.flags.writeable, name
    assert "wte.weight" not in model.params and "lm_head.weight" not in model.params
    assert (
        model.wte_t is model.head_weight
    )  # tied: one [C, V] array is both the head and the embeddings
    assert model.head_weight.flags.c_contiguous and model.head_weight.dtype == np.float32
    np.testing.assert_array_equal(model.head_weight, ckpt.tensors["wte.weight"].T)


def test_an_untied_head_and_its_embeddings_are_two_arrays():
    ckpt = load_checkpoint(FIXTURES / "untied_head")
    wte, head = ckpt.tensors["wte.weight"], ckpt.tensors["lm_head.weight"]
    assert not np.array_equal(wte, head)  # the fixture's head really differs from its embeddings
    for dtype in ("float32", "float16"):
        model = minirt.load_model(ckpt, dtype=dtype)
        assert model.wte_t is not model.head_weight and model.wte_t.dtype == np.dtype(dtype)
        assert model.head_weight.dtype == np.float32 and model.head_weight.flags.c_contiguous
        np.testing.assert_array_equal(model.head_weight, head.T.astype(np.float32))
        np.testing.assert_array_equal(model.wte_t, wte.T.astype(dtype))
        assert model.n_params == sum(a.size for a in ckpt.tensors.values()), (
            dtype
        )  # both tables counted


def test_loaded_values_equal_the_safetensors_library():
    from safetensors.numpy import load_file

    for name in ("base", "fp16_file", "sharded"):
        ckpt = load_checkpoint(FIXTURES / name)
        library = {}
        for path in sorted((FIXTURES / name).glob("*.safetensors")):
            library.update(load_file(str(path)))
        for key, value in library.items():
            canonical = key.removeprefix("transformer.")
            if canonical in ckpt.tensors:
                assert np.array_equal(ckpt.tensors[canonical], value), (name, key)


def test_bf16_is_widened_exactly(tmp_path):
    words = np.array(
        [0x3F80, 0xC000, 0x3EAA, 0x7F80], dtype=np.uint16
    )  # 1.0, -2.0, 0.33203125, +inf
    from minirt.loading.checkpoint import bf16_to_float32

    assert bf16_to_float32(words).tolist() == [1.0, -2.0, 0.33203125, float("inf")]


def test_truncated_file(model_dir):
    data = (model_dir / "model.safetensors").read_bytes()
    (model_dir / "model.safetensors").write_bytes(data[: len(data) - 100])
    with pytest.raises(CheckpointError) as exc:
        load_checkpoint(model_dir)
    assert_one_line_error(exc, "truncated", "model.safetensors")


def test_file_cut_inside_its_header(model_dir):
    data = (model_dir / "model.safetensors").read_bytes()
    (model_dir / "model.safetensors").write_bytes(data[:50])
    with pytest.raises(CheckpointError) as exc:
        load_checkpoint(model_dir)
    assert_one_line_error(exc, "truncated")


def test_not_a_safetensors_file(model_dir):
    (model_dir / "model.safetensors").write_bytes(
        b"\x10\x00\x00\x00\x00\x00\x00\x00this is not json at all!"
    )
    with pytest.raises(CheckpointError) as exc:
        load_checkpoint(model_dir)
    assert_one_line_error(exc, "not a safetensors file")


def rewrite(model_dir, change):
    """Load the base fixture's tensors, apply `change(dict)`, write them back by hand."""
    from safetensors.numpy import load_file

    tensors = load_file(str(model_dir / "model.safetensors"))
    codes = change(tensors) or {}
    write_safetensors(model_dir / "model.safetensors", tensors, codes)


def test_wrong_shape(model_dir):
    rewrite(
        model_dir,
        lambda t: t.update({"transformer.h.1.mlp.c_fc.weight": np.zeros((32, 100), np.float32)}),
    )
    with pytest.raises(CheckpointError) as exc:
        load_checkpoint(model_dir)
    assert_one_line_error(exc, "transformer.h.1.mlp.c_fc.weight", "[32, 100]", "[32, 128]")


def test_missing_tensor(model_dir):
    rewrite(model_dir, lambda t: [t.pop("transformer.ln_f.bias"), None][1])
    with pytest.raises(CheckpointError) as exc:
        load_checkpoint(model_dir)
    assert_one_line_error(exc, "missing tensors 'ln_f.bias'")


def test_unexpected_tensor(model_dir):
    rewrite(
        model_dir,
        lambda t: t.update({"multiple_choice_head.summary.weight": np.zeros((1, 32), np.float32)}),
    )
    with pytest.raises(CheckpointError) as exc:
        load_checkpoint(model_dir)
    assert_one_line_error(exc, "unexpected tensors 'multiple_choice_head.summary.weight'")


def test_wrong_dtype(model_dir):
    rewrite(
        model_dir,
        lambda t: t.update(
            {"transformer.wpe.weight": t["transformer.wpe.weight"].astype(np.int64)}
        ),
    )
    with pytest.raises(CheckpointError) as exc:
        load_checkpoint(model_dir)
    assert_one_line_error(exc, "transformer.wpe.weight", "I64", "F32, F16 and BF16")


def test_duplicate_names_with_and_without_prefix(model_dir):
    rewrite(model_dir, lambda t: t.update({"wpe.weight": t["transformer.wpe.weight"]}))
    with pytest.raises(CheckpointError) as exc:
        load_checkpoint(model_dir)
    assert_one_line_error(exc, "appears twice")


# ---------------------------------------------------------------- config validation


def edit_config(model_dir, **changes):
    path = model_dir / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


@pytest.mark.parametrize(
    "option", ["scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "add_cross_attention"]
)
def test_unsupported_option_is_refused(model_dir, option):
    edit_config(model_dir, **{option: True})
    with pytest.raises(CheckpointError) as exc:
        load_checkpoint(model_dir)
    assert_one_line_error(exc, option, "does not implement")


@pytest.mark.parametrize("activation", ["relu", "silu", "quick_gelu"])
def test_unsupported_activation_is_refused(model_dir, activation):
    edit_config(model_dir, activation_function=activation)
    with pytest.raises(CheckpointError) as exc:
        load_checkpoint(model_dir)
    assert_one_line_error(exc, activation, "gelu_new")


@pytest.mark.parametrize(
    "changes, fragment",
    [
        ({"n_head": 5}, "divisible"),
        ({"n_embd": -4}, "n_embd must be a positive integer"),
        ({"n_layer": "2"}, "n_layer must be a positive integer"),
        ({"layer_norm_epsilon": -1}, "layer_norm_epsilon"),
        ({"model_type": "gemma"}, "which minirt does not run"),
        ({"vocab_size": None}, "vocab_size"),
        ({"scale_attn_weights": "yes"}, "scale_attn_weights must be true or false"),
    ],
)
def test_bad_config_fields(model_dir, changes, fragment):
    edit_config(model_dir, **changes)
    with pytest.raises(CheckpointError) as exc:
        load_checkpoint(model_dir)
    assert_one_line_error(exc, fragment)


def test_config_that_disagrees_with_weights(model_dir):
    edit_config(model_dir, n_positions=128)
    with pytest.raises(CheckpointError) as exc:
        load_checkpoint(model_dir)
    assert_one_line_error(exc, "wpe.weight", "do not belong together")


def test_invalid_json_config(model_dir):
    (model_dir / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError) as exc:
        load_checkpoint(model_dir)
    assert_one_line_error(exc, "not valid JSON", "line 1")


def test_n_inner_and_epsilon_are_honoured():
    ckpt = load_checkpoint(FIXTURES / "odd_heads")
    assert ckpt.config.n_inner == 72 and ckpt.tensors["h.0.mlp.c_fc.weight"].shape == (48, 72)
    assert load_checkpoint(FIXTURES / "erf_gelu_eps_noscale").config.layer_norm_epsilon == 1e-3


def test_n_ctx_spelling_is_accepted(model_dir):
    config = json.loads((model_dir / "config.json").read_text())
    config["n_ctx"] = config.pop("n_positions")
    (model_dir / "config.json").write_text(json.dumps(config))
    assert load_checkpoint(model_dir).config.n_positions == 64
