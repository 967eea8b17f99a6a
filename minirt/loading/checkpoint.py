"""Finding a checkpoint on disk and reading its weights, zero-copy where possible.

Owns:
  * where a model name points: a folder, or a hub id looked up in the local
    Hugging Face cache (never the network); an empty name, a cache entry with
    several snapshots and no refs/main, and a folder, weights file, index or
    shard that is a link to nothing or a symlink loop are each refused naming
    that thing, as is a weights file, index or shard that is a folder, a FIFO,
    a device or a socket (said so, never "missing", never opened);
  * reading safetensors files (single or sharded) by memory-mapping them, so an
    fp32 checkpoint used in fp32 is never copied into memory by us, and a shard
    index's weight_map (an object of file names, not empty), blamed by name;
  * the canonical tensor names (GPT-2's `wte.weight`, `h.0.attn.c_attn.weight`, ...,
    without the `transformer.` prefix; the Llama family's `layers.0.mlp.up_proj.weight`, ...,
    without `model.`) and the shape every one must have (the family's, minirt/model/);
  * checking every tensor against the config: missing, unexpected, wrong shape,
    wrong dtype, in two shards, each reported in one line (tensor names quoted,
    so that a name such as '' shows).

Must not know: backends, compute dtypes or layers.  It hands back NumPy arrays in the file's own
precision (bf16 widened to fp32, since NumPy has no bf16); converting to the compute dtype is the
model's job.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..model.interface import ModelConfig
from ..model.registry import family_of
from .json_file import broken_link, not_a_regular_file, read_config, read_json_file
from ..errors import CheckpointError
from .safetensors_header import TensorEntry, read_safetensors_header

SINGLE_FILE = "model.safetensors"
SHARD_INDEX = "model.safetensors.index.json"
OTHER_WEIGHT_FILES = (
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "tf_model.h5",
    "flax_model.msgpack",
)

# Bare hub ids that Hugging Face has since moved under an organisation.
HUB_ALIASES = {
    "gpt2": "openai-community/gpt2",
    "gpt2-medium": "openai-community/gpt2-medium",
    "gpt2-large": "openai-community/gpt2-large",
    "gpt2-xl": "openai-community/gpt2-xl",
    "distilgpt2": "distilbert/distilgpt2",
}

# safetensors dtype code -> the little-endian NumPy dtype holding its bytes (BF16: raw words, see
# `bf16_to_float32`).
WEIGHT_DTYPES: dict[str, np.dtype] = {
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
}
# Old checkpoints' buffers, not learned: GPT-2's causal masks, Llama 2's rotary frequencies.
MASK_BUFFER_SUFFIXES = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")


def hub_cache_roots() -> list[Path]:
    """The local Hugging Face hub caches, in the order minirt searches them."""
    roots = []
    if os.environ.get("HF_HUB_CACHE"):
        roots.append(Path(os.environ["HF_HUB_CACHE"]).expanduser())
    if os.environ.get("HF_HOME"):
        roots.append(Path(os.environ["HF_HOME"]).expanduser() / "hub")
    roots.append(Path("~/.cache/huggingface/hub").expanduser())
    # A folder named twice is searched once, at its first place.
    return list(dict.fromkeys(roots))


def find_in_hub_cache(hub_id: str) -> tuple[Path | None, list[str]]:
    """Return (snapshot folder or None, every place looked at, for the error message).  A cache
    entry with several snapshots and no refs/main is skipped like a missing one, but when nothing
    else is found it is the refusal: the model is there, and the user must say which snapshot."""
    looked: list[str] = []
    ambiguous: list[str] = []
    short_names = {long: short for short, long in HUB_ALIASES.items()}
    other_name = HUB_ALIASES.get(hub_id) or short_names.get(hub_id)
    # Both 'gpt2' and 'openai-community/gpt2'.
    candidates = [hub_id] + ([other_name] if other_name else [])
    for root in hub_cache_roots():
        for candidate in candidates:
            repo_dir = root / ("models--" + candidate.replace("/", "--"))
            ref_file = repo_dir / "refs" / "main"
            if ref_file.is_file():
                # refs/main holds a commit.
                snapshot = repo_dir / "snapshots" / ref_file.read_text().strip()
                if snapshot.is_dir():
                    return snapshot, looked
                looked.append(f"{snapshot} (named by refs/main, but missing)")
                continue
            if repo_dir.is_dir():
                snapshots = sorted(p for p in (repo_dir / "snapshots").glob("*") if p.is_dir())
            else:
                snapshots = []
            # No refs/main, but only one snapshot: it is the one.
            if len(snapshots) == 1:
                return snapshots[0], looked
            # Several, and nothing to say which is current: guessing could load an old model.
            if len(snapshots) > 1:
                ambiguous.append(
                    f"{repo_dir} has {len(snapshots)} snapshots "
                    f"({describe_names([p.name for p in snapshots])}) and no refs/main to say "
                    f"which is current; pass the snapshot folder you mean, such as {snapshots[-1]}"
                )
            looked.append(str(repo_dir))
    if ambiguous:
        raise CheckpointError(ambiguous[0])
    return None, looked


# minirt/, which holds loading/.
PACKAGE = Path(__file__).resolve().parent.parent
# Installed (the build copies it), or a clone.
SHIPPED_WEIGHTS = [PACKAGE / "weights", PACKAGE.parent / "weights"]


def shipped_model_folder() -> Path:
    """The one model shipped with minirt, the default when none is given: weights/ inside the
    installed package, or the repository's weights/ when minirt runs from a clone."""
    for weights in SHIPPED_WEIGHTS:
        if found := sorted(p.parent for p in weights.glob("*/config.json")):
            if len(found) == 1:
                return found[0]
    raise CheckpointError(
        "no model given (--model), and no single model is shipped in weights/; "
        "pass a model folder or a hub id such as gpt2"
    )


