"""The public scoring API's input checks, the KV slot views, and `python -m minirt.inspect`."""

import subprocess
import sys

import numpy as np
import pytest

import minirt
from conftest import FIXTURES, ROOT, load_expected, random_model
from minirt.model.batch import Batch
from minirt.cli.command import EXIT_OK, EXIT_USAGE, run_command
from minirt.inspect import main as inspect_main


@pytest.fixture(scope="module")
def base_model():
    return minirt.load_model(FIXTURES / "base")


@pytest.mark.parametrize(
    "bad, fragment",
    [
        ([[1, 2, 128]], "sequence 0 token id 128 is outside the vocabulary [0, 128)"),
        ([[5], [-1]], "sequence 1 token id -1"),
        ([list(range(65))], "65 tokens, more than the model's context of 64"),
        ([["a", "b"]], "not a list of integer token ids"),
        (np.zeros((2, 3), dtype=int), "list of token-id lists"),
        ("hello", "list of token-id lists"),
    ],
)
def test_logits_rejects_bad_token_ids(base_model, bad, fragment):
    with pytest.raises(minirt.InputError) as exc:
        base_model.logits(bad)
    assert fragment in str(exc.value)


def test_logits_shapes_and_empty_inputs(base_model):
    assert base_model.logits([]).shape == (0, 0, 128)
    assert base_model.logits([[]]).shape == (1, 0, 128)
    out = base_model.logits([[1, 2, 3], [4]])
    assert out.shape == (2, 3, 128) and out.dtype == np.float32


def test_a_request_owns_its_kv_buffer():
    """Slot 1 of a shared pool holds its request's keys for every layer, equal to a run of it alone."""
    model = random_model(seed=3)
    cache = model.new_kv_cache(n_slots=2, capacity=6)
    model.forward(Batch([[1, 2, 3], [4, 5]], model.backend, slots=[1, 0]), cache)
    assert cache.lengths.tolist() == [2, 3]
    keys_together, values_together = (
        cache.keys[:, 1, :, :3],
        cache.values[:, 1, :, :3],
    )  # [n_layer, H, 3, D]
    alone = model.new_kv_cache(n_slots=1, capacity=6)
    model.forward(Batch([[1, 2, 3]], model.backend), alone)
    keys_alone, values_alone = alone.keys[:, 0, :, :3], alone.values[:, 0, :, :3]
    assert keys_together.shape == (2, 2, 3, 8)
    assert np.allclose(keys_together, keys_alone, atol=1e-6) and np.allclose(
        values_together, values_alone, atol=1e-6
    )
    assert np.shares_memory(keys_together, cache.keys)  # a view into the preallocated pool


def test_kv_cache_budget_arithmetic():
    model = random_model()
    cache = model.new_kv_cache(n_slots=3, capacity=5)
    held = cache.keys.nbytes + cache.values.nbytes
    assert (
        held
        == minirt.model.kv_cache.KVCache.bytes_needed(2, 2, 8, 3, 5, np.float32)
        == 2 * 2 * 3 * 2 * 5 * 8 * 4
    )
    with pytest.raises(ValueError, match="exceeds the model's context"):
        model.new_kv_cache(n_slots=1, capacity=33)


def test_inspect_reports_the_reference_top_token(capsys):
    """The top next token it prints is transformers' argmax for the same prompt."""
    expected = load_expected("base")
    prompt = expected["seq_0"].tolist()
    argv = ["--ids", ",".join(map(str, prompt)), "--top-k", "2", str(FIXTURES / "base")]
    assert run_command(inspect_main, argv) == EXIT_OK
    out = capsys.readouterr().out
    reference_top = int(np.argmax(expected["logits"][0, len(prompt) - 1]))
    first_line = next(line for line in out.splitlines() if line.strip().startswith("id "))
    assert first_line.split()[1] == str(reference_top)
    assert "memory-mapped" in out and "31,616 parameters" in out


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["nope/does/not/exist"], "does not exist"),
        ([str(FIXTURES / "base"), "--backend", "cupy"], "--backend numpy"),
        ([str(FIXTURES / "base"), "--dtype", "int8"], "unknown dtype"),
        ([str(FIXTURES / "base"), "--prompt", "hi"], "needs a tokenizer"),
        ([str(FIXTURES / "base"), "--top-k", "0"], "--top-k"),
    ],
)
def test_inspect_errors_are_one_line(capsys, argv, fragment):
    if "cupy" in argv:
        try:
            minirt.get_backend("cupy")
            pytest.skip("a usable GPU is present")
        except minirt.BackendError:
            pass
    assert run_command(inspect_main, argv, prog="minirt.inspect") == EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and fragment in err and "Traceback" not in err


def test_inspect_as_a_module_subprocess():
    result = subprocess.run(
        [sys.executable, "-m", "minirt.inspect", str(FIXTURES / "sharded"), "--ids", "1,2"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "in 3 file(s)" in result.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "minirt.inspect", "/no/such/folder"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert (
        bad.returncode == EXIT_USAGE
        and bad.stderr.count("\n") == 1
        and "Traceback" not in bad.stderr
    )


def test_a_decode_round_with_an_empty_row_leaves_the_others_alone():
    """A decode round may carry a row with no new token (padded [B, H, 1, L] with a hole): the other rows'
    logits equal those of the same round without that row, so padding lands on the right rows."""
    model = random_model(seed=5)
    prompts, slots = [[1, 2, 3], [4, 5], [6, 7, 8, 9]], [2, 0, 1]
    caches = [model.new_kv_cache(n_slots=3, capacity=8) for _ in range(2)]
    for cache in caches:
        model.forward(Batch(prompts, model.backend, slots=slots), cache)
    past = [len(p) for p in prompts]
    with_hole = model.forward(
        Batch([[10], [], [11]], model.backend, slots=slots, past_lens=past), caches[0]
    )
    without = model.forward(
        Batch([[10], [11]], model.backend, slots=[2, 1], past_lens=[3, 4]), caches[1]
    )
    assert with_hole.shape == without.shape == (2, model.config.vocab_size)
    np.testing.assert_allclose(with_hole, without, rtol=1e-5, atol=1e-6)
    assert caches[0].lengths.tolist() == caches[1].lengths.tolist() == [2, 5, 4]
