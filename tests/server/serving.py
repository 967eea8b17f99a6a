"""A real `minirt serve` for the tests: a subprocess on 127.0.0.1 at a free port, started and stopped
by the test, and the offline reference its answers are held to.

`Server` starts `python -m minirt.serve --port 0 FLAGS`, reads the URL from its one ready line and
stops it with a signal; `offline_alone` is what `LLM.generate` gives one request alone, in this
process, which is what every completion over HTTP must equal token for token.
"""

from __future__ import annotations

import importlib.util
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import ROOT
from conftest import completions

WEB_STACK = (
    "starlette",
    "uvicorn",
    "httptools",
    "pydantic",
    "prometheus_client",
    "openai",
    "httpx",
)
MISSING = [name for name in WEB_STACK if importlib.util.find_spec(name) is None]

# Every test of a server: marked, and skipped cleanly without the serve extra and its clients.
serve_tests = [
    pytest.mark.serve,
    pytest.mark.skipif(
        bool(MISSING),
        reason=f"the serve extra and its test clients are not installed ({', '.join(MISSING)}): "
        'pip install -e ".[serve,test]"',
    ),
]

READY_TIMEOUT_S = 60.0


class Server:
    """`minirt serve` in a subprocess; use as a context manager, or call `stop` for its exit."""

    def __init__(self, *flags: str, env: dict | None = None):
        command = [sys.executable, "-m", "minirt.serve", "--port", "0", *flags]
        self.process = subprocess.Popen(
            command,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.lines: queue.Queue = queue.Queue()
        self.stderr_lines: list[str] = []
        threading.Thread(target=self.read_stdout, daemon=True).start()
        threading.Thread(target=self.read_stderr, daemon=True).start()
        self.url = self.wait_ready()

    def read_stdout(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def read_stderr(self) -> None:
        for line in self.process.stderr:
            self.stderr_lines.append(line)

    def wait_ready(self) -> str:
        try:
            line = self.lines.get(timeout=READY_TIMEOUT_S)
        except queue.Empty:
            self.process.kill()
            raise AssertionError("the server printed no ready line") from None
        if line is None:
            self.process.wait()
            raise AssertionError(f"the server exited: {''.join(self.stderr_lines)}")
        assert line.startswith("minirt serve: http://127.0.0.1:"), line
        return line.split()[2]

    def stop(self, sig=signal.SIGTERM, timeout: float = 60.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def client(self, api_key: str = "none"):
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, timeout=60)

    def metric(self, name: str, **labels) -> float:
        """One sample of /metrics, parsed by prometheus_client's own parser."""
        import httpx
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(f"{self.url}/metrics").text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    return sample.value
        raise AssertionError(f"no sample {name} {labels} in /metrics")

    def wait_for_metric(self, name: str, value: float, timeout: float = 10.0, **labels) -> None:
        deadline = time.monotonic() + timeout
        while self.metric(name, **labels) != value:
            assert time.monotonic() < deadline, (
                f"{name} {labels} stayed {self.metric(name, **labels)}"
            )
            time.sleep(0.05)


def offline_alone(llm, prompt, params) -> list:
    """The offline results (its n samples) of one prompt, alone in its batch, flattened (conftest's
    `completions`, with the top N alternatives when the params ask for N)."""
    return completions(llm.generate([prompt], params), top_n=params.logprobs)
