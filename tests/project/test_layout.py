"""The architecture, held by tests: what each folder of minirt/ may import, and the limits that keep it readable.

The folders, from the bottom up (each may import the ones before it, never the ones after):

    errors.py      the exceptions every part raises                   imports no other part of minirt
    model/         backend, config, batch metadata, KV cache, layers  errors
    loading/       checkpoint, safetensors header, tokenizer, JSON    errors, model
    engine/        params, sampler, request, scheduler, the loop      errors, model (token ids in, never text)
    request_maker.py  prompts and parameters into requests            errors, model, loading, engine
    chat_template.py  a model's chat template (jinja2 only here)      errors, loading (and model, below it)
    llm.py         the Python API                                     errors, model, loading, engine, request_maker,
                                                                      chat_template
    cli/           what the commands share                            all of the above
    distributed/   Ray Data and Ray Serve (ray only here)             all of the above and cli
    server/        `minirt serve` (its web stack only there)          all of the above but distributed
    the commands   generate, evaluate, rounds, inspect, serve, __main__  anything (server/: serve alone)

Third-party imports: numpy, safetensors and tokenizers anywhere; cupy only in model/backend.py (and the
tests); ray only in distributed/ (never its command-side modules serve_on_ray.py, prompt_chunks.py); the web
stack only in server/; jinja2 only in chat_template.py.
Functions are at most 50 lines and lines at most 100 characters; `ruff format --check` holds the rest of the layout (tests/project/test_lint.py).
"""

import ast
import sys
from pathlib import Path

import pytest

from conftest import ROOT

PACKAGE = ROOT / "minirt"
MODULES = sorted(PACKAGE.rglob("*.py"))
COMMANDS = {"generate", "evaluate", "rounds", "inspect", "serve", "__main__"}

# The Python API and every part below it.
THE_API = {"errors", "model", "loading", "engine", "request_maker", "chat_template", "llm"}
# What each part of minirt may import from minirt (by its top-level part: a folder or a module).
MAY_IMPORT = {
    "errors": set(),
    "model": {"errors"},
    "loading": {"errors", "model"},
    # The engine takes token ids and a detokenizer object: it never reads a tokenizer's files.
    "engine": {"errors", "model"},
    "request_maker": {"errors", "model", "loading", "engine"},
    # A model's chat template, rendered: it knows files and text, never requests or the engine.
    "chat_template": {"errors", "model", "loading"},
    "llm": {"errors", "model", "loading", "engine", "request_maker", "chat_template"},
    # __init__: the version.
    "cli": THE_API | {"__init__"},
    "distributed": THE_API | {"cli"},
    "server": THE_API | {"cli"},
    "__init__": THE_API,
}
EVERYWHERE = {"numpy", "safetensors", "tokenizers"}
ONLY_IN = {  # a third-party package, and the only files (relative to minirt/) or folders that may import it
    "cupy": ("model/backend.py",),
    "cupyx": ("model/backend.py",),
    # Ray Data (ray_data.py), Ray Serve (the replicas, their client, the prefix router, the
    # command's side), and starting Ray for both (ray_cluster.py).
    "ray": (
        "distributed/ray_data.py",
        "distributed/ray_cluster.py",
        "distributed/engine_replica.py",
        "distributed/replica_client.py",
        "distributed/prefix_router.py",
        "distributed/serve_replicas.py",
    ),
    "fastapi": ("server/",),
    "starlette": ("server/",),
    "uvicorn": ("server/",),
    "pydantic": ("server/",),
    "prometheus_client": ("server/",),
    "jinja2": ("chat_template.py",),
}


