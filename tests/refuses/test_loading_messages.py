"""Refusals of a model folder that name the right thing: the index, the tensor, the link, the cache entry.

Before, each of these was blamed on something else, or named nothing a user could act on:

  * a shard index with an empty weight_map was blamed on config.json ("implies 37,120 weights ... the weight
    files hold 0"); now the index is named, as it is for a weight_map that is not an object or maps a tensor
    to something that is not a file name;
  * a tensor named "" was listed as `unexpected tensors ;`; now every name in a list is quoted ('');
  * a folder, a model.safetensors, a config.json, an index or a shard that is a link to nothing, or a symlink
    loop, was "does not exist" or "has no model.safetensors"; now the link and where it leads are named;
  * a Hugging Face cache entry with several snapshots and no refs/main was "neither a folder nor in the local
    Hugging Face cache"; now the snapshots are listed, and the user is told to pass the one they mean;
  * an empty model name was Path(""), the current folder, loaded if it held a model; now it is refused;
  * a tensor in two shards was "appears twice (with and without the 'transformer.' prefix?)"; now both files
    are named.

Each is checked through the API (the exact error type and one line) and, for each family, through
`python -m minirt.generate` in its own process: exit 2, one line on stderr, no traceback.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import minirt
from conftest import FIXTURES, ROOT
from minirt.errors import CheckpointError
from minirt.loading.checkpoint import load_checkpoint, resolve_model_folder

BASE = FIXTURES / "base"
SHARDED = FIXTURES / "sharded"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
SHARD_1, SHARD_2 = "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors"


def refusal(call, *args) -> str:
    """The one-line message of the CheckpointError that `call(*args)` raises."""
    with pytest.raises(CheckpointError) as exc:
        call(*args)
    message = str(exc.value)
    assert message and len(message.splitlines()) == 1 and "\n" not in message, message
    return message


def generate(model: str, env: dict | None = None) -> str:
    """`python -m minirt.generate --model MODEL --prompt hi --max-new-tokens 2` in its own process, which must
    refuse: exit 2, nothing on stdout, one line on stderr and no traceback.  Returns that line."""
    result = subprocess.run(
        [sys.executable, "-m", "minirt.generate", "--model", model, "--prompt", "hi"]
        + ["--max-new-tokens", "2", "--backend", "numpy"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
        env=None if env is None else {**os.environ, **env},
    )
    assert result.returncode == 2 and result.stdout == "", result
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    return result.stderr.rstrip("\n")


@pytest.fixture
def model_dir(tmp_path) -> Path:
    shutil.copytree(BASE, tmp_path / "model")
    return tmp_path / "model"


@pytest.fixture
def sharded_dir(tmp_path) -> Path:
    shutil.copytree(SHARDED, tmp_path / "sharded")
    return tmp_path / "sharded"


# ---------------------------------------------------------------- the shard index


def write_index(folder: Path, weight_map) -> Path:
    (folder / INDEX).write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map})
    )
    return folder / INDEX


def test_an_empty_weight_map_is_blamed_on_the_index_not_on_config_json(sharded_dir):
    index = write_index(sharded_dir, {})
    message = refusal(load_checkpoint, sharded_dir)
    assert message == (
        f"{index}: its weight_map is empty, so it names no shard; re-download the model (its index and shards)"
    )
    assert "config.json" not in message and "implies" not in message


@pytest.mark.parametrize(
    "weight_map, kind",
    [
        (["model-00001-of-00003.safetensors"], "list"),
        ("x.safetensors", "str"),
        (None, "NoneType"),
        (3, "int"),
    ],
)
def test_a_weight_map_that_is_not_an_object_is_blamed_on_the_index(sharded_dir, weight_map, kind):
    index = write_index(sharded_dir, weight_map)
    assert refusal(load_checkpoint, sharded_dir) == (
        f"{index}: not a valid shard index (its weight_map is {kind}, not an object mapping tensor names "
        "to shard files)"
    )


@pytest.mark.parametrize("value", [5, None, True, 1.5, [SHARD_1], {"file": SHARD_1}])
def test_a_weight_map_value_that_is_not_a_file_name_is_blamed_on_the_index_naming_the_tensor(
    sharded_dir, value
):
    real = json.loads((sharded_dir / INDEX).read_text())["weight_map"]
    index = write_index(sharded_dir, {**real, "transformer.ln_f.bias": value})
    assert refusal(load_checkpoint, sharded_dir).startswith(
        f"{index}: refused shard name {value!r} for tensor 'transformer.ln_f.bias'; "
    )


def test_generate_blames_an_empty_weight_map_on_the_index(sharded_dir):
    index = write_index(sharded_dir, {})
    assert generate(
        str(sharded_dir)
    ) == f"minirt.generate: error: {index}: its weight_map is empty, " + (
        "so it names no shard; re-download the model (its index and shards)"
    )


def test_a_tensor_in_two_shards_names_both_files(sharded_dir):
    first = load_file(str(sharded_dir / SHARD_1))
    second = load_file(str(sharded_dir / SHARD_2))
    name = sorted(first)[0]
    save_file({**second, name: first[name]}, str(sharded_dir / SHARD_2))
    assert refusal(load_checkpoint, sharded_dir) == (
        f"{sharded_dir / SHARD_2}: tensor {name!r} is also in {sharded_dir / SHARD_1} (as {name!r}); "
        "a tensor belongs in one shard: re-download the model"
    )


# ---------------------------------------------------------------- tensor names, quoted


def add_tensors(folder: Path, extra: dict[str, np.ndarray]) -> None:
    """The base model's weights plus `extra`, written by the safetensors library."""
    tensors = load_file(str(BASE / WEIGHTS))
    save_file({**tensors, **extra}, str(folder / WEIGHTS), metadata={"format": "pt"})


