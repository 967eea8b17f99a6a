"""Write down CuPy's API, names and keywords, for the strict stand-in the tests run minirt on.

The default suite has no GPU and no CuPy, yet minirt's CuPy path must not call a name CuPy lacks, or
pass a keyword CuPy would refuse.  This tool records, from a real CuPy, every public name of the
`cupy` module, of `cupy.ndarray` and of the few `cupy.cuda` calls minirt makes, each with the
parameters it takes; tests/strict_cupy/ checks every call against that record.

CuPy imports without a GPU, so this runs anywhere its wheel installs:

    python -m venv /tmp/cupy-api && . /tmp/cupy-api/bin/activate
    pip install cupy-cuda12x numpy
    python tools/quality/cupy_api.py --out tests/strict_cupy/cupy_api.json

Where a signature cannot be read by `inspect` (CuPy's ufuncs and Cython methods), it is read from
the first line of the docstring, where CuPy writes it (`tanh(x, /, out=None, *, casting=...)`).
A name whose parameters cannot be read either way is recorded with `"parameters": null`: its
keywords are not checked.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import re
import sys
from pathlib import Path
from typing import Any

# The calls minirt's CuPy path makes outside the `cupy` namespace itself.
CUDA_FUNCTIONS = ("get_current_stream",)
CUDA_RUNTIME_FUNCTIONS = ("getDeviceCount",)
STREAM_METHODS = ("synchronize",)
# `cupy.fuse(*args, **kwargs)` says nothing in its docstring; its one keyword is `kernel_name`
# (cupy/_core/fusion.pyx, `wrapper(f, kernel_name=None)`).
FUSE_PARAMETERS = {"positional": ["function"], "keywords": ["kernel_name"], "var_keyword": False}


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Record CuPy's public API (names, parameters) as JSON for the tests' stand-in.",
        epilog="example: python tools/quality/cupy_api.py --out tests/strict_cupy/cupy_api.json",
    )
    parser.add_argument("--out", required=True, help="the JSON file to write")
    return parser.parse_args(argv)


def parameters_of_arguments(arguments: ast.arguments, skip_self: bool) -> dict[str, Any]:
    """An `ast.arguments` as what the stand-in checks: the positional parameters, the keywords
    accepted, and whether **kwargs takes any keyword."""
    positional_only = [a.arg for a in arguments.posonlyargs]
    either = [a.arg for a in arguments.args]
    if skip_self and (positional_only or either):
        if positional_only:
            positional_only = positional_only[1:]
        else:
            either = either[1:]
    keyword_only = [a.arg for a in arguments.kwonlyargs]
    return {
        "positional": positional_only + either,
        "keywords": either + keyword_only,
        "var_positional": arguments.vararg is not None,
        "var_keyword": arguments.kwarg is not None,
    }


def parameters_from_docstring(doc: str | None, skip_self: bool) -> dict[str, Any] | None:
    """The parameters written on a docstring's first line, `name(a, b=1, *, c=None) -> x`."""
    if not doc:
        return None
    first_line = doc.strip().splitlines()[0].replace("\\*", "*")
    opening = first_line.find("(")
    if opening < 0:
        return None
    depth = 0
    closing = -1
    for position in range(opening, len(first_line)):
        if first_line[position] == "(":
            depth += 1
        elif first_line[position] == ")":
            depth -= 1
            if depth == 0:
                closing = position
                break
    if closing < 0:
        return None
    # Cython writes C types before names (`int device_id=-1`, `_ndarray_base a`): keep the names.
    inside = re.sub(
        r"\b[A-Za-z_][\w.]*\s+(?=[A-Za-z_]\w*\s*(=|,|$))", "", first_line[opening + 1 : closing]
    )
    try:
        tree = ast.parse(f"def f({inside}): pass")
    except SyntaxError:
        return None
    function = tree.body[0]
    assert isinstance(function, ast.FunctionDef)
    return parameters_of_arguments(function.args, skip_self)


