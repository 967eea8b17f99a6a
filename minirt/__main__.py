"""`minirt` (or `python -m minirt`): one command for the five tools, `minirt SUBCOMMAND [options]`.

Owns: the list of subcommands, dispatching to the module that owns each, and `minirt --version`.
Each subcommand is exactly `python -m minirt.SUBCOMMAND`, which keeps working on its own.

Must not know: what any subcommand does (its module's `main` and `--help` say).
"""

from __future__ import annotations

import importlib
import signal
import sys

try:
    from . import __version__
    from .cli.command import EXIT_INTERRUPTED, EXIT_USAGE, print_help_text, run_command
except KeyboardInterrupt:
    # Ctrl-C while these first imports run (argparse and the rest, pure Python): the one line
    # and the status every command gives (cli/command.py's EXIT_INTERRUPTED, not yet imported).
    print("minirt: interrupted", file=sys.stderr)
    sys.exit(130)

SUBCOMMANDS = {
    "generate": "serve a file of prompts (or standard input) in static groups "
    "or with continuous batching",
    "evaluate": "sliding-window loss and perplexity of a text",
    "rounds": "static groups beside continuous batching, counted in rounds (no model needed)",
    "inspect": "describe a checkpoint and show its next-token guesses for a prompt",
    "serve": "an OpenAI-compatible HTTP server, batching live requests (the serve extra)",
}
USAGE = (
    "usage: minirt {generate,evaluate,rounds,inspect,serve} [options]"
    "   (minirt SUBCOMMAND --help for each)\n\n"
    + "\n".join(f"  {name:9s} {what}" for name, what in SUBCOMMANDS.items())
    + """

examples:
  minirt generate --prompts examples/prompts.txt   # the model shipped in weights/
  minirt generate --prompt "To be, or not to be" --max-tokens 40   # streams on a terminal
  minirt generate --model gpt2 --prompts examples/prompts.jsonl --output out.jsonl
  minirt rounds --lengths 2,5,8,4 --batch-size 3
  minirt serve --port 8000                         # then POST /v1/completions
  minirt --version"""
)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] in (["-h"], ["--help"], ["--version"]):
        if args[0] == "--version":
            text = f"minirt {__version__}"
        else:
            text = USAGE
        # `| head` gets what it reads, and exit status 0: not a traceback, nor an error.
        return run_command(lambda _: print_help_text(text), prog="minirt")
    if not args or args[0] not in SUBCOMMANDS:
        if not args:
            what = "a subcommand is missing"
        else:
            what = f"unknown subcommand {args[0]!r}"
        print(
            f"minirt: error: {what}; choose one of {', '.join(SUBCOMMANDS)} (minirt --help)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    # Its --help names it as it was run: `minirt X`.
    prog = f"minirt {args[0]}"
    module = import_interruptibly(f"minirt.{args[0]}")
    if module is None:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    # A report (rounds, inspect) cut short by its reader ends quietly.
    quiet = getattr(module, "REPORT", False)
    return run_command(
        lambda argv: module.main(argv, prog=prog), args[1:], prog=prog, quiet_when_cut=quiet
    )


def import_interruptibly(name: str):
    """The module, or None if Ctrl-C came while it was imported.  This is where the time before
    a command starts goes (NumPy and the rest; `import minirt` itself loads nothing heavy), so
    a Ctrl-C here must be the command's one line, as later.  The signal is noted, because its
    KeyboardInterrupt does not always reach here: inside an extension module's import it may
    come out as that import's ImportError, and inside a callback Python cannot raise from (the
    import system's weak references) Python reports it as "Exception ignored", with a
    traceback, and goes on.  Such a report is kept quiet, and the import counts as
    interrupted."""
    signals: list[int] = []

    def note(signum, frame):
        signals.append(signum)
        raise KeyboardInterrupt

    previous_hook = sys.unraisablehook

    def quiet_interrupts(unraisable) -> None:
        if not isinstance(unraisable.exc_value, KeyboardInterrupt):
            previous_hook(unraisable)

    previous = signal.signal(signal.SIGINT, note)
    sys.unraisablehook = quiet_interrupts
    try:
        module = importlib.import_module(name)
    except KeyboardInterrupt:
        return None
    except ImportError:
        if signals:
            return None
        raise
    finally:
        signal.signal(signal.SIGINT, previous)
        sys.unraisablehook = previous_hook
    if signals:
        return None
    return module


def entry() -> None:
    """The `minirt` console script."""
    sys.exit(main())


if __name__ == "__main__":
    entry()
