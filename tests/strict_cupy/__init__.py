"""A strict stand-in for CuPy: an array module that computes with NumPy but keeps CuPy's rules, and
counts what a GPU would pay for.  For tests only; minirt never imports it.

minirt's CuPy path has to be right before any GPU runs it.  Pass this module where CuPy would go,
`Backend("cupy", StrictCuPy())`, and minirt's own code runs on it unchanged.  The numbers are
NumPy's, computed in the same order, so every output must equal the NumPy backend's exactly; what
differs is what the stand-in refuses, reports and counts.

What CuPy refuses, it refuses too (the same exception types; each is also a `Finding`):
  * implicit conversion to NumPy: `numpy.asarray(device_array)` (`__array__` raises TypeError);
  * a NumPy array as an operand of an operator, a ufunc or a function (CuPy: "Unsupported type");
  * a name CuPy lacks (AttributeError), and a keyword or too many positional arguments (TypeError),
    checked against `cupy_api.json`, the record of a real CuPy's API that
    tools/quality/cupy_api.py writes.

What CuPy does silently and NumPy does not, it reports as a `Finding` (and does what CuPy does):
  * an integer index outside its axis: CuPy wraps it around (NumPy raises);
  * a scatter (`a[index] = v`) that names one element twice: undefined on CuPy;
  * inside `fuse`, an operation that cannot be fused (a reduction, an index, a matmul, a sync);
  * a device sync inside a region that must have none (`no_syncs`, such as `GPT2.forward`).

What a GPU library computes in an order it picks by shape, it logs (`logging_shapes()` collects a
`ShapedCall` each, with the operands' shapes and the place in minirt): a matmul (cuBLAS chooses its
algorithm, tiles and split of the sum by (M, N, K)) and a reduction that adds (sum, mean, ... :
CuPy's reduction kernels lay their threads out by the whole array's shape).  Exact batch
invariance needs every such call's shape to be fixed by the row it serves, or probed.

What it counts, in `Counts` (`counting()` collects them over a stretch of code):
  * operations: kernels and library calls, as CuPy launches them: an elementwise operation or a
    reduction is one, a view (slicing, reshape, transpose) none, a fused function one, a batched
    matmul one plus one copy for each operand CuPy must first make contiguous or fp32, a gather or
    scatter with one index array one, and with k > 1 of them k + 2 (cupy/_core/
    _routines_indexing.pyx: the flat index zeroed, one kernel per index array, then the take);
  * uploads (host to device: `asarray` of host data, a host index) and downloads (device to host:
    `asnumpy`, `.get()`, `int()`, `float()`, `bool()`, `.item()`, `repr`), with their bytes;
  * syncs: every download waits for the device, as does `Stream.synchronize()`; a boolean mask
    index too (the result's size must be read back).
"""

from __future__ import annotations

import json
import operator
import traceback
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

API_FILE = Path(__file__).with_name("cupy_api.json")

# Functions that only allocate (no kernel) or only make a view.
ALLOCATING = {"empty", "empty_like"}
VIEWS = {"swapaxes", "transpose", "expand_dims", "squeeze", "broadcast_to", "moveaxis", "ravel"}
# Functions that take host data onto the device (an upload) rather than refusing it.
UPLOADING = {"asarray", "array", "asanyarray", "ascontiguousarray"}
# What a fused function may do: elementwise arithmetic.  `where` is fusable
# (cupy/_sorting/search.py).
FUSABLE_FUNCTIONS = {"where"}

BINARY_OPERATORS = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "truediv": operator.truediv,
    "floordiv": operator.floordiv,
    "mod": operator.mod,
    "pow": operator.pow,
    "and": operator.and_,
    "or": operator.or_,
    "xor": operator.xor,
    "lshift": operator.lshift,
    "rshift": operator.rshift,
}
COMPARISONS = {
    "lt": operator.lt,
    "le": operator.le,
    "gt": operator.gt,
    "ge": operator.ge,
    "eq": operator.eq,
    "ne": operator.ne,
}
UNARY_OPERATORS = {"neg": operator.neg, "pos": operator.pos, "abs": abs, "invert": operator.invert}