@pytest.mark.parametrize(
    "names, listed",
    [
        ([""], "''"),
        (["x, y"], "'x, y'"),  # one name with a comma, not two names
        ([" "], "' '"),
        (["", "a", "b", "c", "d"], "'', 'a', 'b', 'c' and 1 more"),
    ],
    ids=["empty", "comma", "space", "five"],
)
def test_unexpected_tensor_names_are_quoted_so_that_each_shows(model_dir, names, listed):
    add_tensors(model_dir, {name: np.zeros(1, np.float32) for name in names})
    assert refusal(load_checkpoint, model_dir) == (
        f"{model_dir}: unexpected tensors {listed}; this is not a GPT2LMHeadModel checkpoint"
    )


def test_missing_tensor_names_are_quoted(model_dir):
    tensors = load_file(str(BASE / WEIGHTS))
    del tensors["transformer.ln_f.bias"], tensors["transformer.h.0.ln_1.bias"]
    save_file(tensors, str(model_dir / WEIGHTS))
    assert refusal(load_checkpoint, model_dir) == (
        f"{model_dir}: missing tensors 'h.0.ln_1.bias', 'ln_f.bias' (2 of 28); "
        "the checkpoint is incomplete or for another architecture"
    )


def test_missing_shard_names_are_quoted(sharded_dir):
    (sharded_dir / SHARD_2).unlink()
    assert refusal(load_checkpoint, sharded_dir) == (
        f"{sharded_dir / INDEX} names shards that are missing: '{SHARD_2}'; re-download the model"
    )


def test_generate_shows_a_tensor_named_the_empty_string(model_dir):
    add_tensors(model_dir, {"": np.zeros(1, np.float32)})
    assert generate(str(model_dir)).endswith(
        f"{model_dir}: unexpected tensors ''; this is not a GPT2LMHeadModel checkpoint"
    )


# ---------------------------------------------------------------- links to nothing, and loops


