"""Shared test helpers: fixture paths, random numpy-only models, reference availability, and `bounded`, the guard
that turns a runaway allocation or a hang into a test failure."""

from __future__ import annotations

import math
import shutil
import signal
import sys
from contextlib import contextmanager
from pathlib import Path

try:
    import resource  # POSIX only: `bounded` guards nothing without it
except ImportError:
    resource = None

import os

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st

from minirt.model import backend as backend_module
from minirt.model.backend import numpy_backend
from minirt.model.batch import Batch
from minirt.loading.checkpoint import Checkpoint
from minirt.model.config import GPT2Config
from minirt.model.gpt2 import GPT2
from minirt.model.llama import Llama
from minirt.model.llama_config import LlamaConfig

# In CI, hypothesis draws the same examples every run, so a run is repeatable; locally it explores.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
DATA = ROOT / "tests" / "data"
# The safetensors format's dtype codes and their sizes in bytes, written out here rather than imported, so that
# the loader tests check minirt's own table (minirt/loading/safetensors_header.py) against the format.
DTYPE_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "F64": 8,
    "I64": 8,
    "U64": 8,
}
# The tools the tests import: tools/fixtures/ (reference.py with transformers, tiny_random_model.py, train_tiny.py)
# and tools/bench/ (device_check.py).
sys.path.insert(0, str(ROOT / "tools" / "bench"))
sys.path.insert(0, str(ROOT / "tools" / "fixtures"))

from tiny_random_model import random_llama_tensors, random_tensors, write_tiny_lm  # noqa: E402 (after the sys.path insert above)


def reference_available() -> bool:
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except Exception:  # noqa: BLE001 (a broken torch/transformers install raises more than ImportError; skip either way)
        return False
    return True


_skip_without_reference = pytest.mark.skipif(
    not reference_available(),
    reason="torch/transformers not installed (CPU torch first, README 'CPU-only PyTorch'; then pip install -e .[reference])",
)


def requires_reference(test):
    """Marks a test `reference` (so `pytest -m reference` selects it) and skips it without torch/transformers."""
    return pytest.mark.reference(_skip_without_reference(test))


def relative_error(got: np.ndarray, ref: np.ndarray) -> float:
    """max |got - ref| / max |ref|: the contract's measure."""
    return float(np.abs(np.asarray(got, np.float64) - ref).max() / max(np.abs(ref).max(), 1e-30))


def random_model(seed: int = 0, dtype=np.float32, backend=None, rounded_to=None, **fields) -> GPT2:
    """A GPT-2 with random weights made in NumPy alone (for invariants, no reference needed).

    `rounded_to=np.float16` rounds the weights to fp16 first (still stored fp32), so an fp32 model sees
    exactly the numbers an fp16 model computes with.
    """
    raw = {"vocab_size": 50, "n_positions": 32, "n_embd": 16, "n_layer": 2, "n_head": 2}
    raw.update(fields)
    config = GPT2Config.from_dict(raw, source="test")
    tensors = random_tensors(config, seed)
    if rounded_to is not None:
        tensors = {
            name: array.astype(rounded_to).astype(np.float32) for name, array in tensors.items()
        }
    tensors["lm_head.weight"] = tensors["wte.weight"]
    checkpoint = Checkpoint(
        folder=Path("."),
        config=config,
        tensors=tensors,
        file_dtypes={k: "F32" for k in tensors},
        head_is_tied=True,
    )
    return GPT2(checkpoint, backend or numpy_backend(), dtype)


def random_llama(seed: int = 0, dtype=np.float32, backend=None, **fields) -> Llama:
    """A Llama-family model with random weights made in NumPy alone (for invariants): by default
    4 query heads over 2 K/V heads, Qwen3's per-head norms, untied; `fields` are config.json's."""
    raw = {
        "model_type": "qwen3",
        "vocab_size": 37,
        "max_position_embeddings": 24,
        "hidden_size": 16,
        "intermediate_size": 24,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 6,
        "rope_theta": 100.0,
    }
    raw.update(fields)
    config = LlamaConfig.from_dict(raw, source="test")
    tensors = random_llama_tensors(config, seed)
    tensors["lm_head.weight"] = (
        np.random.default_rng(seed + 1000).standard_normal((config.vocab_size, config.n_embd))
    ).astype(np.float32)
    checkpoint = Checkpoint(
        folder=Path("."),
        config=config,
        tensors=tensors,
        file_dtypes={k: "F32" for k in tensors},
        head_is_tied=False,
    )
    return Llama(checkpoint, backend or numpy_backend(), dtype)


