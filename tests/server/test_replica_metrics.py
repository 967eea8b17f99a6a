"""The metrics of `minirt serve --replicas`: the fleet's figures under one process's names, and each
replica's own figures beside them with a `replica` label, read back with prometheus_client's own
parser (values from hand arithmetic on the snapshots given)."""

from __future__ import annotations

import pytest

pytest.importorskip("prometheus_client", reason='needs the serve extra (pip install -e ".[serve]")')

from prometheus_client.parser import text_string_to_metric_families

from minirt.engine.client import EngineSnapshot
from minirt.server.metrics import ServerMetrics


def snapshot(running: int, reserved: int, hits: int, rounds: int) -> EngineSnapshot:
    return EngineSnapshot(
        running=running,
        waiting=1,
        kv_positions_reserved=reserved,
        kv_budget_positions=1000,
        kv_slots_used=running,
        prefix_cache_positions=32,
        prefix_cache_queries=100,
        prefix_cache_hits=hits,
        rounds=rounds,
        policy="continuous",
        batch_size=8,
        round_token_budget=512,
        chunked_prefill=True,
        prefix_cache=True,
        context_length=1024,
    )


def samples(metrics: ServerMetrics) -> list:
    text = metrics.exposition().decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def value(found: list, name: str, **labels) -> float:
    (match,) = [s.value for s in found if s.name == name and s.labels == labels]
    return match


def test_each_replica_beside_the_fleet():
    metrics = ServerMetrics("m")
    one = snapshot(running=3, reserved=300, hits=64, rounds=10)
    two = snapshot(running=1, reserved=100, hits=0, rounds=4)
    fleet = snapshot(running=4, reserved=400, hits=64, rounds=14)
    fleet = EngineSnapshot(**{**fleet.__dict__, "kv_budget_positions": 2000})
    metrics.observe(fleet)
    metrics.observe_replicas({"a": one, "b": two}, {"a": 41, "b": 42})
    found = samples(metrics)
    assert value(found, "minirt:num_requests_running", model_name="m") == 4
    assert value(found, "minirt:num_requests_running", model_name="m", replica="a") == 3
    assert value(found, "minirt:num_requests_running", model_name="m", replica="b") == 1
    # The fleet's usage: every replica's reserved over every replica's budget.
    assert value(found, "minirt:kv_cache_usage_perc", model_name="m") == 400 / 2000
    assert value(found, "minirt:kv_cache_usage_perc", model_name="m", replica="a") == 0.3
    assert value(found, "minirt:prefix_cache_hits_total", model_name="m", replica="a") == 64
    assert value(found, "minirt:rounds_total", model_name="m", replica="b") == 4
    assert value(found, "minirt:replica_info", model_name="m", replica="b", pid="42") == 1
    # Figures that are not a replica's own get no replica series.
    assert not [
        s for s in found if s.name == "minirt:prompt_tokens_total" and "replica" in s.labels
    ]


def test_one_process_shows_no_replica_series():
    metrics = ServerMetrics("m")
    metrics.observe(snapshot(running=2, reserved=10, hits=0, rounds=1))
    found = samples(metrics)
    assert not [s for s in found if "replica" in s.labels]
    assert not [s for s in found if s.name == "minirt:replica_info"]


def test_a_replica_gone_drops_its_series():
    metrics = ServerMetrics("m")
    metrics.observe_replicas(
        {"a": snapshot(1, 1, 0, 1), "b": snapshot(1, 1, 0, 1)}, {"a": 1, "b": 2}
    )
    metrics.observe_replicas({"b": snapshot(0, 0, 0, 2)}, {"b": 2})
    found = samples(metrics)
    assert {s.labels["replica"] for s in found if "replica" in s.labels} == {"b"}
