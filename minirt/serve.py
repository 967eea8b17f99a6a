"""`minirt serve` (or `python -m minirt.serve`): an OpenAI-compatible HTTP server with
continuous batching of live requests.

Owns: the command line, in the steps that `main` calls in order:

    parse_args      flags, checked before anything is opened or loaded
    require_extra   the web stack (`pip install -e ".[serve]"`), or one line saying so
    bind            the port, before the model loads: taken or not allowed is one line, exit 2
    load            the model, its tokenizer and an engine (through `LLM`)
    serve           minirt/server/run.py, until SIGINT or SIGTERM: then the requests in flight
                    finish within --shutdown-timeout (or are aborted), and it exits 0

Must not know: the routes, the request bodies, or how rounds are computed (minirt/server/).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

from .chat_template import CONTENT_FORMATS
from .cli.command import EXIT_OK, add_version_flag, parse_command_line, run_command
from .cli.serving_flags import add_serving_flags, kv_budget_arguments, llm_from_flags
from .errors import MinirtError, require_at_least_one
from .llm import LLM
from .loading.checkpoint import resolve_model_folder, shipped_model_folder

DEFAULT_PORT = 8000
DEFAULT_MAX_QUEUE = 256
DEFAULT_SHUTDOWN_TIMEOUT_S = 30.0
DEFAULT_MAX_BODY_BYTES = 2 * 2**20
# minirt/server/connections.py's, here so that parsing the flags imports no web stack.
DEFAULT_CONNECTION_TIMEOUT_S = 30.0
# Static groups online: how long the next group waits for members.  20 ms lets a burst of clients
# that arrive together (each a few ms apart on loopback) share a group, yet it is small beside
# what a round costs (a 124M model's decode round of 8 rows takes about 93 ms here, docs/serving.md;
# a prefill more), so a lone request waits for company a fraction of its time to first token.
DEFAULT_BATCH_WINDOW_MS = 20.0
# The longest --round-delay and --batch-window.
MAX_PAUSE_MS = 60_000.0
# What the server needs beyond minirt's own dependencies.
WEB_STACK = ("starlette", "uvicorn", "httptools", "pydantic", "prometheus_client")
# What --replicas needs beyond that (the ray extra).
RAY_SERVE = ("ray", "ray.serve")
# --routing's choices (minirt/distributed/serve_replicas.py ROUTINGS, here so that parsing the
# flags imports no Ray).
ROUTINGS = ("power-of-two", "prefix")

EPILOG = r"""
examples:
  minirt serve                                  # the model shipped in weights/, on 127.0.0.1:8000
  MINIRT_API_KEY=sk-local minirt serve --model gpt2 --port 8080
  minirt serve --policy static --batch-size 4   # static groups, to see what they cost online
  minirt serve --policy static --batch-size 3 --round-delay 300
                                                # then open http://127.0.0.1:8000/ and watch

  minirt serve --replicas 2                     # two engines on Ray Serve behind one server
  minirt serve --replicas 4 --prefix-cache --routing prefix --ray auto
                                                # on a running Ray cluster (ray start --head),
                                                # each prefix to the replica that holds it

  curl -s http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \
       -d '{"prompt": "ROMEO:", "max_tokens": 20, "temperature": 0}'