def parameters_from_signature(obj: Any, skip_self: bool) -> dict[str, Any] | None:
    """The parameters `inspect.signature` reads, in the same form."""
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    positional = []
    keywords = []
    var_positional = False
    var_keyword = False
    for parameter in signature.parameters.values():
        kind = parameter.kind
        if kind is inspect.Parameter.POSITIONAL_ONLY:
            positional.append(parameter.name)
        elif kind is inspect.Parameter.POSITIONAL_OR_KEYWORD:
            positional.append(parameter.name)
            keywords.append(parameter.name)
        elif kind is inspect.Parameter.KEYWORD_ONLY:
            keywords.append(parameter.name)
        elif kind is inspect.Parameter.VAR_POSITIONAL:
            var_positional = True
        else:
            var_keyword = True
    if skip_self and positional and positional[0] == "self":
        positional = positional[1:]
        keywords = [k for k in keywords if k != "self"]
    return {
        "positional": positional,
        "keywords": keywords,
        "var_positional": var_positional,
        "var_keyword": var_keyword,
    }


def parameters_of(obj: Any, skip_self: bool = False) -> dict[str, Any] | None:
    """A callable's parameters: from its signature, else from its docstring, else None."""
    found = parameters_from_signature(obj, skip_self)
    if found is None:
        found = parameters_from_docstring(getattr(obj, "__doc__", None), skip_self)
    return found


def describe_module_name(cupy: Any, name: str) -> dict[str, Any]:
    """One public name of the `cupy` module: its kind, and its parameters when it is called."""
    obj = getattr(cupy, name)
    kind = type(obj).__name__
    if name == "fuse":
        return {"kind": "fuse", "parameters": FUSE_PARAMETERS}
    if kind == "ufunc":
        return {
            "kind": "ufunc",
            "nin": int(obj.nin),
            "nout": int(obj.nout),
            "parameters": parameters_from_docstring(obj.__doc__, skip_self=False),
        }
    if inspect.ismodule(obj) or kind == "_LazyModule":
        return {"kind": "module"}
    if isinstance(obj, type):
        return {"kind": "class"}
    if callable(obj):
        return {"kind": "function", "parameters": parameters_of(obj)}
    return {"kind": "value"}


def describe_ndarray(ndarray: type) -> dict[str, Any]:
    """`cupy.ndarray`'s public methods (with their parameters) and attributes."""
    methods = {}
    attributes = []
    for name in sorted(dir(ndarray)):
        if name.startswith("_"):
            continue
        member = getattr(ndarray, name)
        if callable(member) and type(member).__name__ != "getset_descriptor":
            methods[name] = {"parameters": parameters_of(member, skip_self=True)}
        else:
            attributes.append(name)
    return {"methods": methods, "attributes": attributes}


def describe(cupy: Any, numpy: Any) -> dict[str, Any]:
    """The whole record."""
    names = {
        name: describe_module_name(cupy, name)
        for name in sorted(dir(cupy))
        if not name.startswith("_")
    }
    cuda = cupy.cuda
    return {
        "made_by": "tools/quality/cupy_api.py",
        "cupy_version": cupy.__version__,
        "numpy_version": numpy.__version__,
        "names": names,
        "ndarray": describe_ndarray(cupy.ndarray),
        "cuda": {
            "functions": {
                name: {"parameters": parameters_of(getattr(cuda, name))} for name in CUDA_FUNCTIONS
            },
            "runtime": {
                name: {"parameters": parameters_of(getattr(cuda.runtime, name))}
                for name in CUDA_RUNTIME_FUNCTIONS
            },
            "stream_methods": {
                name: {"parameters": parameters_of(getattr(cuda.Stream, name), skip_self=True)}
                for name in STREAM_METHODS
            },
        },
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    try:
        import cupy
        import numpy
    except ImportError as exc:
        print(
            f"cupy_api.py: CuPy does not import here ({exc}); pip install cupy-cuda12x",
            file=sys.stderr,
        )
        return 1
    record = describe(cupy, numpy)
    out = Path(args.out)
    out.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    unreadable = sorted(
        name
        for name, entry in record["names"].items()
        if "parameters" in entry and entry["parameters"] is None
    )
    print(
        f"cupy_api.py: CuPy {record['cupy_version']}: {len(record['names'])} names, "
        f"{len(record['ndarray']['methods'])} ndarray methods -> {out}"
    )
    if unreadable:
        print(f"cupy_api.py: parameters unreadable, so unchecked: {', '.join(unreadable)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
