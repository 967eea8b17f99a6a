"""Starting Ray, or joining a cluster, for both ways minirt runs on it: `generate --ray`
(minirt/distributed/ray_data.py) and `serve --replicas` (minirt/distributed/serve_replicas.py).

Owns: `start_ray` ('local': a new Ray instance on this machine, with at least the logical CPUs
asked for; else an address: 'auto', HOST:PORT or ray://HOST:PORT of a running cluster), with
Ray's own start-up chatter muted and any failure as one MinirtError line;
`native_stderr_muted`; and `check_answers` (ask a HOST:PORT once, since Ray retries it for
minutes).

Must not know: what runs on Ray, the layers, or the command line.
"""

from __future__ import annotations

import os
import socket
import sys
from contextlib import contextmanager
from typing import Any, Iterator

import ray

from ..errors import MinirtError


def start_ray(address: str, local_cpus: int) -> None:
    """Ray started ('local', with at least `local_cpus` logical CPUs: more than this machine's
    cores is how Ray is told that its actors may share them) or joined; one line if not."""
    check_answers(address)
    options: dict[str, Any] = {
        "logging_level": "ERROR",
        "include_dashboard": False,
        "log_to_driver": False,
    }
    # Ray's C++ core logs, at error level, things that are expected (Ray Data keeps its worker
    # class in the object store); any real failure still reaches the command as an exception.  A
    # user's own setting wins.
    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "fatal")
    try:
        # Ray's C++ side says at start where its logs go and at what level.
        with native_stderr_muted():
            if address == "local":
                ray.init(num_cpus=max(os.cpu_count() or 1, local_cpus), **options)
            else:
                ray.init(address=address, **options)
    # Ray raises many kinds: any failure to start or connect is one line.
    except Exception as exc:  # noqa: BLE001 (see above)
        message = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise MinirtError(
            f"--ray {address}: cannot start or reach Ray ({message}); use --ray local, or start a "
            "cluster with `ray start --head` and pass --ray auto"
        ) from None


@contextmanager
def native_stderr_muted() -> Iterator[None]:
    """File descriptor 2 goes to /dev/null within the block (Python's own errors still come as
    exceptions)."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def check_answers(address: str) -> None:
    """HOST:PORT: Ray would retry it for minutes, so ask once whether anything answers there."""
    host, colon, port = address.rpartition(":")
    if not (colon and port.isdigit() and "://" not in address):
        return
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as exc:
        raise MinirtError(
            f"--ray {address}: nothing answers there ({exc.strerror or exc}); start the cluster "
            "with `ray start --head`, or use --ray local"
        ) from None
