"""`minirt serve --replicas N`: the command's side of serving on Ray Serve.

Owns: `start_replicas`, which starts Ray (or joins a cluster: `--ray ADDRESS`), starts Ray Serve
without its HTTP proxy (the ingress is `minirt serve`'s own server, in this process), deploys N
replicas of `EngineReplica` (minirt/distributed/engine_replica.py: each one engine thread, made
from this command's flags) with the request router --routing names, waits until every replica
reports, and returns a `Replicas`: what the server needs to make its engine client
(`make_client`, a `ReplicaClient`) and to shut everything down (`shut_down`).

    --routing power-of-two   Ray Serve's default router: two replicas drawn at random, the one
                             with fewer requests in flight (its probes) takes it
    --routing prefix         minirt/distributed/prefix_router.py: the replica that served the
                             prompt's prefix last, within a margin of --batch-size requests

Each replica asks Ray for REPLICA_CPUS logical CPU and runs its BLAS on that many threads;
locally Ray is given a logical CPU for each replica and two more, whatever the cores.

Must not know: HTTP, the routes, or the layers.
"""

from __future__ import annotations

import logging
import os
import time
from argparse import Namespace
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import ray
from ray import serve
from ray.serve.config import RequestRouterConfig

from ..engine.client import EngineObserver, EngineSnapshot
from ..errors import MinirtError
from .engine_replica import EngineReplica, MetricsBoard
from .prefix_router import PrefixAffinityRouter
from .ray_cluster import native_stderr_muted, start_ray
from .replica_client import ReplicaClient

ROUTINGS = ("power-of-two", "prefix")
DEPLOYMENT_NAME = "minirt-engine"
REPLICA_CPUS = 1
# How long the replicas may take to load the model and report.
READY_TIMEOUT_S = 600.0
# --routing prefix's router, as Ray Serve imports it.
ROUTER_PATH = f"{PrefixAffinityRouter.__module__}.{PrefixAffinityRouter.__name__}"


@dataclass
class Replicas:
    """Replicas deployed on Ray Serve, and what the server makes its client from."""

    handle: object
    board: object
    args: Namespace
    first_snapshot: EngineSnapshot
    started_ray: bool
    # The Serve application, named for this process: a cluster may hold several servers' own.
    app_name: str

    def make_client(self, observer: EngineObserver, on_shutdown) -> ReplicaClient:
        """The engine client the server's app takes, over these replicas."""
        return ReplicaClient(
            self.handle,
            self.board,
            self.args.max_queue,
            self.first_snapshot,
            self.args.replicas,
            observer=observer,
            on_shutdown=on_shutdown,
            round_delay_s=self.args.round_delay / 1000,
            batch_window_s=self.args.batch_window / 1000,
        )

    def shut_down(self) -> None:
        """This server's replicas and board end; on a Ray this command started, Ray Serve and
        Ray end too (a cluster it joined keeps Serve, and whatever else runs there)."""
        shut_down(self.app_name, self.board, self.started_ray)


def shut_down(app_name: str, board, started_ray: bool) -> None:
    """The application `app_name` and the board gone; Serve and Ray too if `started_ray`."""
    with native_stderr_muted():
        if started_ray:
            serve.shutdown()
            ray.shutdown()
            return
        serve.delete(app_name)
        if board is not None:
            ray.kill(board)


def start_replicas(
    args: Namespace, folder: Path, first_snapshot: EngineSnapshot, progress
) -> Replicas:
    """Ray, Ray Serve, and --replicas replicas serving the model in `folder`, each reporting;
    `progress(line)` hears each step."""
    started_ray = not ray.is_initialized()
    if started_ray:
        start_ray(args.ray, args.replicas * REPLICA_CPUS + 2)
    progress(f"ray: {args.ray}, {int(ray.cluster_resources().get('CPU', 0))} logical CPUs")
    # Ray Serve's own progress lines (the command prints its own), here and in the replicas.
    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    with native_stderr_muted():
        serve.start(proxy_location="Disabled", logging_config={"log_level": "WARNING"})
    app_name = f"minirt-{os.getpid()}"
    board = None
    try:
        board = ray.remote(num_cpus=0)(MetricsBoard).remote()
        handle = deploy(args, folder, board, app_name, progress)
        wait_for_reports(board, args.replicas)
    except BaseException:
        # Failed or interrupted while starting: nothing of this server is left on the cluster.
        shut_down(app_name, board, started_ray)
        raise
    return Replicas(handle, board, args, first_snapshot, started_ray, app_name)


def deploy(args: Namespace, folder: Path, board, app_name: str, progress):
    """The replicas' deployment, run as the application `app_name`; its handle."""
    deployment = serve.deployment(
        name=DEPLOYMENT_NAME,
        num_replicas=args.replicas,
        ray_actor_options={"num_cpus": REPLICA_CPUS},
        # A replica takes what its engine can hold (its rows and its queue).  The ingress
        # refuses (503) what would pass every replica's (ReplicaClient.fleet_refusal), so the
        # router waits for a replica with room only briefly, while one finishes.
        max_ongoing_requests=args.max_queue + args.batch_size,
        request_router_config=router_config(args),
        health_check_period_s=2.0,
        health_check_timeout_s=10.0,
    )(EngineReplica)
    progress(f"ray serve: starting {args.replicas} replicas ({args.routing} routing)")
    return serve.run(deployment.bind(args, str(folder), board), name=app_name, route_prefix=None)


def router_config(args: Namespace) -> RequestRouterConfig:
    """Ray Serve's own router, or the prefix router with a margin of --batch-size."""
    if args.routing == "prefix":
        return RequestRouterConfig(
            # Ray Serve imports it by its path. Its pydantic field is typed as a class, which mypy
            # holds against a string when Ray is installed (and not when it is absent): hence Any.
            request_router_class=cast(Any, ROUTER_PATH),
            request_router_kwargs={"imbalance": args.batch_size},
        )
    return RequestRouterConfig()


def wait_for_reports(board, replicas: int) -> None:
    """Until every replica has reported to the board (its engine runs), or READY_TIMEOUT_S."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    heard: set[str] = set()
    while len(heard) < replicas:
        if time.monotonic() > deadline:
            raise MinirtError(
                f"only {len(heard)} of {replicas} replicas started within {READY_TIMEOUT_S:g} s; "
                "see Ray's logs under /tmp/ray/session_latest/logs"
            )
        heard = set(ray.get(board.heard.remote()))
        time.sleep(0.1)