def resolve_model_folder(model: str | os.PathLike) -> Path:
    """A folder path or a hub id -> the folder holding config.json and the weights."""
    text = str(model)
    # Path("") is the current folder: an empty name must not load whatever lies there.
    if not text:
        raise CheckpointError(
            "the model name is empty; pass a model folder or a hub id such as gpt2"
        )
    path = Path(text).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise CheckpointError(
            f"{path} is a file; --model takes a folder with config.json and model.safetensors, "
            "or a hub id"
        )
    # A link to a folder that is gone (or a loop) is not a folder that "does not exist".
    link_problem = broken_link(path)
    if link_problem:
        raise CheckpointError(
            f"model folder {link_problem}; point the link at the model folder, or pass the "
            "folder itself"
        )
    # Hub ids are "name" or "org/name".
    looks_like_path = text.startswith((".", "/", "~")) or text.count("/") > 1
    if looks_like_path:
        raise CheckpointError(
            f"model folder {path} does not exist; check the path, or pass a hub id such as gpt2"
        )
    snapshot, looked = find_in_hub_cache(text)
    if snapshot is None:
        raise CheckpointError(
            f"model {text!r} is neither a folder nor in the local Hugging Face cache "
            f"(looked in: {'; '.join(looked)}); minirt never downloads, so pass a folder, "
            "or set HF_HUB_CACHE/HF_HOME to the cache that has it"
        )
    return snapshot