def break_link(folder: Path, what: str) -> tuple[Path, str]:
    """Make one file (or the folder) of a model a link to nothing, or a loop; (what --model gets, the words the
    refusal must hold)."""
    if what in ("folder_to_nothing", "folder_loop"):
        link = folder.parent / "link"
        if what == "folder_to_nothing":
            link.symlink_to(folder.parent / "gone")
            return (
                link,
                f"model folder {link} is a link to {folder.parent / 'gone'}, which does not exist",
            )
        link.symlink_to(link)
        return link, f"model folder {link} is a symlink loop"
    name = {"weights": WEIGHTS, "config": "config.json", "index": INDEX, "shard": SHARD_2}[
        what.split("_")[0]
    ]
    link = folder / name
    link.unlink()
    if what.endswith("_loop"):  # two links that lead to each other
        (folder / "other").symlink_to(link)
        link.symlink_to(folder / "other")
        words = f"{link} is a symlink loop"
    elif what.endswith("_too_long"):  # a target the system cannot even look up
        link.symlink_to(folder / ("x" * 300))
        words = f"{link} is a link to {folder / ('x' * 300)}, which cannot be reached (File name too long)"
    else:
        link.symlink_to(folder / "blobs" / "gone")
        words = f"{link} is a link to {folder / 'blobs' / 'gone'}, which does not exist"
    if what.startswith("shard") and what.endswith("_loop"):
        words = f"{folder / INDEX}: refused shard '{SHARD_2}': {words}"
    return folder, words


@pytest.mark.parametrize(
    "what",
    [
        "folder_to_nothing",
        "folder_loop",
        "weights_to_nothing",
        "weights_loop",
        "weights_too_long",
        "config_to_nothing",
        "config_loop",
        "index_to_nothing",
        "shard_to_nothing",
        "shard_loop",
    ],
)
def test_a_link_to_nothing_or_a_loop_is_named_as_such(tmp_path, what, monkeypatch):
    monkeypatch.chdir(tmp_path)  # so that a hub-id-like name is not found in the cwd
    folder = tmp_path / "m"
    shutil.copytree(SHARDED if what.startswith(("index", "shard")) else BASE, folder)
    model, words = break_link(folder, what)
    message = refusal(load_checkpoint, model)
    assert words in message, message
    assert "has no model.safetensors" not in message and "no config.json here" not in message, (
        message
    )
    assert f"{model} does not exist" not in message, message


def test_a_plain_missing_path_is_not_called_a_link(tmp_path):
    """The controls for the wording above: a folder, a config.json or weights that are simply absent."""
    assert refusal(load_checkpoint, tmp_path / "nope") == (
        f"model folder {tmp_path / 'nope'} does not exist; check the path, or pass a hub id such as gpt2"
    )
    folder = tmp_path / "m"
    shutil.copytree(BASE, folder)
    (folder / "config.json").unlink()
    assert refusal(load_checkpoint, folder) == (
        f"{folder / 'config.json'}: no config.json here; a model folder needs config.json beside its weights"
    )
    shutil.copy(BASE / "config.json", folder / "config.json")
    (folder / WEIGHTS).unlink()
    assert refusal(load_checkpoint, folder) == (
        f"{folder} has no {WEIGHTS} (nor {INDEX}); a model folder needs its weights in safetensors"
    )


def test_links_that_lead_to_a_model_still_load(tmp_path):
    """The positive control: a folder that is a link to a model, whose files are links to real files."""
    real = tmp_path / "real"
    shutil.copytree(BASE, real)
    (tmp_path / "files").mkdir()
    for name in ("config.json", WEIGHTS):
        shutil.move(real / name, tmp_path / "files" / name)
        (real / name).symlink_to(tmp_path / "files" / name)
    (tmp_path / "link").symlink_to(real)
    assert load_checkpoint(tmp_path / "link").config.n_layer == 2


@pytest.mark.parametrize("what", ["folder_to_nothing", "weights_to_nothing", "config_loop"])
def test_generate_names_the_broken_link(tmp_path, what):
    folder = tmp_path / "m"
    shutil.copytree(BASE, folder)
    model, words = break_link(folder, what)
    line = generate(str(model))
    assert line.startswith("minirt.generate: error: ") and words in line, line


