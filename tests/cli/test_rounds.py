"""Static groups beside continuous batching: the seed's exercise, scheduler invariants, engine == simulator."""

import json
import xml.etree.ElementTree as ET

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import make_request, random_model, serve_all
from minirt.cli.command import EXIT_OK, EXIT_USAGE, run_command
from minirt.engine.engine import Engine
from minirt.engine.runner import ModelRunner
from minirt.errors import MinirtError
from minirt.rounds import main
from minirt.cli.simulation import simulate
from minirt.cli.svg import svg_panels
from minirt.engine.params import SamplingParams

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
lengths = st.lists(st.integers(1, 12), min_size=1, max_size=12)


def test_seed_exercise_static():
    sim = simulate([2, 5, 8, 4], "static", rows=3)
    first_group = sim.stats.groups[0]
    assert (first_group.first_round, first_group.last_round) == (1, 8)
    assert first_group.active_rows == [3, 3, 2, 2, 2, 1, 1, 1]
    fourth = sim.requests[3]
    assert fourth.rounds_waited == 8 and fourth.first_round == 9 and fourth.finish_round == 12


def test_seed_exercise_continuous():
    sim = simulate([2, 5, 8, 4], "continuous", rows=3)
    fourth = sim.requests[3]
    assert fourth.first_round == 3 and fourth.rounds_waited == 2 and fourth.finish_round == 6
    assert sim.total_rounds == 8 and sim.stats.active_rows_per_round == [3, 3, 3, 3, 3, 2, 1, 1]


def test_cli_json_for_the_seed_exercise(capsys):
    assert run_command(main, ["--lengths", "2,5,8,4", "--batch-size", "3", "--json"]) == EXIT_OK
    report = json.loads(capsys.readouterr().out)
    static, continuous = report["policies"]["static"], report["policies"]["continuous"]
    assert static["total_rounds"] == 12 and continuous["total_rounds"] == 8
    assert static["requests"][3] == {
        "index": 3,
        "output_len": 4,
        "rounds_waited": 8,
        "first_round": 9,
        "finish_round": 12,
        "cached_prompt_tokens": 0,
        "prefill_rounds": 1,
    }
    assert continuous["requests"][3]["first_round"] == 3
    assert static["utilization"] == pytest.approx(
        19 / (3 * 8 + 1 * 4), abs=1e-6
    )  # active / held row-rounds


@SETTINGS
@given(output_lens=lengths, rows=st.integers(1, 5), data=st.data())
def test_every_request_gets_exactly_its_tokens(output_lens, rows, data):
    prompts = data.draw(
        st.lists(st.integers(1, 9), min_size=len(output_lens), max_size=len(output_lens))
    )
    for policy in ("static", "continuous"):
        sim = simulate(output_lens, policy, rows, prompts, round_tokens=16)
        for r, n in zip(sim.requests, output_lens, strict=True):
            # Its prompt's rounds (more than one when continuous batching chunks it), the last giving its
            # first token, then a token a round; static groups prefill in one round.
            assert r.prefill_rounds == 1 or policy == "continuous"
            assert (
                len(r.token_ids) == n
                and r.finish_round - r.first_round + 1 == n + r.prefill_rounds - 1
            )
        assert sum(sim.stats.active_rows_per_round) == sum(output_lens) + sum(
            r.prefill_rounds - 1 for r in sim.requests
        )
        assert max(sim.stats.active_rows_per_round) <= rows


@SETTINGS
@given(output_lens=lengths, rows=st.integers(1, 5), kv_extra=st.integers(0, 40))
def test_static_rounds_are_the_sum_of_each_groups_longest(output_lens, rows, kv_extra):
    kv_budget = max(output_lens) + kv_extra  # prompts of 1: a request reserves its output length
    sim = simulate(output_lens, "static", rows, kv_budget=kv_budget)
    groups = sim.stats.groups
    assert sim.total_rounds == sum(max(len(r.token_ids) for r in g.members) for g in groups)
    order = [r.index for g in groups for r in g.members]
    assert order == list(range(len(output_lens)))  # groups take requests in arrival order
    for g in groups:
        longest = max(
            len(r.token_ids) for r in g.members
        )  # with 1-token prompts, a request reserves its length
        assert len(g.members) <= rows
        assert len(g.members) == 1 or len(g.members) * longest <= kv_budget
    if kv_budget >= rows * max(
        output_lens
    ):  # memory never binds: groups are consecutive chunks of `rows`
        chunks = [output_lens[i : i + rows] for i in range(0, len(output_lens), rows)]
        assert sim.total_rounds == sum(max(c) for c in chunks)


