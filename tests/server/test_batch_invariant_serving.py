"""`minirt serve --batch-invariant` through OpenAI's client: requests sent together, so that the
server batches, chunks and caches them as it likes, each get the logprobs (to the last bit, as
JSON carries a float exactly) and the tokens of the same request served alone, offline; greedy and
seeded.  And a BLAS that cannot keep the promise is refused at start, in one line."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import ROOT
from serving import Server, serve_tests

from minirt import LLM, SamplingParams

pytestmark = serve_tests

PREFIX = "First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
PROMPTS = [
    PREFIX + "All:\nSpeak,",
    "MENENIUS:\nWhat work's, my countrymen, in hand?",
    PREFIX + "First Citizen:\nYou are all resolved rather to die than to famish?",
    "ROMEO:",
    "To be, or not to be,",
    PREFIX,
]
# Greedy for the even prompts, seeded sampling for the odd.
SEEDS = [None, 11, None, 12, None, 13]


def body(i: int) -> dict:
    sampling = {"temperature": 0.0} if SEEDS[i] is None else {"temperature": 1.0, "seed": SEEDS[i]}
    return {"prompt": PROMPTS[i], "max_tokens": 8, "logprobs": 3, **sampling}


def alone_offline(i: int) -> tuple[list[int], list[float], list[dict[int, float]]]:
    """The request served alone, offline, in exact mode: its tokens, their logprobs, and each
    step's {token id: logprob} (the chosen token and the top 3)."""
    llm = LLM(batch_size=1, batch_invariant=True)
    b = body(i)
    params = SamplingParams(
        max_tokens=b["max_tokens"], temperature=b["temperature"], seed=b.get("seed"), logprobs=3
    )
    (output,) = llm.generate([b["prompt"]], params)
    completion = output.outputs[0]
    steps = zip(completion.logprobs, completion.token_ids, strict=True)
    chosen = [step[token].logprob for step, token in steps]
    top = [
        {token: logprob.logprob for token, logprob in step.items()} for step in completion.logprobs
    ]
    return completion.token_ids, chosen, top


@pytest.mark.parametrize("policy", ["continuous", "static"])
def test_requests_sent_together_get_their_solo_logprobs_bitwise(policy):
    flags = ["--batch-invariant", "--policy", policy, "--batch-size", "4", "--prefix-cache"]
    if policy == "continuous":
        # Chunks of 16 prompt tokens beside the decoding rows.
        flags += ["--max-round-tokens", "24"]
    with Server(*flags) as server:
        client = server.client()

        def send(i: int):
            return client.completions.create(model=None, **body(i))

        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            answers = list(pool.map(send, range(len(PROMPTS))))
        assert server.stop() == 0
    for i, answer in enumerate(answers):
        tokens, logprobs, top = alone_offline(i)
        choice = answer.choices[0]
        assert choice.logprobs.token_logprobs == logprobs, (policy, i)
        # The chosen token and the top 3 at each step too, keyed by their text on the wire.
        wire_top = [sorted(step.values()) for step in choice.logprobs.top_logprobs]
        assert wire_top == [sorted(step.values()) for step in top], (policy, i)
        assert choice.model_extra["minirt"]["token_ids"] == tokens, (policy, i)


def test_serve_refuses_a_blas_that_cannot_keep_it_in_one_line(tmp_path):
    """A sitecustomize that perturbs np.matmul by its rows plays such a BLAS."""
    (tmp_path / "sitecustomize.py").write_text(
        "import numpy as np\n"
        "real = np.matmul\n"
        "def matmul(a, b, *args, **kwargs):\n"
        "    result = real(a, b, *args, **kwargs)\n"
        "    if result.ndim == 2 and result.shape[0] == 8:\n"
        "        result[0] = np.nextafter(result[0], np.inf)\n"
        "    return result\n"
        "np.matmul = matmul\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "minirt.serve", "--port", "0", "--batch-invariant"],
        cwd=ROOT,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert "exact batch invariance is not available on" in lines[0]
    assert "run without batch invariance" in lines[0]