@dataclass(frozen=True)
class Finding:
    """One thing CuPy would refuse, or do differently from NumPy, and where minirt did it."""

    kind: str
    detail: str
    where: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail} (at {self.where})"


@dataclass
class Counts:
    """What a stretch of code cost the device."""

    operations: int = 0
    uploads: int = 0
    downloads: int = 0
    syncs: int = 0
    bytes_uploaded: int = 0
    bytes_downloaded: int = 0
    # Operations by name ("multiply", "matmul", "copy for matmul", "fused gelu_tanh", ...).
    by_name: Counter = field(default_factory=Counter)


@dataclass(frozen=True)
class ShapedCall:
    """One call whose numbers a GPU library computes in an order it picks by shape."""

    # "matmul", or the reduction's name ("sum", "mean", ...).
    kind: str
    # The operands' shapes (a matmul's two; a reduction's input and its axis).
    shapes: tuple
    where: str


# Reductions that add (max, min, any and all give the same answer in any order).
ADDING_REDUCTIONS = {"sum", "mean", "prod", "cumsum", "cumprod", "var", "std", "dot", "einsum"}


def caller_location() -> str:
    """The innermost frame of minirt's own code (else of the test) that led here."""
    frames = traceback.extract_stack()
    here = str(Path(__file__).resolve().parent)
    for frame in reversed(frames):
        if "/minirt/" in frame.filename:
            return f"{Path(frame.filename).name}:{frame.lineno} in {frame.name}"
    for frame in reversed(frames):
        if not frame.filename.startswith(here):
            return f"{Path(frame.filename).name}:{frame.lineno} in {frame.name}"
    return "?"