endpoints: POST /v1/completions (stream: true for server-sent events), GET /v1/models,
GET /health, GET /metrics (Prometheus), POST /tokenize, POST /detokenize; the round-grid page
at GET / (its feeds: GET /rounds/events, GET /rounds/recent, POST /rounds/exercise).
A body over --max-body-bytes is refused with 413; with --max-queue requests already waiting,
a completion is refused with 503 (retry later).  docs/serving.md ("The API") has every flag,
field and default, endpoint, error and metric.
"""


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Serve a checkpoint (GPT-2 or the Llama family) over HTTP with OpenAI's "
        "completions and chat completions APIs, batching the requests of many clients at once.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--model",
        help="a model folder or a hub id in the local Hugging Face cache "
        "(default: the model shipped in weights/)",
    )
    p.add_argument(
        "--served-model-name",
        metavar="NAME",
        help="the model's name in the API "
        "(default: --model as given, or the shipped model's folder name)",
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address to listen on (default "
        "127.0.0.1: this machine only; 0.0.0.0 for every interface)",
    )
    p.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"the port (default {DEFAULT_PORT}; 0 picks a free one)",
    )
    add_batching_flags(p)
    add_replica_flags(p)
    add_chat_flags(p)
    add_limit_flags(p)
    add_version_flag(p)
    return p


def add_replica_flags(p) -> None:
    """Serving past one process: replicas of the engine on Ray Serve (docs/serving.md)."""
    p.add_argument(
        "--replicas",
        type=int,
        metavar="N",
        help="serve with N replicas of the engine on Ray Serve, each its own process with the "
        "flags above, behind this one server (default: one engine, in this process; needs the "
        'ray extra: pip install -e ".[serve,ray]")',
    )
    p.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="with --replicas: 'local' (default) starts Ray on this machine; 'auto', HOST:PORT or "
        "ray://HOST:PORT joins a running cluster (ray start --head)",
    )
    p.add_argument(
        "--routing",
        choices=ROUTINGS,
        help="with --replicas: which replica takes a request.  power-of-two (default): Ray "
        "Serve's own, the less busy of two drawn at random; prefix: the replica that served the "
        "prompt's prefix last, unless it has more than --batch-size requests beyond the least "
        "busy (needs --prefix-cache, and a --ray other than ray://)",
    )


def add_chat_flags(p) -> None:
    """How a chat request's conversation reaches the model's template."""
    p.add_argument(
        "--chat-template-content-format",
        choices=CONTENT_FORMATS,
        default="auto",
        help="how a message's content reaches the chat template: string (its text parts joined "
        'with newlines), openai (a list of {"type": "text", "text": ...} parts, a string one '
        "part), or auto (default): openai where the template loops over a message's content or "
        "indexes it, else string",
    )


def add_batching_flags(p) -> None:
    """How requests are batched and computed: generate's flags, continuous by default."""
    add_serving_flags(p, default_policy="continuous")
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="the seed of requests that set none (default 0); a request's own "
        "seed makes it reproducible",
    )
    p.add_argument(
        "--batch-window",
        type=float,
        metavar="MS",
        help="static groups: when no group runs, wait up to MS milliseconds from the first "
        "request's arrival for the group to fill to --batch-size; a full group starts at once "
        f"(default {DEFAULT_BATCH_WINDOW_MS:g}; 0 starts a group with whoever waits)",
    )
    p.add_argument(
        "--round-delay",
        type=float,
        default=0.0,
        metavar="MS",
        help="a teaching knob: pause MS milliseconds after every round, so that a person can "
        "watch the round grid at http://HOST:PORT/ fill (default 0; it slows every request)",
    )


def add_limit_flags(p) -> None:
    """Who may call, and how much the server takes."""
    p.add_argument(
        "--api-key",
        metavar="KEY",
        default=os.environ.get("MINIRT_API_KEY"),
        help="require 'Authorization: Bearer KEY' on every /v1 path (default: "
        "$MINIRT_API_KEY, else none); /health stays open.  Prefer the variable: a flag's value "
        "shows in ps to every user of the machine",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        default=DEFAULT_MAX_QUEUE,
        metavar="N",
        help="requests that may wait for a row; past it a completion gets 503 "
        f"(default {DEFAULT_MAX_QUEUE})",
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES,
        metavar="N",
        help=f"the largest request body; past it, 413 (default {DEFAULT_MAX_BODY_BYTES}: 2 MiB)",
    )
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=DEFAULT_SHUTDOWN_TIMEOUT_S,
        metavar="SECONDS",
        help="on SIGINT or SIGTERM, how long the requests in flight may take to "
        f"finish before they are aborted (default {DEFAULT_SHUTDOWN_TIMEOUT_S:g})",
    )
    # Hidden, for tests (docs/serving.md's Limits): the defaults are what a server needs.
    p.add_argument(
        "--max-connections",
        type=int,
        metavar="N",
        help=argparse.SUPPRESS,  # default: --max-queue + --batch-size + the feed's watchers + 64
    )
    p.add_argument(
        "--connection-timeout",
        type=float,
        default=DEFAULT_CONNECTION_TIMEOUT_S,
        metavar="SECONDS",
        help=argparse.SUPPRESS,  # a head's time to arrive, a body's longest pause
    )


