"""The round records a step hands out (`StepOutput.round_record`): the grid the live page draws.

Expected values come from outside the records: the grid that `python -m minirt.rounds` prints for the
seed exercise (its text, parsed), and invariants of a round that a hand count gives: a request is active
in exactly as many consecutive rounds as it produced tokens, from its first round; a row holds one request
a round; a static group's finished members hold their rows until the group's last round, and a continuous
pool frees a row the round after its request ends; a waiting request has waited every round since it came.
"""

import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import ROOT, make_request, random_model
from minirt.engine.engine import Engine
from minirt.engine.runner import ModelRunner
from minirt.engine.params import SamplingParams
from minirt.engine.round_record import WAITING_SHOWN, RoundRecord


@pytest.fixture(scope="module")
def model():
    return random_model(seed=7, vocab_size=50, n_positions=64)


def run_records(model, lengths, policy, batch_size, prompt_lens=None):
    """Serve requests of these output lengths (all there at once) by stepping; every round's record."""
    engine = Engine(ModelRunner(model), None, batch_size=batch_size, policy=policy)
    requests = []
    for index, length in enumerate(lengths):
        prompt_len = 1 if prompt_lens is None else prompt_lens[index]
        prompt = [(index + k) % 50 for k in range(prompt_len)]
        params = SamplingParams(max_tokens=length, ignore_eos=True, temperature=0.0)
        request = make_request(engine, index, prompt, params, request_id=f"req-{index}")
        engine.add_request(request)
        requests.append(request)
    records: list[RoundRecord] = []
    while engine.has_unfinished():
        output = engine.step()
        if output.round_record is not None:
            records.append(output.round_record)
    return requests, records


def printed_grid(lengths, batch_size) -> dict[str, dict[int, str]]:
    """`minirt rounds`' own grid, parsed: per policy, per request index, its mark in each round."""
    command = [sys.executable, "-m", "minirt.rounds", "--lengths", ",".join(map(str, lengths))]
    command += ["--batch-size", str(batch_size)]
    text = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    grids: dict[str, dict[int, str]] = {}
    policy = None
    for line in text.splitlines():
        if line.startswith(("static:", "continuous:")):
            policy = line.split(":")[0]
            grids[policy] = {}
        elif line.startswith("req ") and policy is not None:
            index = int(line.split()[1])
            # The marks sit under the round numbers: two characters a round, from column 8.
            marks = line[8::2]
            grids[policy][index] = marks
    return grids


def marks_of(records, request_id) -> str:
    """A request's marks in the records, as `minirt rounds` prints them: '#' active, '.' held, '-' waiting,
    ' ' neither."""
    marks = []
    for record in records:
        states = {cell.state for cell in record.cells if cell.request_id == request_id}
        waiting = any(w.request_id == request_id for w in record.waiting)
        if "active" in states:
            marks.append("#")
        elif "held" in states:
            marks.append(".")
        elif waiting:
            marks.append("-")
        else:
            marks.append(" ")
    return "".join(marks)


@pytest.mark.parametrize("policy", ["static", "continuous"])
def test_the_seed_exercise_records_are_the_grid_minirt_rounds_prints(model, policy):
    lengths = [2, 5, 8, 4]
    _, records = run_records(model, lengths, policy, batch_size=3)
    expected = printed_grid(lengths, 3)[policy]
    assert [r.round_number for r in records] == list(range(1, len(records) + 1))
    for index in range(len(lengths)):
        got = marks_of(records, f"req-{index}").rstrip()
        assert got == expected[index].rstrip(), (policy, index)