class StrictCuPy:
    """The stand-in module: pass it as `xp`.  Its arrays are `StrictArray`s."""

    def __init__(self, api_file: Path = API_FILE):
        self.api = json.loads(api_file.read_text(encoding="utf-8"))
        self.findings: list[Finding] = []
        # Counts collecting right now (`counting` nests).
        self.collecting: list[Counts] = []
        # The name of the fused function being run, or None.
        self.fusing: str | None = None
        # Labels of the regions that must not sync (`no_syncs`).
        self.sync_free: list[str] = []
        # Shape logs collecting right now (`logging_shapes` nests).
        self.shape_logs: list[list[ShapedCall]] = []
        self.ndarray = StrictArray
        self.cuda = StrictCuda(self)
        self.__name__ = "strict_cupy"

    # ------------------------------------------------------------------ bookkeeping

    def finding(self, kind: str, detail: str) -> Finding:
        found = Finding(kind, detail, caller_location())
        self.findings.append(found)
        return found

    def refuse(self, error: type[Exception], kind: str, detail: str) -> Exception:
        """A refusal CuPy makes: recorded, and returned to be raised."""
        self.finding(kind, detail)
        return error(detail)

    @contextmanager
    def counting(self) -> Iterator[Counts]:
        """Collect `Counts` over the body."""
        counts = Counts()
        self.collecting.append(counts)
        try:
            yield counts
        finally:
            self.collecting.remove(counts)

    @contextmanager
    def no_syncs(self, label: str) -> Iterator[None]:
        """A region in which a device sync is a finding."""
        self.sync_free.append(label)
        try:
            yield
        finally:
            self.sync_free.pop()

    @contextmanager
    def logging_shapes(self) -> Iterator[list[ShapedCall]]:
        """Collect a `ShapedCall` for each matmul and adding reduction over the body."""
        log: list[ShapedCall] = []
        self.shape_logs.append(log)
        try:
            yield log
        finally:
            self.shape_logs.remove(log)

    def shaped(self, kind: str, shapes: tuple) -> None:
        """Log a call whose order of arithmetic a GPU library picks by shape."""
        if not self.shape_logs:
            return
        call = ShapedCall(kind, shapes, caller_location())
        for log in self.shape_logs:
            log.append(call)

    def operation(self, name: str, fusable: bool = False) -> None:
        """One device operation; inside a fused function, part of its one kernel instead."""
        if self.fusing is not None:
            if not fusable:
                self.finding("not fusable", f"{name} inside fused {self.fusing}")
            return
        for counts in self.collecting:
            counts.operations += 1
            counts.by_name[name] += 1

    def upload(self, nbytes: int) -> None:
        if self.fusing is not None:
            self.finding("not fusable", f"an upload inside fused {self.fusing}")
        for counts in self.collecting:
            counts.uploads += 1
            counts.bytes_uploaded += int(nbytes)

    def sync(self, why: str) -> None:
        if self.fusing is not None:
            self.finding("not fusable", f"a sync ({why}) inside fused {self.fusing}")
        if self.sync_free:
            self.finding("sync", f"{why} inside {self.sync_free[-1]}")
        for counts in self.collecting:
            counts.syncs += 1

    def download(self, nbytes: int, why: str) -> None:
        self.sync(why)
        for counts in self.collecting:
            counts.downloads += 1
            counts.bytes_downloaded += int(nbytes)

    # ------------------------------------------------------------------ arguments

    def check_call(self, name: str, parameters: dict | None, args: tuple, kwargs: dict) -> None:
        """Keywords and positional arguments against the API record (a TypeError, as CuPy)."""
        if parameters is None:
            return
        if not parameters.get("var_keyword"):
            unknown = sorted(set(kwargs) - set(parameters["keywords"]))
            if unknown:
                raise self.refuse(
                    TypeError,
                    "unknown keyword",
                    f"{name}() got an unexpected keyword {unknown[0]!r}",
                )
        if not parameters.get("var_positional") and len(args) > len(parameters["positional"]):
            raise self.refuse(
                TypeError,
                "too many arguments",
                f"{name}() takes {len(parameters['positional'])} positional arguments, "
                f"{len(args)} given",
            )

    def device_numbers(self, value: Any, what: str) -> Any:
        """An operand as NumPy computes it: a StrictArray's numbers; a host array refused."""
        if isinstance(value, StrictArray):
            return value.numbers
        if isinstance(value, np.ndarray):
            raise self.refuse(
                TypeError,
                "numpy operand",
                f"Unsupported type {type(value)} (a host array in {what})",
            )
        if isinstance(value, (list, tuple)):
            return type(value)(self.device_numbers(item, what) for item in value)
        return value

    def elementwise_operand(self, value: Any, what: str) -> Any:
        """An operand of a ufunc or an operator: a device array or a scalar, nothing else (CuPy's
        CScalar refuses lists too)."""
        if isinstance(value, (list, tuple)):
            raise self.refuse(
                TypeError, "numpy operand", f"Unsupported type {type(value)} in {what}"
            )
        return self.device_numbers(value, what)

    def wrap(self, result: Any) -> Any:
        """NumPy's result as CuPy's: arrays, and 0-d arrays where NumPy gives a scalar."""
        if isinstance(result, np.ndarray):
            return StrictArray(self, result)
        if isinstance(result, np.generic):
            return StrictArray(self, np.asarray(result))
        if isinstance(result, tuple):
            return tuple(self.wrap(item) for item in result)
        return result

    # ------------------------------------------------------------------ the module's names

    def __getattr__(self, name: str) -> Any:
        names = self.__dict__["api"]["names"]
        if name not in names:
            raise AttributeError(f"module 'cupy' has no attribute {name!r}")
        entry = names[name]
        kind = entry["kind"]
        if kind == "ufunc":
            return StrictUfunc(self, name, entry)
        if kind == "function":
            return StrictFunction(self, name, entry["parameters"])
        if kind == "fuse":
            return self.fuse
        if kind in ("class", "value") and hasattr(np, name):
            # dtypes (float32), finfo, newaxis, inf: CuPy's are NumPy's own.
            return getattr(np, name)
        raise AttributeError(f"the stand-in does not model cupy.{name} ({kind})")

    def fuse(self, function=None, *, kernel_name: str | None = None):
        """`cupy.fuse`, used bare or as `fuse(kernel_name=...)`."""
        if function is None:
            return lambda f: StrictFusion(self, f, kernel_name)
        return StrictFusion(self, function, kernel_name)

    def asnumpy(self, a: Any, stream=None, order: str = "C", out=None, blocking: bool = True):
        if not isinstance(a, StrictArray):
            return np.asarray(a, order=order)
        self.download(a.numbers.nbytes, "asnumpy")
        return np.array(a.numbers, order=order)