# Small random models for the forward pass's hypothesis invariants (test_batch_invariance.py,
# test_kv_cache.py): GPT-2s, and Llama-family models (grouped queries, RoPE).
MODELS = {}


def model_for(n_head: int, seed: int):
    """Cache a few random models; configs vary the head count and the MLP width."""
    key = (n_head, seed)
    if key not in MODELS:
        MODELS[key] = random_model(
            seed=seed,
            n_head=n_head,
            n_embd=6 * n_head,
            n_inner=10 * n_head,
            vocab_size=37,
            n_positions=24,
        )
    return MODELS[key]


def llama_for(model_type: str, n_kv_head: int, seed: int):
    """Cache a few random Llama-family models: Llama, Qwen2 (Q/K/V bias), Qwen3 (per-head
    norms), each with 4 query heads over n_kv_head K/V heads."""
    key = (model_type, n_kv_head, seed)
    if key not in MODELS:
        MODELS[key] = random_llama(seed=seed, model_type=model_type, num_key_value_heads=n_kv_head)
    return MODELS[key]


model_choice = st.one_of(
    st.builds(model_for, n_head=st.sampled_from([1, 2, 3]), seed=st.integers(0, 2)),
    st.builds(
        llama_for,
        model_type=st.sampled_from(["llama", "qwen2", "qwen3"]),
        n_kv_head=st.sampled_from([1, 2, 4]),
        seed=st.integers(0, 2),
    ),
)
token_lists = st.lists(
    st.lists(st.integers(0, 36), min_size=1, max_size=24), min_size=1, max_size=5
)


def greedy_decode(model: GPT2, prompts: list[list[int]], steps: int, slots=None) -> list[list[int]]:
    """Batched greedy decoding with the KV cache: one prefill round, then one token per round.

    A minimal loop for tests (the serving engine is elsewhere): every row stays
    active for all steps.
    """
    slots = np.arange(len(prompts)) if slots is None else np.asarray(slots)
    cache = model.new_kv_cache(
        n_slots=int(slots.max()) + 1, capacity=max(len(p) for p in prompts) + steps
    )
    logits = model.forward(Batch(prompts, model.backend, slots=slots), cache)  # [B, V]
    outputs = [[int(t)] for t in model.backend.to_numpy(logits).argmax(axis=-1)]
    for _ in range(steps - 1):
        batch = Batch(
            [[out[-1]] for out in outputs],
            model.backend,
            slots=slots,
            past_lens=cache.lengths[slots],
        )
        logits = model.backend.to_numpy(model.forward(batch, cache))  # [B, V]
        for out, token in zip(outputs, logits.argmax(axis=-1), strict=True):
            out.append(int(token))
    return outputs


def hand_decode(
    model,
    prompt_ids: list[int],
    n: int,
    rng: np.random.Generator | None = None,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    repetition_penalty: float = 1.0,
    presence_penalty: float = 0.0,
    frequency_penalty: float = 0.0,
    logit_bias: dict[int, float] | None = None,
) -> list[int]:
    """n tokens chosen by hand, an independent reference for the sampler: at each step the
    model's logits for the whole sequence so far (a forward without a KV cache, a batch or a
    scheduler), then the documented formulas in plain Python, one token at a time: logit_bias;
    repetition_penalty over the prompt's and output's tokens (each once: divided if positive,
    else multiplied); frequency x count + presence x (count > 0) over the output; then greedy
    (temperature 0: the argmax, ties to the lowest id), or softmax(logits / T) cut to the top k
    (ties at the k-th kept), to the most likely tokens until their mass reaches top_p (ranked by
    logit, then id), to those at least min_p x the top probability, and one uniform number u
    from `rng` drawing the first token, in id order, whose running total passes u x the
    total.  EOS is not a stop here (the caller's requests ignore it)."""
    ids = list(prompt_ids)
    out: list[int] = []
    for _ in range(n):
        x = [float(v) for v in model.logits([ids])[0][len(ids) - 1]]
        vocab = range(len(x))
        for token, bias in (logit_bias or {}).items():
            x[token] += bias
        for token in set(prompt_ids) | set(out):
            x[token] = (
                x[token] / repetition_penalty if x[token] > 0 else x[token] * repetition_penalty
            )
        for token in set(out):
            x[token] -= frequency_penalty * out.count(token) + presence_penalty
        if temperature < 1e-5:
            token = max(vocab, key=lambda t: (x[t], -t))
        else:
            assert rng is not None, "a sampled reference needs its random stream"
            scaled = [v / temperature for v in x]
            kept = list(vocab)
            if top_k:
                kth = sorted(scaled, reverse=True)[min(top_k, len(scaled)) - 1]
                kept = [t for t in kept if scaled[t] >= kth]
            top = max(scaled[t] for t in kept)
            weights = {t: math.exp(scaled[t] - top) for t in kept}
            probs = {t: w / sum(weights.values()) for t, w in weights.items()}
            if top_p < 1:
                nucleus, mass = [], 0.0
                for t in sorted(probs, key=lambda t: (-scaled[t], t)):
                    if mass >= top_p:
                        break
                    nucleus.append(t)
                    mass += probs[t]
                probs = {t: probs[t] / mass for t in nucleus}
            if min_p > 0:
                floor = min_p * max(probs.values())
                probs = {t: p for t, p in probs.items() if p >= floor}
                probs = {t: p / sum(probs.values()) for t, p in probs.items()}
            u = rng.random() * sum(probs.values())
            running = 0.0
            token = max(probs)
            for t in sorted(probs):
                running += probs[t]
                if u < running:
                    token = t
                    break
        out.append(token)
        ids.append(token)
    return out