@SETTINGS
@given(output_lens=lengths, rows=st.integers(1, 5), data=st.data())
def test_continuous_never_leaves_a_row_idle_while_a_fitting_request_waits(output_lens, rows, data):
    prompts = data.draw(
        st.lists(st.integers(1, 9), min_size=len(output_lens), max_size=len(output_lens))
    )
    kv_budget = data.draw(
        st.integers(max(p + n - 1 for p, n in zip(prompts, output_lens, strict=True)), 80)
    )
    round_tokens = data.draw(st.integers(max(prompts), 30))
    chunked = data.draw(st.booleans())
    checked = []

    def check(scheduler, plan):
        reserved = sum(scheduler.kv_positions_needed(r) for r in plan.active)
        # A prefilling row feeds its prompt from where it stands to the plan's end (no cache here: an admitted
        # one from 0), a decode row one token.
        fed = [plan.prefill_to[r] - r.prefilled if r in plan.prefill_to else 1 for r in plan.active]
        assert all(n >= 1 for n in fed)
        tokens = sum(fed)
        if not chunked:
            assert all(plan.prefill_to[r] == r.prompt_len for r in plan.prefill_to)
        # The pool gives each row the longest need, so the budget may cap the rows below `rows`, and says so;
        # it never has more rows than requests.
        longest_need = max(p + n - 1 for p, n in zip(prompts, output_lens, strict=True))
        pool_rows = max(1, min(rows, len(output_lens), kv_budget // longest_need))
        assert scheduler.pool.rows == pool_rows
        if plan.round_number == 1:
            assert (plan.kv_shape.rows, plan.kv_shape.capacity) == (pool_rows, longest_need)
            # The budget, not the queue, held it down.
            assert plan.kv_limited == (pool_rows < min(rows, len(output_lens)))
        # Chunked, a row still prefilling feeds at least one token, even past the budget.
        assert (
            reserved <= kv_budget
            and tokens <= max(round_tokens, len(plan.active))
            and len(plan.active) <= pool_rows
        )
        if len(plan.active) < pool_rows:  # a free row: nobody waiting may fit it
            for waiting in scheduler.waiting:
                fits_kv = reserved + scheduler.kv_positions_needed(waiting) <= kv_budget
                if chunked:
                    fits_tokens = tokens < round_tokens
                else:
                    fits_tokens = tokens + waiting.prompt_len <= round_tokens
                assert not (fits_kv and fits_tokens), f"row idle while request {waiting.index} fits"
        checked.append(len(plan.active))

    sim = simulate(
        output_lens,
        "continuous",
        rows,
        prompts,
        kv_budget=kv_budget,
        round_tokens=round_tokens,
        on_plan=check,
        chunked_prefill=chunked,
    )
    assert checked == sim.stats.active_rows_per_round  # the check ran on every round's plan


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    output_lens=st.lists(st.integers(1, 7), min_size=1, max_size=7),
    rows=st.integers(1, 4),
    data=st.data(),
)
def test_the_engines_real_trace_agrees_with_the_simulator(output_lens, rows, data):
    model = random_model(seed=5, vocab_size=40, n_positions=32)
    prompts = data.draw(
        st.lists(st.integers(1, 6), min_size=len(output_lens), max_size=len(output_lens))
    )
    tokens_by_policy = {}
    for policy in ("static", "continuous"):
        engine = Engine(
            ModelRunner(model), None, batch_size=rows, policy=policy, round_token_budget=12
        )
        requests = [
            make_request(
                engine,
                i,
                list(range(1, p + 1)),
                SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0),
            )
            for i, (p, n) in enumerate(zip(prompts, output_lens, strict=True))
        ]
        stats = serve_all(engine, requests)
        sim = simulate(
            output_lens,
            policy,
            rows,
            prompts,
            kv_budget=engine.kv_budget_positions,
            round_tokens=12,
        )
        assert [(r.first_round, r.finish_round) for r in requests] == [
            (r.first_round, r.finish_round) for r in sim.requests
        ]
        assert stats.active_rows_per_round == sim.stats.active_rows_per_round
        tokens_by_policy[policy] = [r.token_ids for r in requests]
    assert (
        tokens_by_policy["static"] == tokens_by_policy["continuous"]
    )  # the policy never changes a result