class StrictCuda:
    """`cupy.cuda`, as far as minirt uses it: the current stream, and the device count."""

    def __init__(self, owner: StrictCuPy):
        self.owner = owner
        self.runtime = StrictRuntime()

    def get_current_stream(self, device_id: int = -1) -> StrictStream:
        return StrictStream(self.owner)


class StrictRuntime:
    @staticmethod
    def getDeviceCount() -> int:
        return 1


class StrictStream:
    def __init__(self, owner: StrictCuPy):
        self.owner = owner

    def synchronize(self) -> None:
        self.owner.sync("Stream.synchronize")


class StrictUfunc:
    """One CuPy ufunc (`tanh`, `exp`, `isfinite`, ...), computed by NumPy's."""

    def __init__(self, owner: StrictCuPy, name: str, entry: dict):
        self.owner = owner
        self.__name__ = name
        self.entry = entry
        self.nin = entry["nin"]
        self.nout = entry["nout"]

    def __call__(self, *args, **kwargs):
        owner = self.owner
        owner.check_call(self.__name__, self.entry["parameters"], args, kwargs)
        inputs = [owner.elementwise_operand(a, f"cupy.{self.__name__}") for a in args[: self.nin]]
        out = kwargs.pop("out", None)
        if out is None and len(args) > self.nin:
            out = args[self.nin]
        if out is not None and not isinstance(out, StrictArray):
            raise owner.refuse(
                TypeError, "numpy operand", f"cupy.{self.__name__}: out is not a device array"
            )
        owner.operation(self.__name__, fusable=True)
        numpy_ufunc = getattr(np, self.__name__)
        if out is not None:
            numpy_ufunc(*inputs, out=out.numbers, **kwargs)
            return out
        return owner.wrap(numpy_ufunc(*inputs, **kwargs))


class StrictFunction:
    """One CuPy function, computed by NumPy's, with CuPy's cost."""

    def __init__(self, owner: StrictCuPy, name: str, parameters: dict | None):
        self.owner = owner
        self.__name__ = name
        self.parameters = parameters

    def __call__(self, *args, **kwargs):
        owner = self.owner
        name = self.__name__
        owner.check_call(name, self.parameters, args, kwargs)
        if name in UPLOADING:
            return self.take_onto_device(*args, **kwargs)
        if name == "matmul":
            return matmul(owner, *args, **kwargs)
        numbers = owner.device_numbers(args, f"cupy.{name}")
        keyword_numbers = {k: owner.device_numbers(v, f"cupy.{name}") for k, v in kwargs.items()}
        if name in ADDING_REDUCTIONS:
            shapes = tuple(getattr(n, "shape", n) for n in numbers)
            owner.shaped(name, (*shapes, kwargs.get("axis")))
        out = kwargs.get("out")
        if name in ALLOCATING or name in VIEWS:
            if owner.fusing is not None:
                owner.finding("not fusable", f"{name} inside fused {owner.fusing}")
        else:
            owner.operation(name, fusable=name in FUSABLE_FUNCTIONS)
        result = getattr(np, name)(*numbers, **keyword_numbers)
        if isinstance(out, StrictArray):
            return out
        if name == "copyto":
            return None
        return owner.wrap(result)

    def take_onto_device(self, a, dtype=None, order=None, copy=None, blocking=False):
        """asarray and its kin: host data is uploaded (a copy, as on a GPU); a device array is
        cast or copied only when asked."""
        owner = self.owner
        if isinstance(a, StrictArray):
            return a.astype(
                a.dtype if dtype is None else dtype, copy=bool(copy) or self.__name__ == "array"
            )
        host = np.array(a, dtype=dtype, order="C" if order is None else order)
        owner.upload(host.nbytes)
        return StrictArray(owner, host)