def bf16_to_float32(words: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) -> float32: bf16 is the top half of an fp32."""
    # The same shape, a new fp32 array.
    return (words.astype(np.uint32) << 16).view(np.float32)


def map_tensor(file_map: np.ndarray, data_offset: int, entry: TensorEntry) -> np.ndarray:
    """A read-only NumPy view of one tensor inside a memory-mapped file (no copy)."""
    raw = file_map[data_offset + entry.start : data_offset + entry.end]  # [n_bytes] uint8
    storage = WEIGHT_DTYPES[entry.dtype]
    # A misaligned tensor: copy once to align it.
    if (raw.ctypes.data % storage.itemsize) != 0:
        raw = raw.copy()
    # entry.shape, in the file's precision.
    array = np.asarray(raw).view(storage).reshape(entry.shape)
    # NumPy has no bf16: the one copy.
    return bf16_to_float32(array) if entry.dtype == "BF16" else array


def describe_names(names: list[str], limit: int = 4) -> str:
    """The first few names, each quoted (so that '' and a name with a line break show as
    what they are), and how many more."""
    shown = ", ".join(repr(name) for name in sorted(names)[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


@dataclass
class Checkpoint:
    """A checked checkpoint: its folder, config and weights (NumPy, file precision)."""

    folder: Path
    config: ModelConfig
    # Canonical name -> array; "lm_head.weight" is always present.
    tensors: dict[str, np.ndarray]
    # Canonical name -> safetensors dtype code, for reports.
    file_dtypes: dict[str, str]
    # True when lm_head.weight was absent and the head is wte.
    head_is_tied: bool


def read_shard_names(index: Path) -> list[str]:
    """The shard files a shard index names, once each, or a one-line CheckpointError naming the
    index: its weight_map must be an object mapping tensor names to file names, and not empty."""
    try:
        raw = read_json_file(index)
    # ValueError: JSON and UTF-8 errors too.
    except (OSError, ValueError, RecursionError):
        raw = None
    if not isinstance(raw, dict) or "weight_map" not in raw:
        raise CheckpointError(
            f"{index}: not a valid shard index (expected a JSON object with a 'weight_map')"
        )
    weight_map = raw["weight_map"]
    if not isinstance(weight_map, dict):
        raise CheckpointError(
            f"{index}: not a valid shard index (its weight_map is {type(weight_map).__name__}, "
            "not an object mapping tensor names to shard files)"
        )
    # Else the config would be blamed: its weights are "not in the files", which hold none.
    if not weight_map:
        raise CheckpointError(
            f"{index}: its weight_map is empty, so it names no shard; re-download the model "
            "(its index and shards)"
        )
    for tensor, name in weight_map.items():
        if not isinstance(name, str):
            raise CheckpointError(
                f"{index}: refused shard name {name!r} for tensor {tensor!r}; a weight_map maps "
                "each tensor to the name of a file inside the model folder"
            )
    return sorted(set(weight_map.values()))


def refuse_unreadable(path: Path, what: str) -> None:
    """A weights file, index or shard (`what`: "a safetensors file", "a shard index") that is a
    link to nothing, a loop, a folder, a FIFO, a device or a socket, refused naming the path and
    what it is (else it would read as "not here").  Only looked at, never opened: a FIFO would
    block."""
    link_problem = broken_link(path)
    if link_problem:
        raise CheckpointError(f"{link_problem}; fix the link, or re-download the model")
    kind = not_a_regular_file(path)
    if kind:
        raise CheckpointError(f"{path} is {kind}, not {what}; remove it, or re-download the model")


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a folder: one file, or the shards its index names.  Each is a
    regular file once it is returned."""
    single = folder / SINGLE_FILE
    index = folder / SHARD_INDEX
    refuse_unreadable(single, "a safetensors file")
    if single.is_file():
        return [single]
    refuse_unreadable(index, "a shard index")
    if index.is_file():
        shards = [shard_inside(folder, name, index) for name in read_shard_names(index)]
        for shard in shards:
            refuse_unreadable(shard, "a safetensors file")
        missing = [p.name for p in shards if not p.is_file()]
        if missing:
            raise CheckpointError(
                f"{index} names shards that are missing: {describe_names(missing)}; "
                "re-download the model"
            )
        return shards
    others = [name for name in OTHER_WEIGHT_FILES if (folder / name).exists()]
    if others:
        raise CheckpointError(
            f"{folder} has {others[0]} but no {SINGLE_FILE}; minirt reads safetensors only: "
            "convert once with GPT2LMHeadModel.from_pretrained(folder)"
            ".save_pretrained(folder, safe_serialization=True)"
        )
    raise CheckpointError(
        f"{folder} has no {SINGLE_FILE} (nor {SHARD_INDEX}); "
        "a model folder needs its weights in safetensors"
    )


def model_boundary(folder: Path) -> Path:
    """What a model's files must stay inside: its folder, or a hub-cache snapshot's repo (files
    link to blobs/)."""
    repos = (
        p.parent
        for p in folder.parents
        if p.name == "snapshots" and p.parent.name.startswith("models--")
    )
    return next(repos, folder)


def shard_inside(folder: Path, name: str, index: Path) -> Path:
    """A shard the index names, refused before anything is opened unless it is a plain name inside
    the model."""
    if (
        not name
        # A path that starts somewhere else, or climbs out of the folder.
        or Path(name).is_absolute()
        or ".." in Path(name).parts
    ):
        raise CheckpointError(
            f"{index}: refused shard name {name!r}; an index may only name files inside {folder}"
        )
    boundary = model_boundary(folder.resolve())
    try:
        outside = not (folder / name).resolve().is_relative_to(boundary)
        # A name too long to look up fails here, not later as a traceback.
        (folder / name).is_file()
    # A NUL byte, a symlink loop, a name too long.
    except (OSError, ValueError, RuntimeError):
        link_problem = broken_link(folder / name)
        if link_problem:
            raise CheckpointError(f"{index}: refused shard {name!r}: {link_problem}") from None
        outside = True
    if outside:
        raise CheckpointError(
            f"{index}: refused shard {name!r}, which resolves outside the model folder "
            "or cannot be looked up"
        )
    return folder / name


def check_files_can_hold(config: ModelConfig, files: list[Path], source: Path) -> None:
    """Refuse a config that implies more weights than the files could hold even in 16 bits (an
    n_layer or a context in the billions), in one line with the memory it asks for, before any
    size is taken from it."""
    file_bytes = sum(path.stat().st_size for path in files)
    if 2 * config.n_weights > file_bytes:
        raise CheckpointError(
            f"{source}: implies {config.n_weights:,} weights ({config.n_weights / 2**28:,.1f} "
            f"GiB in float32), but the weight files hold {file_bytes:,} bytes; "
            "the weights are incomplete, or config.json belongs to another model"
        )