def test_svg_is_well_formed_and_draws_every_active_cell(tmp_path):
    sims = [simulate([2, 5, 8, 4], policy, rows=3) for policy in ("static", "continuous")]
    svg = svg_panels(sims, "seed exercise")
    root = ET.fromstring(svg)
    cell = int(root.get("data-cell"))
    blue = [
        int(el.get("width"))
        for el in root.iter("{http://www.w3.org/2000/svg}rect")
        if el.get("fill") == "#2b6cb0"
    ]
    active_cells = sum(2 + 5 + 8 + 4 for _ in sims)
    gap = 1 if cell >= 10 else 0
    assert len(blue) - 1 == active_cells and set(blue[:-1]) == {
        cell - gap
    }  # one rect per active cell, then the legend
    assert (
        run_command(
            main, ["--lengths", "2,5,8,4", "--batch-size", "3", "--svg", str(tmp_path / "g.svg")]
        )
        == EXIT_OK
    )
    ET.parse(tmp_path / "g.svg")


def test_workload_comparison_and_errors(capsys):
    assert (
        run_command(main, ["--workload", "30", "--seed", "1", "--batch-sizes", "2,4", "--json"])
        == EXIT_OK
    )
    report = json.loads(capsys.readouterr().out)
    for rows in ("2", "4"):
        static = report["batch_sizes"][rows]["policies"]["static"]
        continuous = report["batch_sizes"][rows]["policies"]["continuous"]
        assert continuous["total_rounds"] <= static["total_rounds"]
        assert len(static["requests"]) == 30
    for argv, fragment in [
        (["--lengths", "2,0"], "length must be an integer >= 1"),
        (["--lengths", "2,5", "--prompt-lengths", "1"], "but 1 prompt length"),
        (["--lengths", "2,5", "--batch-size", "0"], "--batch-size"),
    ]:
        try:
            code = run_command(main, argv, prog="minirt.rounds")
        except SystemExit as exc:  # argparse refuses a malformed flag itself, also with status 2
            code = exc.code
        assert code == EXIT_USAGE
        assert fragment in capsys.readouterr().err


def test_a_shared_prefix_is_cached_for_those_admitted_after_the_first_prefill_and_chunks_are_drawn(
    capsys,
):
    flags = "--lengths 4,4,4,4 --prompt-lengths 40,40,40,40 --shared-prefix 32 --batch-size 2 --prefix-cache"
    assert main([*flags.split(), "--max-round-tokens", "24", "--json"]) == EXIT_OK
    report = json.loads(capsys.readouterr().out)["policies"]
    static = report["static"]["requests"]
    continuous = report["continuous"]["requests"]
    # By hand: 32 shared tokens are two blocks of 16, and a 40-token prompt may use (40 - 1) // 16 = 2 of them.
    # Static: requests 0 and 1 prefill together (nothing is cached yet), 2 and 3 find both blocks.
    assert [r["cached_prompt_tokens"] for r in static] == [0, 0, 32, 32]
    assert [r["prefill_rounds"] for r in static] == [1, 1, 1, 1]
    # Continuous, 24 tokens a round, decode rows first: request 0 is fed 24 + 16 tokens (rounds 1-2, its first
    # token in 2).  Request 1 shares two blocks with it, in flight, so it waits for them rather than computing
    # them again: admitted in round 3 with 32 cached, it feeds its last 8 and gets its first token at once.  Rows
    # free up after rounds 5 and 6, all with 32 cached.
    assert [r["cached_prompt_tokens"] for r in continuous] == [0, 32, 32, 32]
    assert [r["prefill_rounds"] for r in continuous] == [2, 1, 1, 1]
    assert [(r["first_round"], r["finish_round"]) for r in continuous] == [
        (1, 5),
        (3, 6),
        (6, 9),
        (7, 10),
    ]
    assert main([*flags.split(), "--max-round-tokens", "24"]) == EXIT_OK
    text = capsys.readouterr().out
    assert "req 0   ~ # # # #" in text and "req 1   - - # # # #" in text
    assert main([*flags.replace(" --prefix-cache", "").split(), "--json"]) == EXIT_OK
    report = json.loads(capsys.readouterr().out)["policies"]
    assert all(r["cached_prompt_tokens"] == 0 for p in report.values() for r in p["requests"])


def test_unchunked_a_prompt_over_the_round_budget_can_never_run(capsys):
    flags = "--lengths 2 --prompt-lengths 30 --max-round-tokens 20 --no-chunked-prefill"
    with pytest.raises(MinirtError, match="exceeds the round token budget of 20"):
        main(flags.split())
