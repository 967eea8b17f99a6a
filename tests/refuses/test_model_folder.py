"""The model folder is a security boundary: a shard index may only name files inside it.

A hostile `model.safetensors.index.json` (absolute paths, `..`, symlinks that resolve outside, names that are not
strings) is refused with one line, and no file outside the folder is ever opened.  The positive controls load:
the sharded fixture itself, a shard in a subfolder, a symlink that stays inside, and a Hugging Face cache entry
whose snapshot files are symlinks into the repo's blobs/.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import minirt
import minirt.loading.checkpoint as checkpoint
from conftest import FIXTURES, ROOT, fake_hub_cache
from minirt.errors import CheckpointError

SHARDED = FIXTURES / "sharded"
INDEX = "model.safetensors.index.json"


def copy_sharded(folder: Path) -> dict:
    shutil.copytree(SHARDED, folder)
    return json.loads((folder / INDEX).read_text())


def point_first_shard_at(folder: Path, index: dict, name) -> None:
    """Make every tensor of the first shard come from `name` instead."""
    first = sorted(set(index["weight_map"].values()))[0]
    index["weight_map"] = {k: (name if v == first else v) for k, v in index["weight_map"].items()}
    (folder / INDEX).write_text(json.dumps(index))


@pytest.fixture
def opened(monkeypatch):
    """Every path whose header or bytes minirt reads, resolved."""
    paths = []
    read_header, memmap = checkpoint.read_safetensors_header, np.memmap

    def spy_header(path):
        paths.append(Path(path).resolve())
        return read_header(path)

    def spy_memmap(path, *args, **kwargs):
        paths.append(Path(path).resolve())
        return memmap(path, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "read_safetensors_header", spy_header)
    monkeypatch.setattr(checkpoint.np, "memmap", spy_memmap)
    return paths


def refused_without_reading_outside(folder: Path, opened: list) -> str:
    with pytest.raises(CheckpointError) as exc:
        minirt.load_checkpoint(folder)
    message = str(exc.value)
    assert "\n" not in message and "refused shard" in message, message
    assert all(p.is_relative_to(folder.resolve()) for p in opened), opened
    return message


hostile_names = st.one_of(
    st.builds(
        lambda parts: "/".join(parts),
        st.lists(st.sampled_from(["..", ".", "a", "b.safetensors"]), min_size=1, max_size=5).filter(
            lambda p: ".." in p
        ),
    ),
    st.sampled_from(["/etc/passwd", "/tmp/evil.safetensors", "//x.safetensors", "/"]),
    st.builds(lambda n: "../" * n + "outside.safetensors", st.integers(1, 6)),
    st.sampled_from([5, 0, -1, 3.5, None, True, "", {"a": 1}]),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(name=hostile_names)
def test_hostile_shard_names_are_refused_before_anything_is_opened(tmp_path_factory, opened, name):
    folder = tmp_path_factory.mktemp("model") / "m"
    index = copy_sharded(folder)
    outside = folder.parent / "outside.safetensors"
    shutil.copy(
        folder / sorted(set(index["weight_map"].values()))[0], outside
    )  # a real file, to tempt a read
    point_first_shard_at(folder, index, name)
    opened.clear()
    refused_without_reading_outside(folder, opened)


@pytest.mark.parametrize("target", ["sibling", "absolute_file", "chain"])
def test_symlinks_that_resolve_outside_are_refused(tmp_path, opened, target):
    folder = tmp_path / "m"
    index = copy_sharded(folder)
    first = sorted(set(index["weight_map"].values()))[0]
    outside = tmp_path / "elsewhere" / first
    outside.parent.mkdir()
    shutil.move(folder / first, outside)  # the real bytes now live outside the folder
    if target == "chain":  # inside -> inside -> outside
        (folder / "hop.safetensors").symlink_to(outside)
        (folder / first).symlink_to(folder / "hop.safetensors")
    else:
        (folder / first).symlink_to(
            outside if target == "absolute_file" else Path("..") / "elsewhere" / first
        )
    opened.clear()
    refused_without_reading_outside(folder, opened)


def test_names_inside_the_folder_still_load(tmp_path):
    folder = tmp_path / "m"
    index = copy_sharded(folder)
    first = sorted(set(index["weight_map"].values()))[0]
    (folder / "sub").mkdir()
    shutil.move(folder / first, folder / "sub" / first)
    (folder / first).symlink_to(Path("sub") / first)  # a symlink that stays inside
    point_first_shard_at(folder, index, f"./sub/{first}")
    want = minirt.load_model(SHARDED).logits([[1, 2, 3]])
    assert np.array_equal(minirt.load_model(folder).logits([[1, 2, 3]]), want)


def test_a_hugging_face_cache_entry_with_blob_symlinks_loads_and_cannot_leave_its_repo(
    tmp_path, monkeypatch
):
    repo, snapshot = fake_hub_cache(tmp_path, SHARDED, "models--someone--tiny-sharded")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    model = minirt.load_model("someone/tiny-sharded")
    assert np.array_equal(model.logits([[1, 2]]), minirt.load_model(SHARDED).logits([[1, 2]]))
    index = json.loads((snapshot / INDEX).read_text())
    (snapshot / INDEX).unlink()
    outside = tmp_path / "outside.safetensors"
    shutil.copy(SHARDED / sorted(set(index["weight_map"].values()))[0], outside)
    point_first_shard_at(snapshot, index, "../../../../outside.safetensors")
    with pytest.raises(CheckpointError, match="refused shard name"):
        minirt.load_model("someone/tiny-sharded")
    (snapshot / "escape.safetensors").symlink_to(outside)  # resolves outside the repo folder
    point_first_shard_at(snapshot, index, "escape.safetensors")
    with pytest.raises(CheckpointError, match="resolves outside the model folder"):
        minirt.load_model("someone/tiny-sharded")


def test_the_command_line_refuses_in_one_line(tmp_path):
    folder = tmp_path / "m"
    index = copy_sharded(folder)
    point_first_shard_at(folder, index, "/etc/passwd")
    (tmp_path / "p.jsonl").write_text('{"prompt": [1, 2]}\n')
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "minirt.generate",
            "--model",
            str(folder),
            "--prompts",
            str(tmp_path / "p.jsonl"),
            "--backend",
            "numpy",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "refused shard name '/etc/passwd'" in result.stderr


@pytest.mark.parametrize("case", ["nul_byte", "symlink_loop", "name_too_long", "deep_nesting"])
def test_names_the_system_cannot_look_up_are_refused_in_one_line(tmp_path, opened, case):
    folder = tmp_path / "m"
    index = copy_sharded(folder)
    if case == "deep_nesting":
        (folder / INDEX).write_text('{"weight_map": ' + "[" * 100_000 + "]" * 100_000 + "}")
        with pytest.raises(CheckpointError, match="not a valid shard index"):
            minirt.load_checkpoint(folder)
        return
    if case == "symlink_loop":
        (folder / "loop").symlink_to("loop")
    point_first_shard_at(
        folder,
        index,
        {"nul_byte": "a\x00b", "symlink_loop": "loop", "name_too_long": "x" * 300}[case],
    )
    opened.clear()
    refused_without_reading_outside(folder, opened)


def test_a_model_in_a_subfolder_of_a_cache_snapshot_loads(tmp_path):
    repo = tmp_path / "models--org--multi"
    sub = repo / "snapshots" / "abc" / "sub"
    sub.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for file in SHARDED.iterdir():  # sub/<file> -> ../../../blobs/<blob>
        shutil.copy(file, repo / "blobs" / f"blob-{file.name}")
        (sub / file.name).symlink_to(Path("..") / ".." / ".." / "blobs" / f"blob-{file.name}")
    assert np.array_equal(
        minirt.load_model(sub).logits([[3, 4]]), minirt.load_model(SHARDED).logits([[3, 4]])
    )
