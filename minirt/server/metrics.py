"""What `GET /metrics` shows: Prometheus metrics, in vLLM's names with a `minirt:` prefix.

Owns: `ServerMetrics`, one server's metrics in a registry of its own (no global state: two
servers in one process keep apart), the observer the engine's client is given
(minirt/engine/client.py `EngineObserver`: it hears plain values on the engine's thread: a first
token with its waits and prompt counts, a finished `CompletionOutput` with its latency, a round's
new tokens, the counts' `EngineSnapshot`), and written out by `prometheus_client` (its
collectors are safe to update from one thread and read from another).

    minirt:num_requests_running        requests that hold a row (gauge)
    minirt:num_requests_waiting        requests queued for a row (gauge)
    minirt:kv_cache_usage_perc         KV positions the running requests reserve, over the KV
                                       budget (0 to 1, gauge)
    minirt:kv_slots_used               KV slots held by running requests (gauge)
    minirt:prompt_tokens_total         prompt tokens prefilled (counter)
    minirt:generation_tokens_total     tokens generated (counter)
    minirt:request_success_total       requests finished, by finished_reason: stop, length,
                                       abort, error (counter)
    minirt:time_to_first_token_seconds from the request's arrival to its first token (histogram)
    minirt:time_per_output_token_seconds  (finish - first token) / (tokens - 1) (histogram)
    minirt:e2e_request_latency_seconds from arrival to the final record (histogram)
    minirt:request_queue_time_seconds  from arrival to the start of its prefill round (histogram)
    minirt:rounds_total                rounds run: forward passes of the batch (counter)

Served by replicas (`minirt serve --replicas N`, minirt/distributed/replica_client.py), every
name above is the fleet's: each replica's engine observer calls are replayed here, so counters
and histograms sum over replicas, and the gauges are the fleet's sums (the KV usage is every
replica's reserved positions over every replica's budget).  The figures that are a replica's own
(rows, queue, KV use and slots, the prefix cache's positions, lookups and hits, rounds) are also
shown once per replica, in the same family with a `replica` label:

    minirt:num_requests_running{model_name="m"} 3.0              the fleet
    minirt:num_requests_running{model_name="m",replica="a1b2"} 2.0   one replica

so a query sums `{replica!=""}` or reads the series without the label, never both.  And
`minirt:replica_info{replica="a1b2",pid="4242"} 1` names each live replica's process.

Must not know: HTTP, how a round is computed, or the engine's own objects (its Engine,
scheduler or requests).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

from ..engine.client import EngineObserver, EngineSnapshot
from ..engine.output import CompletionOutput

# Seconds: from a round of a tiny model (~1 ms) to a long queue.
LATENCY_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5)

FINISH_REASONS = ("stop", "length", "abort", "error")


def kv_usage(snapshot: EngineSnapshot) -> float:
    """KV positions reserved over the KV budget (0 to 1)."""
    return snapshot.kv_positions_reserved / max(1, snapshot.kv_budget_positions)


# Each replica's own figures (a sample name, and its value in a replica's snapshot).
PER_REPLICA_SAMPLES = {
    "minirt:num_requests_running": lambda snapshot: snapshot.running,
    "minirt:num_requests_waiting": lambda snapshot: snapshot.waiting,
    "minirt:kv_cache_usage_perc": kv_usage,
    "minirt:kv_slots_used": lambda snapshot: snapshot.kv_slots_used,
    "minirt:prefix_cache_positions": lambda snapshot: snapshot.prefix_cache_positions,
    "minirt:prefix_cache_queries_total": lambda snapshot: snapshot.prefix_cache_queries,
    "minirt:prefix_cache_hits_total": lambda snapshot: snapshot.prefix_cache_hits,
    "minirt:rounds_total": lambda snapshot: snapshot.rounds,
}


class ServerMetrics(EngineObserver):
    """One server's metrics, labelled with its model name."""

    def __init__(self, model_name: str):
        self.registry = CollectorRegistry()
        self.model_name = model_name
        self.make_gauges()
        self.make_counters()
        self.make_histograms()
        # Every series exists from the start, at 0.
        for reason in FINISH_REASONS:
            self.success.labels(model_name, reason)
        for metric in (
            self.running,
            self.waiting,
            self.kv_usage,
            self.kv_slots,
            self.prompt_tokens,
            self.prefix_cache_queries,
            self.prefix_cache_hits,
            self.prefix_cache_positions,
            self.generation_tokens,
            self.ttft,
            self.tpot,
            self.e2e,
            self.queue_time,
        ):
            metric.labels(model_name)
        self.rounds = self.rounds_counter.labels(model_name)
        # Served by replicas: each one's latest snapshot, by its label (none in one process).
        self.replicas: dict[str, EngineSnapshot] = {}
        self.replica_pids: dict[str, int] = {}

    def make_gauges(self) -> None:
        def gauge(name: str, what: str) -> Gauge:
            return Gauge(name, what, ["model_name"], registry=self.registry)

        self.running = gauge("minirt:num_requests_running", "Requests that hold a row.")
        self.waiting = gauge("minirt:num_requests_waiting", "Requests queued for a row.")
        self.kv_usage = gauge(
            "minirt:kv_cache_usage_perc",
            "KV positions the running requests reserve, over the KV budget (1 is full).",
        )
        self.kv_slots = gauge("minirt:kv_slots_used", "KV slots held by running requests.")
        self.prefix_cache_positions = gauge(
            "minirt:prefix_cache_positions",
            "KV positions the prefix cache holds (within what the KV budget leaves).",
        )

    def make_counters(self) -> None:
        """Counters: prometheus_client adds `_total` to each name."""

        def counter(name: str, what: str, labels=("model_name",)) -> Counter:
            return Counter(name, what, list(labels), registry=self.registry)

        self.prompt_tokens = counter("minirt:prompt_tokens", "Prompt tokens prefilled.")
        self.prefix_cache_queries = counter(
            "minirt:prefix_cache_queries", "Prompt tokens looked up in the prefix cache."
        )
        self.prefix_cache_hits = counter(
            "minirt:prefix_cache_hits", "Prompt tokens found in the prefix cache (not computed)."
        )
        self.generation_tokens = counter("minirt:generation_tokens", "Tokens generated.")
        self.success = counter(
            "minirt:request_success",
            "Requests finished, by reason.",
            labels=("model_name", "finished_reason"),
        )
        self.rounds_counter = counter("minirt:rounds", "Rounds run (forward passes).")

    def make_histograms(self) -> None:
        def histogram(name: str, what: str, buckets) -> Histogram:
            return Histogram(name, what, ["model_name"], buckets=buckets, registry=self.registry)

        self.ttft = histogram(
            "minirt:time_to_first_token_seconds", "Arrival to first token.", LATENCY_BUCKETS
        )
        self.tpot = histogram(
            "minirt:time_per_output_token_seconds",
            "Seconds per token after the first.",
            TOKEN_BUCKETS,
        )
        self.e2e = histogram(
            "minirt:e2e_request_latency_seconds", "Arrival to the final record.", LATENCY_BUCKETS
        )
        self.queue_time = histogram(
            "minirt:request_queue_time_seconds", "Arrival to its prefill round.", LATENCY_BUCKETS
        )

    def first_token(
        self,
        seconds: float,
        queued_seconds: float,
        prompt_tokens: int,
        looked_up_tokens: int,
        cached_tokens: int,
    ) -> None:
        """A request's prefill gave its first token, `seconds` after it arrived; it had waited
        `queued_seconds` for its round to start; its prompt had `prompt_tokens`, of which
        `looked_up_tokens` were looked up in the prefix cache (none without one) and
        `cached_tokens` found there."""
        name = self.model_name
        self.prompt_tokens.labels(name).inc(prompt_tokens)
        self.prefix_cache_queries.labels(name).inc(looked_up_tokens)
        self.prefix_cache_hits.labels(name).inc(cached_tokens)
        self.ttft.labels(name).observe(seconds)
        self.queue_time.labels(name).observe(max(0.0, queued_seconds))

    def round_ran(self, new_tokens: int) -> None:
        self.rounds.inc()
        self.generation_tokens.labels(self.model_name).inc(new_tokens)

    def finished(self, output: CompletionOutput, seconds: float) -> None:
        """A request's record is final, `seconds` after it arrived."""
        name = self.model_name
        reason = output.finish_reason or "error"
        self.success.labels(name, reason).inc()
        self.e2e.labels(name).observe(seconds)
        first = output.first_token_s
        last = output.finish_s
        if len(output.token_ids) > 1 and first is not None and last is not None:
            per_token = (last - first) / (len(output.token_ids) - 1)
            self.tpot.labels(name).observe(per_token)

    def observe(self, snapshot: EngineSnapshot) -> None:
        """The gauges, after each iteration of the engine's thread (a round, or an abort)."""
        name = self.model_name
        self.running.labels(name).set(snapshot.running)
        self.waiting.labels(name).set(snapshot.waiting)
        self.kv_usage.labels(name).set(kv_usage(snapshot))
        self.kv_slots.labels(name).set(snapshot.kv_slots_used)
        self.prefix_cache_positions.labels(name).set(snapshot.prefix_cache_positions)

    def observe_replicas(self, snapshots: dict[str, EngineSnapshot], pids: dict[str, int]) -> None:
        """Served by replicas: each live replica's latest snapshot and process id, by its label
        (new dicts, each replaced whole, so that a scrape reads one or the other)."""
        self.replica_pids = {label: pids[label] for label in snapshots if label in pids}
        self.replicas = dict(snapshots)

    def collect(self):
        """The registry's metric families, each replica's own figures added to theirs."""
        replicas = self.replicas
        for family in self.registry.collect():
            for sample_name, value_of in PER_REPLICA_SAMPLES.items():
                if sample_name not in (family.name, family.name + "_total"):
                    continue
                for label, snapshot in sorted(replicas.items()):
                    labels = {"model_name": self.model_name, "replica": label}
                    family.samples.append(Sample(sample_name, labels, float(value_of(snapshot))))
            yield family
        if replicas:
            yield self.replica_info()

    def replica_info(self) -> Metric:
        """One sample per live replica, always 1, naming its process: which process holds the
        rows a replica's series count."""
        info = Metric("minirt:replica", "Each live replica, and its process id.", "info")
        for label, pid in sorted(self.replica_pids.items()):
            labels = {"model_name": self.model_name, "replica": label, "pid": str(pid)}
            info.add_sample("minirt:replica_info", labels, 1.0)
        return info

    def exposition(self) -> bytes:
        """The metrics in Prometheus' text format."""
        # generate_latest takes anything with a collect(): this object's adds the replicas.
        return generate_latest(self)