def test_the_fourth_request_of_the_exercise_waited_8_rounds_in_static_groups(model):
    _, records = run_records(model, [2, 5, 8, 4], "static", batch_size=3)
    notes = {note.request_id: note for record in records for note in record.finished}
    assert notes["req-3"].rounds_waited == 8
    assert [notes[f"req-{i}"].tokens for i in range(4)] == [2, 5, 8, 4]
    # A static group of three rows, then a group of one.
    assert [r.rows for r in records] == [3] * 8 + [1] * 4


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=9),
    policy=st.sampled_from(["static", "continuous"]),
    batch_size=st.integers(1, 4),
    data=st.data(),
)
def test_every_round_record_holds_the_invariants_of_a_round(
    model, lengths, policy, batch_size, data
):
    prompt_lens = data.draw(
        st.lists(st.integers(1, 6), min_size=len(lengths), max_size=len(lengths))
    )
    requests, records = run_records(model, lengths, policy, batch_size, prompt_lens)
    by_round = {record.round_number: record for record in records}
    for record in records:
        rows = [cell.row for cell in record.cells]
        assert len(rows) == len(set(rows)), "a row holds one request a round"
        assert all(0 <= row < record.rows <= batch_size for row in rows)
        assert record.kv_positions_allocated <= record.kv_positions_budget
        assert record.waiting_count == len(record.waiting) <= WAITING_SHOWN
        for waiter in record.waiting:
            # Everyone arrived before round 1, so a waiter has waited every round so far.
            assert waiter.rounds_waited == record.round_number
    for request in requests:
        first = request.first_round
        active = [
            n
            for n, r in by_round.items()
            for c in r.cells
            if c.request_id == request.id and c.state == "active"
        ]
        assert active == list(range(first, first + len(request.token_ids)))
        held = [
            n
            for n, r in by_round.items()
            for c in r.cells
            if c.request_id == request.id and c.state == "held"
        ]
        if policy == "static":
            group_end = max(r.finish_round for r in requests if r.group == request.group)
            assert held == list(range(request.finish_round + 1, group_end + 1))
        else:
            assert held == []
        own_rows = {c.row for r in records for c in r.cells if c.request_id == request.id}
        assert own_rows == {request.slot}
        finished_in = [
            r.round_number for r in records for note in r.finished if note.request_id == request.id
        ]
        assert finished_in == [request.finish_round]


@pytest.mark.parametrize("policy", ["static", "continuous"])
def test_an_abort_that_no_round_follows_still_has_its_record(model, policy):
    engine = Engine(ModelRunner(model), None, batch_size=2, policy=policy)
    params = SamplingParams(max_tokens=20, ignore_eos=True, temperature=0.0)
    running = make_request(engine, 0, [1, 2, 3], params, request_id="running")
    engine.add_request(running)
    first = engine.step().round_record
    assert first is not None and first.ran_round and first.cells[0].state == "active"
    engine.abort("running")
    output = engine.step()
    assert output.round_number is None
    record = output.round_record
    assert record is not None and not record.ran_round
    # No row is held any more, nobody waits, and the abort is the news.  A static group's cache went with
    # it; the continuous pool stays, its row free.
    assert record.cells == () and record.waiting == ()
    assert record.rows == (0 if policy == "static" else 1)
    assert [(n.request_id, n.finish_reason, n.tokens) for n in record.finished] == [
        ("running", "abort", 1)
    ]
    assert record.round_number == 1


def test_a_chunk_round_that_gives_no_token_is_marked_prefill(model):
    """6 tokens a round: the 14-token prompt is fed 6 + 6 + 2 (rounds 1-3), its first token in round 3; the
    2-token prompt, admitted in round 3 beside it with the 4 tokens left, gives its first token at once."""
    engine = Engine(
        ModelRunner(model),
        None,
        batch_size=2,
        policy="continuous",
        round_token_budget=6,
        prefix_cache=False,
    )
    long = make_request(
        engine,
        0,
        list(range(1, 15)),
        SamplingParams(max_tokens=2, ignore_eos=True, temperature=0.0),
    )
    short = make_request(
        engine, 1, [3, 4], SamplingParams(max_tokens=2, ignore_eos=True, temperature=0.0)
    )
    engine.add_request(long)
    engine.add_request(short)
    states = {}
    while engine.has_unfinished():
        record = engine.step().round_record
        for cell in record.cells:
            states.setdefault(cell.request_id, []).append(cell.state)
    assert states["0"] == ["prefill", "prefill", "active", "active"]
    assert states["1"] == ["active", "active"]
    assert (long.first_round, long.prefill_rounds, long.finish_round) == (1, 3, 4)