# ---------------------------------------------------------------- the Hugging Face cache


def cache_entry(root: Path, snapshots: list[str], ref: str | None = None) -> Path:
    """models--someone--tiny under root, with these snapshots of the base model, and refs/main if `ref`."""
    repo = root / "models--someone--tiny"
    for commit in snapshots:
        shutil.copytree(BASE, repo / "snapshots" / commit)
    if ref is not None:
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text(ref)
    return repo


@pytest.fixture
def hub(tmp_path, monkeypatch) -> Path:
    """An empty HF_HUB_CACHE, and nothing in HF_HOME or the home folder."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path / "hub"


def test_a_cache_entry_with_two_snapshots_and_no_refs_main_lists_them(hub):
    repo = cache_entry(hub, ["3f2a", "9bc1"])
    assert refusal(resolve_model_folder, "someone/tiny") == (
        f"{repo} has 2 snapshots ('3f2a', '9bc1') and no refs/main to say which is current; "
        f"pass the snapshot folder you mean, such as {repo / 'snapshots' / '9bc1'}"
    )


def test_a_cache_entry_with_many_snapshots_lists_the_first_few(hub):
    repo = cache_entry(hub, [f"c{i}" for i in range(6)])
    assert f"{repo} has 6 snapshots ('c0', 'c1', 'c2', 'c3' and 2 more)" in refusal(
        load_checkpoint, "someone/tiny"
    )


def test_one_snapshot_or_a_refs_main_chooses(hub):
    """The positive controls: refs/main names the snapshot; without it, a single snapshot is the one."""
    repo = cache_entry(hub, ["old", "new"], ref="new\n")
    assert resolve_model_folder("someone/tiny") == repo / "snapshots" / "new"
    shutil.rmtree(repo)
    repo = cache_entry(hub, ["only"])
    assert resolve_model_folder("someone/tiny") == repo / "snapshots" / "only"


def test_an_unambiguous_entry_in_a_later_cache_is_still_found(hub, tmp_path):
    """An entry minirt cannot choose in is skipped like a missing one; the refusal is for when nothing else has
    the model."""
    cache_entry(hub, ["a", "b"])
    later = cache_entry(tmp_path / "hf_home" / "hub", ["only"])
    assert resolve_model_folder("someone/tiny") == later / "snapshots" / "only"


def test_refs_main_naming_a_missing_snapshot_is_said_where_looked(hub):
    repo = cache_entry(hub, ["old"], ref="gone")
    assert f"{repo / 'snapshots' / 'gone'} (named by refs/main, but missing)" in refusal(
        resolve_model_folder, "someone/tiny"
    )


def test_generate_lists_the_snapshots_of_an_ambiguous_entry(tmp_path):
    repo = cache_entry(tmp_path / "hub", ["3f2a", "9bc1"])
    env = {
        "HF_HUB_CACHE": str(tmp_path / "hub"),
        "HF_HOME": str(tmp_path / "x"),
        "HOME": str(tmp_path / "y"),
    }
    assert generate("someone/tiny", env) == (
        f"minirt.generate: error: {repo} has 2 snapshots ('3f2a', '9bc1') and no refs/main to say which is "
        f"current; pass the snapshot folder you mean, such as {repo / 'snapshots' / '9bc1'}"
    )


# ---------------------------------------------------------------- an empty name


@pytest.mark.parametrize(
    "load", [resolve_model_folder, load_checkpoint, minirt.LLM], ids=["resolve", "load", "LLM"]
)
def test_an_empty_model_name_is_refused_even_inside_a_model_folder(model_dir, monkeypatch, load):
    """Path("") is the current folder: before, "" loaded whatever model lay there."""
    monkeypatch.chdir(model_dir)
    assert (
        refusal(load, "") == "the model name is empty; pass a model folder or a hub id such as gpt2"
    )


def test_generate_refuses_an_empty_model_name():
    line = generate("")
    assert line.startswith("minirt.generate: error: ") and "empty" in line, line


@pytest.mark.parametrize(
    "name", ["generation_config.json", "tokenizer.json", "vocab.json", "merges.txt"]
)
@pytest.mark.parametrize("kind", ["to_nothing", "loop"])
def test_an_optional_file_that_is_a_broken_link_is_named_not_taken_as_absent(model_dir, name, kind):
    """generation_config.json and the tokenizer files may be absent (greedy defaults; token-id prompts), so a
    link to nothing there used to read as "no such file" and the model ran without them."""
    from minirt import LLM
    from minirt.errors import MinirtError

    link = model_dir / name
    if kind == "loop":
        (model_dir / "other").symlink_to(link)
        link.symlink_to(model_dir / "other")
        words = f"{link} is a symlink loop"
    else:
        link.symlink_to(model_dir / "gone")
        words = f"{link} is a link to {model_dir / 'gone'}, which does not exist"
    with pytest.raises(MinirtError) as refused:
        LLM(model_dir, backend="numpy")
    message = str(refused.value)
    assert "\n" not in message and message.startswith(words), message


# ---------------------------------------------------------------- folders, FIFOs and devices where a file belongs


def make_not_a_file(path: Path, kind: str) -> str:
    """Put something that is no regular file at `path` (replacing what is there); the words that say what it
    is.  A FIFO is never opened by the code under test, else these tests would hang."""
    if path.is_file():
        path.unlink()
    if kind == "folder":
        path.mkdir()
        return "is a folder"
    if kind == "fifo":
        os.mkfifo(path)
        return "is a FIFO"
    # A link to a folder: followed, it is a folder.
    (path.parent / "elsewhere").mkdir()
    path.symlink_to(path.parent / "elsewhere")
    return "is a folder"


NOT_A_FILE_KINDS = ["folder", "fifo", "link_to_folder"]


@pytest.mark.parametrize("kind", NOT_A_FILE_KINDS)
@pytest.mark.parametrize(
    "name", ["tokenizer.json", "vocab.json", "merges.txt", "encoder.json", "vocab.bpe"]
)
def test_a_tokenizer_file_that_is_no_regular_file_is_named_not_taken_as_absent(
    model_dir, name, kind
):
    """Before, is_file() was false for each of these and the folder read as one without a tokenizer."""
    from minirt.errors import TokenizerError
    from minirt.loading.tokenizer import read_tokenizer_files

    words = make_not_a_file(model_dir / name, kind)
    with pytest.raises(TokenizerError) as refused:
        read_tokenizer_files(model_dir)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(
        f"{model_dir / name} {words}, not a tokenizer file; "
    ), message


@pytest.mark.parametrize(
    "present, absent",
    [
        ("vocab.json", "merges.txt"),
        ("merges.txt", "vocab.json"),
        ("encoder.json", "vocab.bpe"),
        ("vocab.bpe", "encoder.json"),
    ],
)
def test_one_half_of_a_bpe_pair_is_named_not_taken_as_no_tokenizer(model_dir, present, absent):
    from minirt.errors import TokenizerError
    from minirt.loading.tokenizer import read_tokenizer_files

    (model_dir / present).write_text("{}")
    with pytest.raises(TokenizerError) as refused:
        read_tokenizer_files(model_dir)
    assert str(refused.value) == (
        f"{model_dir} has {present} but no {absent} beside it; a GPT-2 byte-level BPE needs both "
        "(or a tokenizer.json)"
    )


def test_a_folder_with_no_tokenizer_file_at_all_still_has_none(model_dir):
    """The control for the two tests above: nothing there is still "no tokenizer", not an error."""
    from minirt.loading.tokenizer import read_tokenizer_files

    assert read_tokenizer_files(model_dir) is None


@pytest.mark.parametrize("kind", NOT_A_FILE_KINDS)
def test_weights_that_are_no_regular_file_are_named_not_reported_absent(model_dir, kind):
    words = make_not_a_file(model_dir / WEIGHTS, kind)
    message = refusal(load_checkpoint, model_dir)
    assert message.startswith(f"{model_dir / WEIGHTS} {words}, not a safetensors file; "), message
    assert "has no model.safetensors" not in message, message


@pytest.mark.parametrize("kind", NOT_A_FILE_KINDS)
def test_an_index_that_is_no_regular_file_is_named_not_reported_absent(sharded_dir, kind):
    words = make_not_a_file(sharded_dir / INDEX, kind)
    message = refusal(load_checkpoint, sharded_dir)
    assert message.startswith(f"{sharded_dir / INDEX} {words}, not a shard index; "), message
    assert "has no model.safetensors" not in message, message


@pytest.mark.parametrize("kind", NOT_A_FILE_KINDS)
def test_a_shard_that_is_no_regular_file_is_named_not_reported_missing(sharded_dir, kind):
    words = make_not_a_file(sharded_dir / SHARD_2, kind)
    message = refusal(load_checkpoint, sharded_dir)
    assert message.startswith(f"{sharded_dir / SHARD_2} {words}, not a safetensors file; "), message
    assert "missing" not in message, message


def test_generate_names_weights_that_are_a_fifo(model_dir):
    make_not_a_file(model_dir / WEIGHTS, "fifo")
    assert generate(str(model_dir)) == (
        f"minirt.generate: error: {model_dir / WEIGHTS} is a FIFO, not a safetensors file; "
        "remove it, or re-download the model"
    )


@pytest.mark.parametrize("kind", [*NOT_A_FILE_KINDS, "link_to_dev_zero"])
def test_a_generation_config_that_is_no_regular_file_says_what_it_is(model_dir, kind):
    """Before: "[Errno 0] not a regular file of at most 16 MiB", the same for a folder, a FIFO and /dev/zero."""
    from minirt import LLM

    path = model_dir / "generation_config.json"
    if kind == "link_to_dev_zero":
        path.symlink_to("/dev/zero")
        words = "a character device"
    else:
        words = make_not_a_file(path, kind).removeprefix("is ")
    message = refusal(LLM, model_dir)
    assert (
        message == f"{path}: {words}, not a regular file of at most 16 MiB; fix or remove the file"
    ), message
    assert "Errno" not in message


def test_a_config_json_that_is_a_fifo_says_what_it_is(model_dir):
    make_not_a_file(model_dir / "config.json", "fifo")
    assert refusal(load_checkpoint, model_dir) == (
        f"{model_dir / 'config.json'}: cannot read config (a FIFO, not a regular file of at most 16 MiB)"
    )


def with_metadata(folder: Path, metadata_json: str) -> Path:
    """The base model's weights file with its header's __metadata__ replaced by this JSON text."""
    path = folder / WEIGHTS
    data = path.read_bytes()
    header_len = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + header_len])
    header.pop("__metadata__", None)
    text = '{"__metadata__": ' + metadata_json + ", " + json.dumps(header)[1:]
    # Padded with spaces to a multiple of 8, as the format's writers do.
    text += " " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text.encode() + data[8 + header_len :])
    return path


@pytest.mark.parametrize(
    "metadata, words",
    [
        ("null", "__metadata__ is null, not a map of strings to strings"),
        (
            '{"format": {"a": "b"}}',
            """__metadata__ maps 'format' to {"a": "b"}, which is not a string""",
        ),
        ('{"format": NaN}', "__metadata__ maps 'format' to NaN, which is not a string"),
        (
            '{"format": ["pt", true]}',
            """__metadata__ maps 'format' to ["pt", true], which is not a string""",
        ),
    ],
    ids=["null", "object", "nan", "list"],
)
def test_a_bad_metadata_value_is_shown_as_json(model_dir, metadata, words):
    """Before: None, {'a': 'b'}, nan, ['pt', True]: Python's repr of what the file writes as JSON."""
    path = with_metadata(model_dir, metadata)
    assert refusal(load_checkpoint, model_dir) == (
        f"{path}: {words}; the file is damaged or not safetensors"
    )