def matmul(owner: StrictCuPy, a, b, out=None, **kwargs):
    """CuPy's matmul (cupy/_core/_routines_linalg.pyx): 2-D goes to cuBLAS as it is; with more
    dimensions both operands are first made C-contiguous and, for fp16, fp32 (a copy each that is
    not already), and the result is copied into an `out` it cannot write directly."""
    if kwargs:
        raise owner.refuse(
            TypeError, "unknown keyword", f"matmul keywords {sorted(kwargs)} are not modelled"
        )
    left = owner.device_numbers(a, "cupy.matmul")
    right = owner.device_numbers(b, "cupy.matmul")
    owner.operation("matmul")
    owner.shaped("matmul", (left.shape, right.shape))
    ndim = max(left.ndim, right.ndim)
    result_dtype = np.promote_types(left.dtype, right.dtype)
    if ndim > 2:
        compute_dtype = np.dtype(np.float32) if result_dtype == np.float16 else result_dtype
        for operand in (left, right):
            if not operand.flags.c_contiguous or operand.dtype != compute_dtype:
                owner.operation("copy for matmul")
        if out is not None and (not out.numbers.flags.c_contiguous or out.dtype != compute_dtype):
            owner.operation("copy for matmul")
        if out is None and compute_dtype != result_dtype:
            owner.operation("copy for matmul")
    elif out is not None and (not out.numbers.flags.c_contiguous or out.dtype != result_dtype):
        owner.operation("copy for matmul")
    if out is not None:
        if not isinstance(out, StrictArray):
            raise owner.refuse(TypeError, "numpy operand", "cupy.matmul: out is not a device array")
        np.matmul(left, right, out=out.numbers)
        return out
    return owner.wrap(np.matmul(left, right))


class StrictFusion:
    """`cupy.fuse(f)`: with a device array among its arguments, one kernel, in which only
    elementwise work may happen; without one, CuPy just calls `f`."""

    def __init__(self, owner: StrictCuPy, function, kernel_name: str | None):
        self.owner = owner
        self.function = function
        self.name = kernel_name or function.__name__

    def __call__(self, *args):
        owner = self.owner
        for arg in args:
            acceptable = arg is None or isinstance(
                arg, (StrictArray, np.generic, int, float, bool, complex)
            )
            if not acceptable:
                raise owner.refuse(
                    TypeError,
                    "numpy operand",
                    f"Invalid argument type for {self.name!r}: {type(arg)}",
                )
        if not any(isinstance(arg, StrictArray) for arg in args) or owner.fusing is not None:
            return self.function(*args)
        owner.fusing = self.name
        try:
            result = self.function(*args)
        finally:
            owner.fusing = None
        owner.operation(f"fused {self.name}")
        # Each value a fused function returns is written to a new output array, even when it is
        # an argument updated in place (cupy/_core/fusion.pyx, get_fusion's out_params).
        if isinstance(result, StrictArray):
            return StrictArray(owner, result.numbers.copy())
        if isinstance(result, tuple):
            return tuple(StrictArray(owner, r.numbers.copy()) for r in result)
        return result