def parse_args(argv: list[str] | None, prog: str):
    """The flags, with every check that needs no model."""
    args = parse_command_line(build_parser(prog), argv)
    require_at_least_one(args.batch_size, "--batch-size")
    require_at_least_one(args.max_round_tokens, "--max-round-tokens")
    require_at_least_one(args.max_queue, "--max-queue")
    require_at_least_one(args.max_body_bytes, "--max-body-bytes")
    if not 0 <= args.port <= 65535:
        raise MinirtError(f"--port must be from 0 to 65535, got {args.port}")
    if not 0 <= args.shutdown_timeout < 86400:
        raise MinirtError(
            f"--shutdown-timeout must be from 0 to 86400 seconds, got {args.shutdown_timeout:g}"
        )
    if args.max_connections is not None:
        require_at_least_one(args.max_connections, "--max-connections")
    if not 0 < args.connection_timeout <= 86400:
        raise MinirtError(
            f"--connection-timeout must be over 0 and at most 86400 seconds, "
            f"got {args.connection_timeout:g}"
        )
    if args.seed < 0:
        raise MinirtError(f"--seed must be at least 0, got {args.seed}")
    if args.api_key == "":
        raise MinirtError("--api-key is empty: give a key, or leave the flag out for none")
    for flag, value in (("--model", args.model), ("--served-model-name", args.served_model_name)):
        if value is not None and not value.strip():
            raise MinirtError(f"{flag} is empty; give a value, or leave the flag out")
    args.kv_budget_mib, args.kv_budget_tokens = kv_budget_arguments(args.kv_budget)
    check_replica_flags(args)
    if args.batch_window is not None and args.policy != "static":
        raise MinirtError(
            "--batch-window applies to static groups only: add --policy static, or leave it "
            "out (continuous batching admits each request in the next round)"
        )
    if args.batch_window is None:
        args.batch_window = DEFAULT_BATCH_WINDOW_MS
    for flag, value in (("--batch-window", args.batch_window), ("--round-delay", args.round_delay)):
        # NaN fails both comparisons, so it is refused too.
        if not 0 <= value <= MAX_PAUSE_MS:
            raise MinirtError(f"{flag} must be from 0 to {MAX_PAUSE_MS:g} ms, got {value:g}")
    return args


def check_replica_flags(args) -> None:
    """--ray and --routing go with --replicas; prefix routing needs the prefix cache."""
    if args.replicas is None:
        for flag, value in (("--ray", args.ray), ("--routing", args.routing)):
            if value is not None:
                raise MinirtError(
                    f"{flag} applies to replicas only: add --replicas N, or leave it out"
                )
        return
    require_at_least_one(args.replicas, "--replicas")
    args.ray = args.ray or "local"
    args.routing = args.routing or "power-of-two"
    if not args.ray.strip():
        raise MinirtError("--ray is empty: give 'local', 'auto' or HOST:PORT, or leave it out")
    if args.routing == "prefix" and not args.prefix_cache:
        raise MinirtError(
            "--routing prefix sends a prompt to the replica whose prefix cache holds its "
            "prefix: add --prefix-cache"
        )
    if args.routing == "prefix" and args.ray.startswith("ray://"):
        # Through a Ray Client, Ray Serve routes without telling its router what it routed, so
        # the prefix router would learn nothing and pick by chance.
        raise MinirtError(
            f"--routing prefix cannot route through a Ray Client address ({args.ray}): run "
            "minirt serve on a node of the cluster with --ray auto (or HOST:PORT)"
        )


def require_extra(extras: str = "serve") -> None:
    """The web stack imports, or one line saying how to install it (with `extras`)."""
    for name in WEB_STACK:
        try:
            importlib.import_module(name)
        except ImportError:
            raise MinirtError(
                f"minirt serve needs the serve extra, and {name} is not installed: "
                f'from a clone of minirt, pip install -e ".[{extras}]"'
            ) from None


def require_ray_serve() -> None:
    """Ray Serve imports, or one line saying how to install it."""
    for name in RAY_SERVE:
        try:
            importlib.import_module(name)
        except ImportError:
            raise MinirtError(
                f"minirt serve --replicas needs Ray Serve, and {name} is not installed: from a "
                'clone of minirt, pip install -e ".[serve,ray]"'
            ) from None