def finished_request(index: int = 0, tokens: int = 1):
    """A request finished by hand: `tokens` tokens of id 5, text " or not", group 1, length."""
    from minirt.engine.params import SamplingParams
    from minirt.engine.request import Request, Status

    request = Request(
        index=index,
        id=str(index),
        prompt="To be",
        prompt_ids=[1, 2],
        params=SamplingParams(max_tokens=tokens, temperature=0.0),
    )
    request.token_ids = [5] * tokens
    request.text = " or not"
    request.finish_reason = "length"
    request.group = 1
    request.first_round = 1
    request.finish_round = tokens
    request.status = Status.FINISHED
    return request


def make_request(engine, index, prompt, params, run_seed: int = 0, **fields):
    """A request for an Engine's model, made as the API and the server make theirs
    (minirt/request_maker.py, with the engine's tokenizer, if any): `fields` are
    `RequestMaker.make`'s (request_id, want_logprobs, sample, output_index)."""
    from minirt.request_maker import RequestMaker

    maker = RequestMaker.for_model(
        engine.runner.model.config, engine.detokenizer, run_seed=run_seed
    )
    return maker.make(index, prompt, params, **fields)


def stub_request(index: int, prompt_len: int, max_new_tokens: int):
    """A request of `prompt_len` copies of token index + 1 that runs to `max_new_tokens` (it
    ignores EOS): what a model-free run of the engine is given."""
    from minirt.engine.params import SamplingParams
    from minirt.engine.request import Request

    return Request(
        index=index,
        id=str(index),
        prompt=None,
        prompt_ids=[index + 1] * prompt_len,
        params=SamplingParams(max_tokens=max_new_tokens, ignore_eos=True, temperature=0.0),
    )


def serve_all(engine, requests):
    """An offline run of these requests on an Engine, as `LLM.run` does: minirt/llm.py's loop over
    the engine's steps (`run_steps`), to the end.  Returns the run's counts."""
    from minirt.llm import run_steps

    with run_steps(engine, requests, "a test's run") as steps:
        stats = engine.stats
        for _step in steps:
            pass
    return stats


def load_expected(name: str) -> dict[str, np.ndarray]:
    with np.load(FIXTURES / name / "expected.npz") as data:
        return {k: data[k] for k in data.files}


FIXTURE_NAMES = sorted(p.name for p in FIXTURES.iterdir() if (p / "expected.npz").is_file())


def fake_hub_cache(
    root: Path, model: Path, repo_name: str = "models--someone--tiny"
) -> tuple[Path, Path]:
    """`model` laid out as a Hugging Face cache entry under root/hub: (repo folder, snapshot folder), each
    snapshot file a symlink into the repo's blobs/, as the hub library makes them."""
    repo = root / "hub" / repo_name
    snapshot = repo / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    for file in model.iterdir():
        shutil.copy(file, repo / "blobs" / f"blob-{file.name}")
        (snapshot / file.name).symlink_to(Path("..") / ".." / "blobs" / f"blob-{file.name}")
    return repo, snapshot


@pytest.fixture(autouse=True, scope="session")
def auto_backend_is_numpy():
    """`auto` is minirt's default backend, and on a GPU machine it would move every test that takes the default
    onto CuPy.  The suite checks the reference backend, NumPy, so here `auto` keeps to it (with the note saying
    why); the gpu tests name CuPy explicitly.  Where no GPU is usable, `auto` is left exactly as it is."""
    real_auto = backend_module.auto_backend

    def numpy_first():
        chosen, note = real_auto()
        if chosen.name == "numpy":
            return chosen, note
        return (
            numpy_backend(),
            "backend auto: using numpy (the test suite keeps to the reference backend)",
        )

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(backend_module, "auto_backend", numpy_first)
        yield


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory) -> Path:
    return write_tiny_lm(tmp_path_factory.mktemp("tiny_lm"))