class StrictArray:
    """A device array of the stand-in: NumPy numbers behind CuPy's rules."""

    __array_priority__ = 100

    def __init__(self, owner: StrictCuPy, numbers: np.ndarray):
        self.owner = owner
        self.numbers = numbers

    # ------------------------------------------------------------------ what costs nothing

    @property
    def shape(self) -> tuple:
        if self.owner.fusing is not None:
            self.owner.finding("not fusable", f"shape inside fused {self.owner.fusing}")
        return self.numbers.shape

    dtype = property(lambda self: self.numbers.dtype)
    ndim = property(lambda self: self.numbers.ndim)
    size = property(lambda self: self.numbers.size)
    itemsize = property(lambda self: self.numbers.itemsize)
    nbytes = property(lambda self: self.numbers.nbytes)
    strides = property(lambda self: self.numbers.strides)
    flags = property(lambda self: self.numbers.flags)

    @property
    def T(self) -> StrictArray:
        return self.view_of(self.numbers.T, "T")

    def view_of(self, numbers: np.ndarray, what: str) -> StrictArray:
        if self.owner.fusing is not None and what not in ("astype",):
            self.owner.finding("not fusable", f"{what} inside fused {self.owner.fusing}")
        return StrictArray(self.owner, numbers)

    def __len__(self) -> int:
        if self.owner.fusing is not None:
            self.owner.finding("not fusable", f"len() inside fused {self.owner.fusing}")
        if self.numbers.ndim == 0:
            raise TypeError("len() of unsized object")
        return len(self.numbers)

    def __iter__(self):
        if self.numbers.ndim == 0:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(len(self.numbers)))

    def transpose(self, *axes) -> StrictArray:
        return self.view_of(self.numbers.transpose(*axes), "transpose")

    def swapaxes(self, axis1: int, axis2: int) -> StrictArray:
        return self.view_of(self.numbers.swapaxes(axis1, axis2), "swapaxes")

    def reshape(self, *shape, order: str = "C", copy=None) -> StrictArray:
        """A view when the layout allows (as CuPy), else a copy: one operation."""
        reshaped = self.numbers.reshape(*shape, order=order)
        if not np.may_share_memory(reshaped, self.numbers) and self.numbers.size:
            self.owner.operation("copy for reshape")
        return self.view_of(reshaped, "reshape")

    # ------------------------------------------------------------------ what crosses to the host

    def __array__(self, dtype=None, copy=None):
        raise self.owner.refuse(
            TypeError,
            "implicit conversion",
            "Implicit conversion to a NumPy array is not allowed. "
            "Please use `.get()` to construct a NumPy array explicitly.",
        )

    def get(self, stream=None, order: str = "C", out=None, blocking: bool = True) -> np.ndarray:
        self.owner.download(self.numbers.nbytes, ".get()")
        return np.array(self.numbers, order=order)

    def host_value(self, why: str) -> np.ndarray:
        self.owner.download(self.numbers.nbytes, why)
        return self.numbers

    def __int__(self) -> int:
        return int(self.host_value("int()"))

    def __float__(self) -> float:
        return float(self.host_value("float()"))

    def __bool__(self) -> bool:
        return bool(self.host_value("bool()"))

    def __index__(self) -> int:
        return operator.index(self.host_value("an index").item())

    def __complex__(self) -> complex:
        return complex(self.host_value("complex()"))

    def item(self):
        return self.host_value(".item()").item()

    def tolist(self):
        return self.host_value(".tolist()").tolist()

    def __repr__(self) -> str:
        return f"strict_cupy.array({self.host_value('repr()')!r})"

    __str__ = __repr__
    __hash__ = None  # type: ignore[assignment]

    # ------------------------------------------------------------------ what runs on the device

    def astype(
        self, dtype, order: str = "K", casting=None, subok=None, copy: bool = True
    ) -> StrictArray:
        """A cast: one operation, or none when the dtype fits and copy is False (a view)."""
        dtype = np.dtype(dtype)
        if dtype == self.numbers.dtype and not copy:
            return self.view_of(self.numbers, "astype")
        self.owner.operation("astype", fusable=True)
        return StrictArray(self.owner, self.numbers.astype(dtype, order=order))

    def __getattr__(self, name: str):
        """Every other method CuPy's ndarray has (sum, max, any, copy, fill, ...): one operation,
        its keywords checked."""
        methods = self.owner.api["ndarray"]["methods"]
        if name not in methods:
            raise AttributeError(f"'cupy.ndarray' object has no attribute {name!r}")
        parameters = methods[name]["parameters"]

        def method(*args, **kwargs):
            owner = self.owner
            owner.check_call(f"ndarray.{name}", parameters, args, kwargs)
            numbers = owner.device_numbers(args, f"ndarray.{name}")
            keyword_numbers = {
                k: owner.device_numbers(v, f"ndarray.{name}") for k, v in kwargs.items()
            }
            if name in ADDING_REDUCTIONS:
                axis = kwargs.get("axis", numbers[0] if numbers else None)
                owner.shaped(name, (self.numbers.shape, axis))
            result = getattr(self.numbers, name)(*numbers, **keyword_numbers)
            # A view (squeeze, ravel of a contiguous array, view) launches nothing.
            is_view = isinstance(result, np.ndarray) and np.may_share_memory(result, self.numbers)
            if not is_view or name == "fill":
                owner.operation(name)
            if isinstance(kwargs.get("out"), StrictArray):
                return kwargs["out"]
            return owner.wrap(result)

        return method

    def operand(self, other: Any, what: str) -> Any:
        return self.owner.elementwise_operand(other, what)

    def binary(self, name: str, other: Any, reflected: bool = False) -> StrictArray:
        function = BINARY_OPERATORS.get(name) or COMPARISONS[name]
        numbers = self.operand(other, f"the operator {name}")
        self.owner.operation(name, fusable=True)
        if reflected:
            return self.owner.wrap(function(numbers, self.numbers))
        return self.owner.wrap(function(self.numbers, numbers))

    def in_place(self, name: str, other: Any) -> StrictArray:
        numbers = self.operand(other, f"the operator i{name}")
        self.owner.operation(f"i{name}", fusable=True)
        getattr(operator, f"i{name}")(self.numbers, numbers)
        return self

    def __matmul__(self, other):
        return matmul(self.owner, self, other)

    def __rmatmul__(self, other):
        return matmul(self.owner, other, self)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        """A NumPy ufunc called on a device array runs CuPy's (as CuPy's ndarray does)."""
        if method != "__call__" or ufunc.__name__ not in self.owner.api["names"]:
            return NotImplemented
        if "out" in kwargs:
            kwargs["out"] = kwargs["out"][0]
        return getattr(self.owner, ufunc.__name__)(*inputs, **kwargs)

    def __array_function__(self, func, types, args, kwargs):
        if func.__name__ not in self.owner.api["names"]:
            return NotImplemented
        return getattr(self.owner, func.__name__)(*args, **kwargs)

    # ------------------------------------------------------------------ indexing

    def index_parts(self, key: Any, what: str) -> tuple[tuple, bool]:
        """The key as NumPy takes it, and whether it is advanced (a gather or a scatter).  Host
        index arrays are uploaded, as CuPy does; integer indices are checked against their axes."""
        parts = key if isinstance(key, tuple) else (key,)
        owner = self.owner
        numbers = []
        advanced = False
        for part in parts:
            if isinstance(part, StrictArray):
                numbers.append(part.numbers)
                advanced = True
            elif isinstance(part, (np.ndarray, list)):
                host = np.asarray(part)
                owner.upload(host.nbytes)
                numbers.append(host)
                advanced = True
            else:
                numbers.append(part)
        if advanced and owner.fusing is not None:
            owner.finding("not fusable", f"{what} inside fused {owner.fusing}")
        return tuple(numbers), advanced

    def checked_indices(self, parts: tuple, what: str) -> tuple:
        """Integer index arrays wrapped around as CuPy does, after a finding for each one that
        leaves its axis (NumPy would raise)."""
        axis = 0
        fixed = []
        for part in parts:
            if part is Ellipsis:
                remaining = sum(1 for p in parts if p is not None and p is not Ellipsis)
                axis += self.numbers.ndim - remaining
                fixed.append(part)
                continue
            if part is None:
                fixed.append(part)
                continue
            if (
                isinstance(part, np.ndarray)
                and part.dtype.kind in "iu"
                and axis < self.numbers.ndim
            ):
                size = self.numbers.shape[axis]
                outside = (part >= size) | (part < -size)
                if outside.any():
                    bad = int(part[outside].ravel()[0])
                    self.owner.finding(
                        "index out of range",
                        f"{what}: index {bad} on an axis of size {size} (CuPy wraps it around)",
                    )
                    part = np.mod(part, size) if size else part
            if isinstance(part, np.ndarray) and part.dtype == bool:
                axis += part.ndim
            else:
                axis += 1
            fixed.append(part)
        return tuple(fixed)

    def __getitem__(self, key):
        parts, advanced = self.index_parts(key, "an index")
        if not advanced:
            if Ellipsis not in parts:
                # Integers alone give CuPy a 0-d view, where NumPy gives a scalar.
                parts = (*parts, Ellipsis)
            return self.view_of(self.numbers[parts], "an index")
        if any(isinstance(p, np.ndarray) and p.dtype == bool for p in parts):
            # The result's size depends on the mask: CuPy reads it back.
            self.owner.sync("a boolean mask index")
        parts = self.checked_indices(parts, "a gather")
        self.indexing_operations(parts, "gather")
        return StrictArray(self.owner, self.numbers[parts])

    def indexing_operations(self, parts: tuple, name: str) -> None:
        """A gather or scatter: one kernel with one index array; with k of them, the flat index
        zeroed, one kernel per index array, then the take or the scatter."""
        arrays = sum(1 for part in parts if isinstance(part, np.ndarray) and part.dtype != bool)
        if arrays > 1:
            self.owner.operation(f"{name} index zeroed")
            for _ in range(arrays):
                self.owner.operation(f"{name} index array")
        self.owner.operation(name)

    def __setitem__(self, key, value):
        owner = self.owner
        parts, advanced = self.index_parts(key, "a scatter")
        if isinstance(value, np.ndarray):
            if not advanced:
                raise owner.refuse(
                    TypeError,
                    "numpy operand",
                    "assignment from a host array (CuPy refuses, gh-2079)",
                )
            owner.upload(value.nbytes)
            numbers = value
        else:
            numbers = owner.device_numbers(value, "an assignment")
        if advanced:
            parts = self.checked_indices(parts, "a scatter")
            self.check_unique_targets(parts)
            self.indexing_operations(parts, "scatter")
        else:
            owner.operation("copy" if isinstance(value, StrictArray) else "fill")
        self.numbers[parts] = numbers

    def check_unique_targets(self, parts: tuple) -> None:
        """A finding when a scatter names one element twice (CuPy leaves which write wins
        undefined)."""
        targets = np.zeros(self.numbers.shape, dtype=np.int64)
        np.add.at(targets, parts, 1)
        if (targets > 1).any():
            where = tuple(int(i) for i in np.argwhere(targets > 1)[0])
            self.owner.finding(
                "duplicate scatter", f"element {where} is written more than once in one scatter"
            )


def add_operators() -> None:
    """The arithmetic, comparison, in-place and unary operators of StrictArray."""
    for name in BINARY_OPERATORS:
        setattr(StrictArray, f"__{name}__", lambda self, other, n=name: self.binary(n, other))
        setattr(
            StrictArray,
            f"__r{name}__",
            lambda self, other, n=name: self.binary(n, other, reflected=True),
        )
        setattr(StrictArray, f"__i{name}__", lambda self, other, n=name: self.in_place(n, other))
    for name in COMPARISONS:
        setattr(StrictArray, f"__{name}__", lambda self, other, n=name: self.binary(n, other))
    for name, function in UNARY_OPERATORS.items():

        def unary(self, n=name, f=function):
            self.owner.operation(n, fusable=True)
            return self.owner.wrap(f(self.numbers))

        setattr(StrictArray, f"__{name}__", unary)


add_operators()


def strict_backend(stand_in: StrictCuPy | None = None):
    """minirt's Backend named "cupy" on the stand-in."""
    from minirt.model.backend import Backend

    return Backend("cupy", stand_in if stand_in is not None else StrictCuPy())


__all__ = ["Counts", "Finding", "ShapedCall", "StrictArray", "StrictCuPy", "strict_backend"]