def check_entry(path: Path, raw_name: str, entry: TensorEntry, want: tuple[int, ...]) -> None:
    """A tensor of the shape the config implies, in a dtype minirt reads; else CheckpointError."""
    if entry.shape != want:
        raise CheckpointError(
            f"{path}: tensor {raw_name!r} has shape {list(entry.shape)}, but config.json "
            f"implies {list(want)}; the weights and config.json do not belong together"
        )
    if entry.dtype not in WEIGHT_DTYPES:
        raise CheckpointError(
            f"{path}: tensor {raw_name!r} has dtype {entry.dtype}; "
            "minirt reads F32, F16 and BF16 weights"
        )


def read_tensors(
    headers: list[tuple[Path, dict[str, TensorEntry], int]],
    allowed: dict[str, tuple[int, ...]],
    prefix: str = "transformer.",
) -> tuple[dict[str, np.ndarray], dict[str, str], list[str]]:
    """(tensors, their file dtypes, both by canonical name; the names of unexpected tensors) of
    every file, each tensor mapped once its shape and dtype are checked against `allowed`.  A
    canonical name is the name as written without the family's `prefix`."""
    tensors: dict[str, np.ndarray] = {}
    file_dtypes: dict[str, str] = {}
    unexpected: list[str] = []
    # Canonical name -> (the file, the name as written there) of each tensor read so far.
    seen_in: dict[str, tuple[Path, str]] = {}
    for path, entries, data_offset in headers:
        file_map = np.memmap(path, dtype=np.uint8, mode="r") if entries else None  # [file bytes]
        for raw_name, entry in entries.items():
            # The canonical name.
            name = raw_name.removeprefix(prefix)
            if name.endswith(MASK_BUFFER_SUFFIXES):
                continue
            if name not in allowed:
                unexpected.append(raw_name)
                continue
            if name in seen_in:
                first_path, first_name = seen_in[name]
                if first_path == path:
                    raise CheckpointError(
                        f"{path}: tensor {name!r} appears twice, as {first_name!r} and "
                        f"{raw_name!r} (with and without the {prefix!r} prefix)"
                    )
                raise CheckpointError(
                    f"{path}: tensor {raw_name!r} is also in {first_path} (as {first_name!r}); "
                    "a tensor belongs in one shard: re-download the model"
                )
            seen_in[name] = (path, raw_name)
            check_entry(path, raw_name, entry, allowed[name])
            # A file with tensor entries is mapped.
            assert file_map is not None
            tensors[name] = map_tensor(file_map, data_offset, entry)
            file_dtypes[name] = entry.dtype
    return tensors, file_dtypes, unexpected


def load_checkpoint(model: str | os.PathLike) -> Checkpoint:
    """Resolve, open and check a checkpoint of a family minirt runs (minirt/model/registry.py):
    every tensor its config implies, each of its shape.  Raises CheckpointError in one line."""
    folder = resolve_model_folder(model)
    config = read_config(folder / "config.json")
    files = weight_files(folder)
    # Each file's damage is named first.
    headers = [(path, *read_safetensors_header(path)) for path in files]
    # Then, before anything is sized by the config, whether the files could hold what it implies.
    check_files_can_hold(config, files, folder / "config.json")
    family = family_of(config)
    expected = family.expected_shapes(config)
    # An untied head is optional.
    allowed = {**expected, "lm_head.weight": (config.vocab_size, config.n_embd)}
    tensors, file_dtypes, unexpected = read_tensors(headers, allowed, family.prefix)
    # The whole folder has been read: now what is wrong with it as a whole.
    if unexpected:
        raise CheckpointError(
            f"{folder}: unexpected tensors {describe_names(unexpected)}; "
            f"this is not a {family.architecture} checkpoint"
        )
    missing = [name for name in expected if name not in tensors]
    if missing:
        raise CheckpointError(
            f"{folder}: missing tensors {describe_names(missing)} ({len(missing)} of "
            f"{len(expected)}); the checkpoint is incomplete or for another architecture"
        )
    head_is_tied = "lm_head.weight" not in tensors
    # transformers would give the head random numbers.
    if head_is_tied and not config.tie_word_embeddings:
        raise CheckpointError(
            f"{folder}: no lm_head.weight, but config.json says tie_word_embeddings false"
        )
    if head_is_tied:
        # The same array, not a copy.
        tensors["lm_head.weight"] = tensors[family.embedding]
        file_dtypes["lm_head.weight"] = file_dtypes[family.embedding]
    return Checkpoint(
        folder=folder,
        config=config,
        tensors=tensors,
        file_dtypes=file_dtypes,
        head_is_tied=head_is_tied,
    )