def relative(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def part_of(path: Path) -> str:
    """The top-level part a module belongs to: its folder, or its own name for a top-level module."""
    first = path.relative_to(PACKAGE).parts[0]
    return first.removesuffix(".py")


PARTS = {p.name.removesuffix(".py") for p in PACKAGE.iterdir() if p.suffix == ".py" or p.is_dir()}


def parts_named(target: list[str], names: list[str]) -> set[str]:
    """The parts that `from <target> import <names>` reaches: `target` inside minirt, as a list
    of its parts ([] for the package itself, whose names may be folders or modules)."""
    if target:
        return {target[0]}
    return {name if name in PARTS else "__init__" for name in names}


def minirt_imports(path: Path) -> set[str]:
    """The parts of minirt (folders or top-level modules) that a module imports: relative or
    absolute, at the top or inside a function, and by name through importlib; a bare
    `import minirt` counts as "minirt", which no part may use (it reaches every part)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package_parts = path.relative_to(PACKAGE).parent.parts  # () for a top-level module
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            # Resolve the relative import against the module's own package.
            base = list(package_parts[: len(package_parts) - (node.level - 1)])
            target = base + (node.module.split(".") if node.module else [])
            found |= parts_named(target, [alias.name for alias in node.names])
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.split(".")[0] == "minirt"
        ):
            target = node.module.split(".")[1:]
            found |= parts_named(target, [alias.name for alias in node.names])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "minirt":
                    found.add("minirt")
                elif alias.name.startswith("minirt."):
                    found.add(alias.name.split(".")[1])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            # importlib.import_module("minirt.cli.x") and the like.
            if node.value.startswith("minirt.") and node.value.replace(".", "").isidentifier():
                found.add(node.value.split(".")[1])
    return found


def third_party_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"minirt"}


def functions(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


@pytest.mark.parametrize("path", MODULES, ids=relative)
def test_each_part_imports_only_the_parts_below_it(path):
    part = part_of(path)
    if part in COMMANDS:
        return  # a command may use anything
    allowed = MAY_IMPORT[part] | {part}
    forbidden = minirt_imports(path) - allowed
    assert not forbidden, (
        f"{relative(path)} ({part}/) imports {sorted(forbidden)}; it may import {sorted(allowed)}"
    )


def test_the_engine_may_not_import_loading_cli_server_or_distributed():
    """Issue #37's contract, which the per-module test above holds for every engine module: the
    engine takes token ids and a detokenizer object, and knows no file, flag or transport."""
    assert not MAY_IMPORT["engine"] & {"loading", "cli", "server", "distributed", "llm"}
    engine_files = [path for path in MODULES if part_of(path) == "engine"]
    assert len(engine_files) > 10
    for path in engine_files:
        assert not minirt_imports(path) & {"loading", "cli", "server", "distributed", "llm"}


def imported_modules(path: Path) -> set[str]:
    """Every minirt module a file imports, as dotted names relative to minirt ("model.gpt2")."""
    found = set()
    package = relative(path).split("/")[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            if node.level == 0 and node.module.startswith("minirt."):
                found.add(node.module.removeprefix("minirt."))
            elif node.level > 0:
                base = package[: len(package) - node.level + 1]
                found.add(".".join([*base, node.module]))
    return found


def test_the_engine_knows_a_model_only_by_its_interface():
    """No engine module imports a family's module (model/gpt2.py) or the registry: the runner is
    typed on model/interface.py's Model, so a second family needs no edit in engine/."""
    engine_files = [path for path in MODULES if part_of(path) == "engine"]
    for path in engine_files:
        assert not imported_modules(path) & {"model.gpt2", "model.registry"}, relative(path)
    runner = PACKAGE / "engine" / "runner.py"
    assert "model.interface" in imported_modules(runner)


def test_imported_modules_are_read_in_relative_and_absolute_forms():
    path = PACKAGE / "engine" / "runner.py"
    assert {"model.batch", "engine.request"} <= imported_modules(path)


@pytest.mark.parametrize("path", MODULES, ids=relative)
def test_optional_packages_stay_in_their_own_place(path):
    where = relative(path)
    for name in third_party_imports(path):
        if name in EVERYWHERE:
            continue
        assert name in ONLY_IN, f"{where} imports {name}, which minirt does not depend on"
        homes = ONLY_IN[name]
        assert any(
            where == home or (home.endswith("/") and where.startswith(home)) for home in homes
        ), f"{where} imports {name}, which only {', '.join(homes)} may import"


def test_every_folder_in_the_contract_exists_or_is_still_to_come():
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders - set(MAY_IMPORT) == set(), (
        f"a folder without a contract: {folders - set(MAY_IMPORT)}"
    )
    assert {"model", "loading", "engine", "cli", "distributed", "server"} <= folders


@pytest.mark.parametrize("path", MODULES, ids=relative)
def test_only_the_serve_command_reaches_the_server(path):
    """minirt/server/ (the web stack's folder) is imported by `minirt serve` alone, and only inside its main, after
    it has checked that the serve extra is installed: every other command, and `minirt serve --help`, works
    without it."""
    if part_of(path) == "server":
        return
    reaches = "server" in minirt_imports(path)
    if relative(path) != "serve.py":
        assert not reaches, f"{relative(path)} imports minirt/server/"
        return
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top_level = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert not any(
        node.module and "server" in node.module
        for node in top_level
        if isinstance(node, ast.ImportFrom)
    )


@pytest.mark.parametrize("path", MODULES, ids=relative)
def test_functions_and_lines_stay_readable(path):
    lines = path.read_text(encoding="utf-8").splitlines()
    long_lines = [i + 1 for i, line in enumerate(lines) if len(line) > 100]
    assert not long_lines, f"{relative(path)}: lines over 100 characters: {long_lines}"
    for fn in functions(ast.parse("\n".join(lines))):
        length = fn.end_lineno - fn.lineno + 1
        assert length <= 50, f"{relative(path)}: {fn.name} (line {fn.lineno}) is {length} lines"


def packed_assignments(tree: ast.AST) -> list[int]:
    """Lines of `a, b = x, y`: two values assigned in one statement to save a line."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple):
            if any(isinstance(target, ast.Tuple) for target in node.targets):
                lines.append(node.lineno)
    return lines


@pytest.mark.parametrize("path", MODULES, ids=relative)
def test_no_packed_assignments(path):
    found = packed_assignments(ast.parse(path.read_text(encoding="utf-8")))
    assert not found, f"{relative(path)}: packed assignments (a, b = x, y) on lines {found}"


@pytest.mark.parametrize("path", [p for p in MODULES if p.name != "__init__.py"], ids=relative)
def test_every_module_says_what_it_owns_and_must_not_know(path):
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    assert "Owns" in doc and "Must not know" in doc, relative(path)


PROBES = {
    "from ..engine.request import Request\nfrom .. import errors\n": {"engine", "errors"},
    "from minirt import engine\n": {"engine"},
    "from .. import __version__\n": {"__init__"},
    "import minirt\n": {"minirt"},
    "def late():\n    import minirt.cli.command\n": {"cli"},
    "import importlib\nimportlib.import_module('minirt.distributed.ray_data')\n": {"distributed"},
    "from minirt.engine.engine import Engine\n": {"engine"},
}


@pytest.mark.parametrize("source", PROBES, ids=range(len(PROBES)))
def test_a_contract_breach_is_seen(source):
    """The contract's reader itself: a model module that imports a part above it, in any of
    these spellings, is caught."""
    probe = PACKAGE / "model" / "_probe_for_test.py"
    try:
        probe.write_text(source, encoding="utf-8")
        assert minirt_imports(probe) == PROBES[source]
    finally:
        probe.unlink()


def test_a_packed_assignment_is_seen():
    assert packed_assignments(ast.parse("a, b = 1, 2\nc = d = 3\n")) == [1]


@pytest.mark.parametrize("name", ["generate.py", "evaluate.py", "inspect.py"])
def test_the_command_lines_use_the_public_api(name):
    """They go through LLM / load_model and callbacks: none reaches into the engine, a scheduler or a KV cache."""
    tree = ast.parse((PACKAGE / name).read_text(encoding="utf-8"))
    attributes = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    imports = [node for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    imported = {alias.name for node in imports for alias in node.names}
    modules = {node.module for node in imports}
    assert "engine" not in attributes, f"{name} reaches into llm.engine"
    assert not {"engine.engine", "model.kv_cache"} & modules, (
        f"{name} imports the engine loop or the KV cache"
    )
    forbidden = {
        "Engine",
        "KVCache",
        "StaticScheduler",
        "ContinuousScheduler",
        "SCHEDULERS",
        "add_token",
        "fail_request",
    }
    assert not imported & forbidden, f"{name} imports {imported & forbidden}"


# Within engine/: the scheduler owns the KV owner and asks it; neither knows the engine's loop.
ENGINE_MODULE_MAY_IMPORT = {
    "scheduler": {"kv_manager", "request"},
    "kv_manager": {"prefix_cache", "request"},
}


def engine_modules_imported(tree: ast.AST) -> set[str]:
    """The modules of minirt/engine/ that an engine module imports (relative or absolute)."""
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found |= {alias.name for alias in node.names}
        elif node.module and node.module.startswith("minirt.engine."):
            found.add(node.module.split(".")[2])
    return found


@pytest.mark.parametrize("name", sorted(ENGINE_MODULE_MAY_IMPORT))
def test_the_scheduler_and_its_kv_owner_do_not_import_the_engine(name):
    tree = ast.parse((PACKAGE / "engine" / f"{name}.py").read_text(encoding="utf-8"))
    imported = engine_modules_imported(tree)
    assert imported <= ENGINE_MODULE_MAY_IMPORT[name], (
        f"engine/{name}.py imports {sorted(imported - ENGINE_MODULE_MAY_IMPORT[name])}"
    )


def test_engine_module_imports_are_read_in_every_form():
    source = (
        "from .engine import Engine\nfrom . import sampler\n"
        "from minirt.engine.stats import RunStats\nfrom ..model import batch\n"
    )
    assert engine_modules_imported(ast.parse(source)) == {"engine", "sampler", "stats"}


# The server talks to the engine through its client alone: the client interface, the request and
# parameter types (Refusal, its kinds, among the request's), the result types and the round feed's
# record.  Never the Engine, its scheduler, or `llm.engine`.
SERVER_MAY_IMPORT_FROM_ENGINE = {"client", "request", "params", "output", "round_record"}
SERVER_MODULES = sorted((PACKAGE / "server").rglob("*.py"))


def engine_modules_reached(tree: ast.AST) -> set[str]:
    """The modules of minirt/engine/ that a module of minirt/server/ imports, in any spelling
    (the engine package itself, imported whole, counts as "__init__")."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 2:
                module = f"minirt.{node.module}" if node.module else "minirt"
            elif node.level == 0 and node.module:
                module = node.module
            else:
                continue
            if module == "minirt":
                found |= {"__init__" for alias in node.names if alias.name == "engine"}
            elif module == "minirt.engine":
                found |= {alias.name for alias in node.names}
            elif module.startswith("minirt.engine."):
                found.add(module.split(".")[2])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[:2] == ["minirt", "engine"]:
                    found.add(parts[2] if len(parts) > 2 else "__init__")
    return found


@pytest.mark.parametrize("path", SERVER_MODULES, ids=relative)
def test_the_server_reaches_the_engine_only_through_its_client(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    reached = engine_modules_reached(tree)
    assert reached <= SERVER_MAY_IMPORT_FROM_ENGINE, (
        f"{relative(path)} imports engine/{sorted(reached - SERVER_MAY_IMPORT_FROM_ENGINE)}"
    )
    attributes = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    assert "engine" not in attributes, f"{relative(path)} reaches into an engine (llm.engine)"


def test_the_servers_engine_imports_are_read_in_every_form():
    source = (
        "from ..engine.engine import Engine\nfrom ..engine import scheduler\n"
        "from minirt.engine.client import EngineClient\nimport minirt.engine.kv_manager\n"
        "from .. import engine\nfrom .handover import Completion\n"
    )
    reached = engine_modules_reached(ast.parse(source))
    assert reached == {"engine", "scheduler", "client", "kv_manager", "__init__"}