def load(args) -> tuple[LLM, str]:
    """The model, and its name in the API."""
    if args.model is None:
        folder = resolve_model_folder(shipped_model_folder())
    else:
        folder = resolve_model_folder(args.model)
    llm = llm_from_flags(args, folder)
    if llm.chat_template is not None:
        content_format = args.chat_template_content_format
        llm.chat_template = llm.chat_template.with_content_format(content_format)
    if llm.engine.kv_budget_positions < 1:
        raise MinirtError(
            f"--kv-budget {args.kv_budget} holds no token's keys and values for this model "
            f"({llm.engine.kv_bytes_per_position} bytes each); give more"
        )
    if args.served_model_name is not None:
        name = args.served_model_name
    elif args.model is not None:
        name = args.model
    else:
        name = Path(folder).name
    return llm, name


def main(argv: list[str] | None = None, prog: str = "python -m minirt.serve") -> int:
    args = parse_args(argv, prog)
    if args.replicas is None:
        require_extra()
    else:
        # Ray first: its line names both extras, so one install gives everything --replicas needs.
        require_ray_serve()
        require_extra("serve,ray")
    # Imported here: only with the serve extra installed.
    from .server.run import bind  # noqa: PLC0415 (see above)

    sock = bind(args.host, args.port)
    try:
        llm, name = load(args)
        replicas = start_replicas(args, llm, prog)
        try:
            serve_model(args, prog, sock, llm, name, replicas)
        finally:
            if replicas is not None:
                replicas.shut_down()
    finally:
        sock.close()
    return EXIT_OK


def start_replicas(args, llm: LLM, prog: str):
    """With --replicas: the replicas on Ray Serve, each reporting (None without it).  This
    process keeps the model too: its tokenizer, config and chat template make each request."""
    if args.replicas is None:
        return None
    # Imported here: only with the ray extra installed.
    from .distributed import serve_replicas  # noqa: PLC0415 (see above)

    def progress(line: str) -> None:
        print(f"{prog}: {line}", file=sys.stderr, flush=True)

    first_snapshot = llm.engine_client(args.max_queue).snapshot()
    return serve_replicas.start_replicas(args, llm.model.folder, first_snapshot, progress)


def serve_model(args, prog: str, sock, llm: LLM, name: str, replicas) -> None:
    """The server on `sock`, until a signal stops it: the engine in this process, or
    `replicas`' engines."""
    from .server.app import ServerSettings  # noqa: PLC0415 (see main)
    from .server.connections import connections_for  # noqa: PLC0415 (see main)
    from .server.origin import is_loopback_address  # noqa: PLC0415 (see main)
    from .server.round_feed import MAX_WATCHERS  # noqa: PLC0415 (see main)
    from .server.run import serve_forever  # noqa: PLC0415 (see main)

    settings = ServerSettings(
        model_name=name,
        model_path=str(llm.model.folder),
        api_key=args.api_key,
        max_body_bytes=args.max_body_bytes,
        loopback_only=is_loopback_address(args.host),
    )
    if not settings.loopback_only and settings.api_key is None:
        print(
            f"{prog}: warning: listening on {args.host} with no API key: whoever reaches "
            "this address may run completions (set --api-key, or MINIRT_API_KEY)",
            file=sys.stderr,
        )
    engines = 1 if replicas is None else args.replicas
    serve_forever(
        llm,
        sock,
        settings,
        max_queue=args.max_queue,
        shutdown_timeout_s=args.shutdown_timeout,
        describe=describe(args, name),
        round_delay_s=args.round_delay / 1000,
        batch_window_s=args.batch_window / 1000,
        max_connections=args.max_connections
        or connections_for(engines * args.max_queue, engines * args.batch_size, MAX_WATCHERS),
        connection_timeout_s=args.connection_timeout,
        make_client=None if replicas is None else replicas.make_client,
    )


def describe(args, name: str) -> str:
    """The ready line's account of what is served."""
    text = f"model {name}, {args.policy} batching of up to {args.batch_size} rows"
    if args.replicas is not None:
        text += f" in each of {args.replicas} replicas on Ray Serve ({args.routing} routing)"
    if args.round_delay > 0:
        text += f", {args.round_delay:g} ms between rounds"
    return text


if __name__ == "__main__":
    raise SystemExit(run_command(main, prog="python -m minirt.serve"))
