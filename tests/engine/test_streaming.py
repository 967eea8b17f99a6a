"""Streaming.  A request's tokens are handed out as they are produced, and its text only once it is
final: the pieces of text a stream shows, joined, are exactly the request's final text (never a half character,
never text that a stop string completed later cuts away), and the token ids are its token ids, in order.
Streaming changes nothing about the results: the outputs are those of the same run without it.
"""

import contextlib
import io
import json
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import ROOT
from minirt import LLM, SamplingParams, TokenEvent
from minirt.cli.command import run_command
from minirt.generate import main as generate_main
from minirt.engine.request import Request, Status, unshown_text
from conftest import completions

PROMPTS = [
    "To be, or not to be",
    "Café",
    "",
    "All the world's a stage, and all the men and women merely players",
]


@pytest.fixture(scope="module")
def llms(tiny_lm):
    return {
        policy: LLM(tiny_lm, batch_size=3, policy=policy) for policy in ("static", "continuous")
    }


def untimed(result):
    """A record (dict) or a flattened completion (conftest's `Completion`) as a dict without its
    timings (seconds from a run's start)."""
    if not isinstance(result, dict):
        result = {k: v for k, v in vars(result).items() if k != "output"}
    return {k: v for k, v in result.items() if k not in ("arrival_s", "first_token_s", "finish_s")}


def streamed(llm, prompts, params):
    """(outputs, events) of one run with on_token."""
    events: list[TokenEvent] = []
    outputs = completions(llm.generate(prompts, params, on_token=events.append))
    return outputs, events


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    data=st.data(),
    policy=st.sampled_from(["static", "continuous"]),
    temperature=st.sampled_from([0.0, 1.0]),
    n_prompts=st.integers(1, 4),
)
def test_the_streamed_text_joins_into_the_final_text(llms, data, policy, temperature, n_prompts):
    llm = llms[policy]
    prompts = PROMPTS[:n_prompts]
    plain = SamplingParams(max_tokens=20, temperature=temperature, seed=3)
    probe = completions(llm.generate(prompts, plain))  # the run without streaming or stops
    stops = []
    # Stop strings taken from what the run writes, so that some of them cut the text.
    for out in probe:
        text = out.text or ""
        if len(text) >= 2:
            start = data.draw(st.integers(0, len(text) - 2), label="stop at")
            stops.append(text[start : start + data.draw(st.integers(1, 4), label="stop length")])
    params = SamplingParams(max_tokens=20, temperature=temperature, seed=3, stop=stops or None)
    unstreamed = completions(llm.generate(prompts, params))
    outputs, events = streamed(llm, prompts, params)
    assert [untimed(o) for o in outputs] == [
        untimed(o) for o in unstreamed
    ]  # streaming changes no result
    for out in outputs:
        mine = [e for e in events if e.index == out.index]
        assert [e.token_id for e in mine] == out.token_ids
        assert "".join(e.text for e in mine) == out.text
        assert [e.finish_reason for e in mine] == [None] * (len(mine) - 1) + [out.finish_reason]
        assert all(e.id == out.id for e in mine)


def test_a_multibyte_character_is_never_split(llms):
    """Byte-level tokens may end inside a character: the stream shows it whole, once its last byte has come."""
    llm = llms["static"]
    prompts = ["Café", "日本語", "\U0001f600 emoji"]
    outputs, events = streamed(
        llm, prompts, SamplingParams(max_tokens=24, temperature=1.0, seed=11)
    )
    for out in outputs:
        pieces = [e.text for e in events if e.index == out.index]
        assert "".join(pieces) == out.text
        assert all("\ufffd" not in piece for piece in pieces) or "\ufffd" in (out.text or "")


def test_on_final_hears_each_output_once_as_it_finishes(llms):
    heard = []
    params = SamplingParams(max_tokens=8, temperature=0.0)
    outputs = llms["continuous"].generate(PROMPTS, params, on_final=heard.append)
    assert sorted(heard, key=lambda o: o.index) == outputs
    # In the order they finished.
    finish_rounds = [o.outputs[0].finish_round for o in heard]
    assert finish_rounds == sorted(finish_rounds)


def test_on_final_hears_a_prompt_once_when_its_last_sample_is_final(tiny_lm):
    """n samples of each prompt, two rows: the samples of one prompt finish in different rounds,
    and on_final hears the prompt once, after the last of them, with all n."""
    llm = LLM(tiny_lm, batch_size=2, policy="continuous")
    heard = []
    lengths = [SamplingParams(max_tokens=k, n=3, ignore_eos=True, seed=1) for k in (3, 5)]
    outputs = llm.generate(PROMPTS[:2], lengths, on_final=heard.append)
    assert sorted(heard, key=lambda o: o.index) == outputs
    assert [len(o.outputs) for o in heard] == [3, 3]
    for prompt_output in heard:
        last = max(c.finish_round for c in prompt_output.outputs)
        # Samples of one prompt do not all finish in one round: two rows for three samples.
        assert min(c.finish_round for c in prompt_output.outputs) < last
    last_rounds = [max(c.finish_round for c in o.outputs) for o in heard]
    assert last_rounds == sorted(last_rounds)


def request_with(text: str, stop: list[str] | None, finished: bool) -> Request:
    request = Request(
        index=0,
        id="0",
        prompt="x",
        prompt_ids=[1],
        params=SamplingParams(stop=stop, temperature=0.0, max_tokens=64),
    )
    request.text, request.status = text, Status.FINISHED if finished else Status.RUNNING
    return request


