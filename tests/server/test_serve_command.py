"""`minirt serve` as a command: a bad flag, model or port is one line and exit 2 before it listens; without the
serve extra it says how to install it; --help shows examples and the limits."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
from conftest import ROOT
from serving import MISSING


def serve(*flags: str, code: str | None = None) -> subprocess.CompletedProcess:
    if code is None:
        command = [sys.executable, "-m", "minirt", "serve", *flags]
    else:
        command = [sys.executable, "-c", code, *flags]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)


def assert_one_line_refusal(done: subprocess.CompletedProcess, *words: str) -> None:
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("minirt serve: error: "), done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    for word in words:
        assert word in lines[0]


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--port", "70000"], ["--port", "65535"]),
        (["--port", "x"], ["--port"]),
        (["--batch-size", "0"], ["--batch-size"]),
        (["--max-queue", "0"], ["--max-queue"]),
        (["--kv-budget", "lots"], ["--kv-budget"]),
        (["--policy", "fifo"], ["--policy"]),
        (["--shutdown-timeout", "-1"], ["--shutdown-timeout"]),
        (["--api-key", ""], ["--api-key"]),
        (["--no-such-flag"], ["--no-such-flag"]),
        # Replicas (checked before Ray is imported or the model loaded).
        (["--replicas", "0"], ["--replicas", "at least 1"]),
        (["--ray", "auto"], ["--ray", "add --replicas N"]),
        (["--routing", "prefix"], ["--routing", "add --replicas N"]),
        (["--replicas", "2", "--routing", "random"], ["--routing", "power-of-two"]),
        (["--replicas", "2", "--routing", "prefix"], ["--routing prefix", "add --prefix-cache"]),
        (["--replicas", "2", "--ray", " "], ["--ray is empty"]),
        (
            ["--replicas", "2", "--prefix-cache", "--routing", "prefix", "--ray", "ray://h:10001"],
            ["--routing prefix cannot route through a Ray Client address", "--ray auto"],
        ),
    ],
)
def test_a_bad_flag_is_one_line_and_exit_2(flags, words):
    assert_one_line_refusal(serve(*flags), *words)


def test_without_the_serve_extra_it_says_how_to_install_it():
    # starlette hidden, as if not installed: the import fails as it would.
    hide = "import sys; sys.modules['starlette'] = None; from minirt.__main__ import main; sys.argv[0] = 'minirt'; raise SystemExit(main(['serve'] + sys.argv[1:]))"
    done = serve(code=hide)
    assert_one_line_refusal(done, "serve extra", "starlette", 'pip install -e ".[serve]"')
    # Its help needs nothing of the web stack.
    helped = serve("--help", code=hide)
    assert helped.returncode == 0 and "examples:" in helped.stdout


def test_replicas_without_ray_serve_say_how_to_install_it():
    hide = "import sys; sys.modules['ray'] = None; from minirt.__main__ import main; sys.argv[0] = 'minirt'; raise SystemExit(main(['serve'] + sys.argv[1:]))"
    done = serve("--replicas", "2", code=hide)
    assert_one_line_refusal(done, "--replicas needs Ray Serve", 'pip install -e ".[serve,ray]"')


def test_help_shows_examples_the_endpoints_and_the_limits():
    done = serve("--help")
    assert done.returncode == 0
    for words in (
        "examples:",
        "curl",
        "--max-body-bytes",
        "413",
        "--max-queue",
        "503",
        "/v1/completions",
        "--shutdown-timeout",
    ):
        assert words in done.stdout


@pytest.mark.serve
@pytest.mark.skipif(bool(MISSING), reason="the serve extra is not installed")
def test_a_taken_port_a_bad_host_and_a_missing_model_are_one_line_and_exit_2(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = str(holder.getsockname()[1])
        assert_one_line_refusal(serve("--port", port), "--port " + port, "cannot listen")
    assert_one_line_refusal(serve("--port", "0", "--model", str(tmp_path / "nothing")), "nothing")
    assert_one_line_refusal(serve("--port", "0", "--host", "no-such-host.invalid"), "--host")


@pytest.mark.serve
@pytest.mark.skipif(bool(MISSING), reason="the serve extra is not installed")
def test_a_kv_budget_that_holds_no_token_is_one_line_and_exit_2():
    done = subprocess.run(
        [sys.executable, "-m", "minirt", "serve", "--port", "0", "--kv-budget", "1KiB"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        done.returncode == 2 and done.stderr.count("\n") == 1 and "--kv-budget 1KiB" in done.stderr
    )