@contextmanager
def bounded(seconds: float, extra_bytes: int = 2**30):
    """Fail a test, instead of exhausting the machine, if the loader starts allocating or looping by an absurd
    size: the address space is capped at what the process has now plus `extra_bytes` (MemoryError past it), and
    a timer raises TimeoutError after `seconds`.  Linux only; elsewhere it guards nothing."""
    statm = Path("/proc/self/statm")
    if resource is None or not statm.is_file() or not hasattr(signal, "setitimer"):
        yield
        return
    old_limit = resource.getrlimit(resource.RLIMIT_AS)
    cap = int(statm.read_text().split()[0]) * os.sysconf("SC_PAGE_SIZE") + extra_bytes
    if old_limit[1] != resource.RLIM_INFINITY:
        cap = min(cap, old_limit[1])

    def on_timer(*_):
        raise TimeoutError(f"still running after {seconds} s")

    old_handler = signal.signal(signal.SIGALRM, on_timer)
    resource.setrlimit(resource.RLIMIT_AS, (cap, old_limit[1]))
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        resource.setrlimit(resource.RLIMIT_AS, old_limit)


class Completion:
    """One completion of `LLM.generate`'s result, flattened for the tests that check it per request: its
    prompt's fields (index, id, prompt, prompt_token_ids, prompt_logprobs as floats) beside its
    `CompletionOutput`'s, with `sample` (the completion's index), and its logprobs as plain lists (`logprobs`,
    each chosen token's; `top_logprobs`, the N most likely at each step as (id, logprob) pairs, None unless
    `top_n` was given).  Every value is read from the public output: nothing here sees a Request."""

    def __init__(self, prompt_output, completion, top_n: int | None = None):
        self.index = prompt_output.index
        self.id = prompt_output.request_id
        self.prompt = prompt_output.prompt
        self.prompt_token_ids = prompt_output.prompt_token_ids
        if prompt_output.prompt_logprobs is None:
            self.prompt_logprobs = None
        else:
            pairs = zip(prompt_output.prompt_token_ids, prompt_output.prompt_logprobs, strict=True)
            self.prompt_logprobs = [
                None if entry is None else entry[token].logprob for token, entry in pairs
            ]
        self.output = completion
        self.sample = completion.index
        for name in (
            "text",
            "token_ids",
            "cumulative_logprob",
            "finish_reason",
            "error",
            "group",
            "first_round",
            "finish_round",
            "rounds_waited",
            "cached_prompt_tokens",
            "arrival_s",
            "first_token_s",
            "finish_s",
            "ok",
        ):
            setattr(self, name, getattr(completion, name))
        if completion.logprobs is None:
            self.logprobs = None
            self.top_logprobs = None
            return
        # Each step's dict holds the chosen token first (vLLM's order).
        self.logprobs = [
            step[token].logprob
            for token, step in zip(completion.token_ids, completion.logprobs, strict=False)
        ]
        if not top_n:
            self.top_logprobs = None
            return
        self.top_logprobs = []
        for token, step in zip(completion.token_ids, completion.logprobs, strict=False):
            # The top N, by rank: the chosen token is among them when its rank is at most N.
            ranked = sorted(step.items(), key=lambda item: item[1].rank)
            ranked = [(t, lp) for t, lp in ranked if t != token or lp.rank <= top_n]
            self.top_logprobs.append([(t, lp.logprob) for t, lp in ranked[:top_n]])

    def __repr__(self) -> str:
        return f"Completion(index={self.index}, sample={self.sample}, text={self.text!r})"


def completions(outputs, top_n: int | None = None) -> list[Completion]:
    """`LLM.generate`'s result (one RequestOutput per prompt, each holding its n completions) as one flat list,
    a prompt's samples one after another: what the tests that check each request's result read."""
    return [Completion(out, completion, top_n) for out in outputs for completion in out.outputs]


def completion_of(request, top_n: int | None = None) -> Completion:
    """A finished engine Request's result as the public API makes it (its RequestOutput, flattened): for the
    tests that serve requests on an Engine directly."""
    from minirt.engine.output import RequestOutput

    return completions([RequestOutput.from_requests([request])], top_n)[0]


def run_script(source: str, folder: Path, name: str = "script.py"):
    """`source` written to `folder / name` and run as a reader would run it: a fresh interpreter, from that
    folder (not the repository), standard output and error captured."""
    import subprocess

    script = folder / name
    script.write_text(source, encoding="utf-8")
    return subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=folder,
        check=False,
    )