@pytest.mark.parametrize("stop, held_back", [(None, 0), (["ab"], 1), (["x", "long stop"], 8)])
def test_unshown_text_holds_back_what_a_stop_string_could_still_cut(stop, held_back):
    running = request_with("0123456789", stop, finished=False)
    assert unshown_text(running) == "0123456789"[: 10 - held_back]
    assert unshown_text(running) == ""  # handed out once
    running.text += "abc"
    assert unshown_text(running) == "0123456789abc"[10 - held_back : 13 - held_back]
    running.status = Status.FINISHED
    assert (
        unshown_text(running) == "0123456789abc"[13 - held_back :]
    )  # finished: the rest, all of it
    assert (
        request_with("", stop, finished=False).shown == 0
        and unshown_text(request_with("", stop, False)) == ""
    )


# ----------------------------------------------------------------------------- the command line


class LoggedStdout(io.StringIO):
    """A standard output that remembers each write, to tell text written as it came from text written at once."""

    def __init__(self):
        super().__init__()
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return super().write(text)

    def isatty(self) -> bool:
        return False


def generate(argv, monkeypatch, capsys) -> tuple[int, LoggedStdout]:
    out = LoggedStdout()
    monkeypatch.setattr(sys, "stdout", out)
    code = run_command(generate_main, argv, prog="minirt generate")
    capsys.readouterr()
    return code, out


@pytest.mark.parametrize("policy", ["static", "continuous"])
def test_stream_shows_each_completion_in_input_order_as_its_tokens_come(
    tiny_lm, tmp_path, monkeypatch, capsys, policy
):
    prompts = ["To be, or not to be", "Café", "All the world", "Now is the winter"]
    argv = [
        "--model",
        str(tiny_lm),
        "--batch-size",
        "2",
        "--max-new-tokens",
        "12",
        "--ignore-eos",
        "--policy",
        policy,
        "--temperature",
        "1",
        "--stop",
        "e t",
        *[f"--prompt={p}" for p in prompts],
    ]
    code, plain = generate(argv + ["--output", str(tmp_path / "plain.jsonl")], monkeypatch, capsys)
    assert code == 0
    code, out = generate(
        argv + ["--stream", "--output", str(tmp_path / "streamed.jsonl")], monkeypatch, capsys
    )
    assert code == 0
    records = [json.loads(line) for line in (tmp_path / "streamed.jsonl").read_text().splitlines()]
    assert [untimed(r) for r in records] == [
        untimed(json.loads(line)) for line in (tmp_path / "plain.jsonl").read_text().splitlines()
    ]  # same results
    plain_blocks = plain.getvalue().split("\n\n")[:-1]
    header = [block.split("\n")[0] for block in plain_blocks]
    expected_streamed = [
        f"### [{r['index']}]: streaming\n{r['prompt']}{r['text']}\n{header[r['index']]}"
        for r in records
    ]
    got = out.getvalue().split("\n\n")[:-1]
    assert len(got) == len(records)
    for record, block, plain_block, streamed_block in zip(
        records, got, plain_blocks, expected_streamed, strict=True
    ):
        assert block in (plain_block, streamed_block), (record, block)
    assert got[0] == expected_streamed[0]  # the first request's turn comes at once: it streams
    first_writes = out.writes[: next(i for i, w in enumerate(out.writes) if header[0] in w) + 1]
    assert len(first_writes) >= 3  # its opening, its text in more than one piece, its end


def test_without_stream_a_pipe_gets_whole_completions(tiny_lm, monkeypatch, capsys):
    code, out = generate(
        ["--model", str(tiny_lm), "--max-new-tokens", "6", "--prompt", "To be"], monkeypatch, capsys
    )
    assert code == 0 and "streaming" not in out.getvalue() and len(out.writes) == 1


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
@pytest.mark.parametrize(
    "flags, streams", [([], True), (["--no-stream"], False), (["--prompt", "Café"], False)]
)
def test_a_single_prompt_on_a_terminal_streams_by_default(tiny_lm, flags, streams):
    leader, follower = os.openpty()
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "minirt.generate",
                "--model",
                str(tiny_lm),
                "--prompt",
                "To be",
                "--max-new-tokens",
                "6",
                "--no-progress",
                *flags,
            ],
            stdout=follower,
            stderr=subprocess.PIPE,
            cwd=ROOT,
            timeout=120,
        )
        os.close(follower)
        shown = b""
        with contextlib.suppress(OSError):  # the terminal reads as closed once all is read
            while chunk := os.read(leader, 65536):
                shown += chunk
    finally:
        os.close(leader)
    assert result.returncode == 0, result.stderr
    assert (b"### [0]: streaming" in shown) == streams, shown


def test_on_final_hears_a_prompt_once_when_its_samples_finish_in_one_round(tiny_lm):
    """Two samples of one prompt, side by side, both run to the same length: they become final in the same
    round, and on_final still hears the prompt once."""
    llm = LLM(tiny_lm, batch_size=2)
    heard = []
    params = SamplingParams(max_tokens=4, n=2, ignore_eos=True, seed=3)
    (output,) = llm.generate(PROMPTS[:1], params, on_final=heard.append)
    assert [c.finish_round for c in output.outputs] == [4, 4]
    assert heard == [output]
