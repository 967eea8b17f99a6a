"""Exact batch invariance: the calls that make a row's numbers independent of its batch.

Owns: `RowTiles`, the weight products cut into calls of fixed heights; `probe_row_tiles`, the
check at load that the BLAS keeps the one property those calls rely on (or a one-line refusal
naming the BLAS and its kernel); `describe_blas`; and the attention of exact mode,
`attend_exactly`, in which every query's arithmetic is a call whose shape, and the query's place
in it, depend on the query alone.

Why a batch moves a row's bits at all.  A product [M, C] @ [C, N] gives each row the dot products
of its C features with the weight's columns, and every row's sum runs over the same C terms; but
the order in which the BLAS adds them is its own choice, made by shape.  OpenBLAS computes one row
(M = 1) as a GEMV, whose vector lanes run along C, and several rows with a GEMM kernel, whose
lanes run along the rows and which adds each row's C terms in another order; and some kernels
treat the rows of one call differently by their place in it (Haswell's sgemm: rows in sixes, the
leftover rows apart, and each thread's share of M apart). Floating-point addition is not
associative, so each order rounds differently, in the last bits. Attention adds over the keys a
query sees; a decode step pads every row to the batch's longest history, and the grouping of a
sum can depend on the padded length even where the added terms are exact zeros. None of this
changes a row's value by more than rounding, but a logit that moves by one bit can flip a sampled
token, and one flipped token changes everything after it.

What exact mode does instead:

  * a weight product runs in calls of fixed heights (`RowTiles`: powers of two from 8 to 2048 rows,
    those at which the BLAS gives a row the same result as at 8), the last one padded with zero
    rows.  A row's result then depends on the call's shape, which is one of a few fixed ones, and
    on its place in that call: the probe checks at load that the place does not matter, on the
    model's own weights, and refuses to run if it does;
  * a prompt's queries go in blocks of QUERY_BLOCK aligned to absolute positions (block b holds
    the queries at positions b * QUERY_BLOCK ...), each against keys 0 .. (b + 1) * QUERY_BLOCK,
    those past the query masked: the call's shape and the query's place in it are fixed by its
    position, however the prompt was chunked, cached or batched;
  * a generated token's query goes alone, against exactly its own keys (on NumPy, beside the
    rows whose histories are as long, in one stacked call that gives each row its own);
  * layer norm goes in calls of the same heights, probed the same way (for a GPU's reductions,
    which lay their threads out by the array's shape).

Must not know: requests, sampling, scheduling, files.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from ..errors import MinirtError
from .batch import key_mask
from .layers import softmax_attention

# The heights a weight product's calls may have, tallest first: every power of two from 8 to
# 2048, so that no call but the last carries padding, and that a batch's rows go in as few calls
# as its size in binary has ones (32 decode rows: one call; a prefill of 4096: two).  On the EPYC
# with SkylakeX, a prompt's product in calls of 2048 rows ran 3% slower than in one call of 4096,
# in calls of 512, 13%.
CANDIDATE_HEIGHTS = (2048, 1024, 512, 256, 128, 64, 32, 16, 8)

# The heights for products NumPy computes in its own loops, not the BLAS (float16): those loops
# run no faster in taller calls, and a probe of 2048 fp16 rows would take a minute.
LOOP_HEIGHTS = (64, 32, 16, 8)

# The tallest call of the head [C, V] (a decode step's head has a row a request).
HEAD_TILE_ROWS = 256

# A prompt's queries per attention block (and the keys each block adds).
QUERY_BLOCK = 64


class BatchInvarianceError(MinirtError):
    """Exact batch invariance asked for on a BLAS that cannot give it."""


# ------------------------------------------------------------------ the weight products


@dataclass(frozen=True)
class RowTiles:
    """Heights of the calls a weight product [N, C] @ [C, out] is cut into, tallest first: as
    many calls of the tallest as fit, then of the next, and the last rows in one call of the
    shortest, padded with zero rows."""

    # The array module the products run on (numpy or cupy).
    xp: Any
    heights: tuple[int, ...]

    def cuts(self, n_rows: int) -> list[tuple[int, int]]:
        """(first row, height) of each call for n_rows rows; the last may reach past n_rows."""
        cuts = []
        first = 0
        for height in self.heights:
            while n_rows - first >= height:
                cuts.append((first, height))
                first += height
        if first < n_rows:
            cuts.append((first, self.heights[-1]))
        return cuts

    def capped(self, most_rows: int) -> RowTiles:
        """These heights, without those taller than most_rows (the shortest is always kept)."""
        kept = tuple(h for h in self.heights if h <= most_rows) or self.heights[-1:]
        return RowTiles(self.xp, kept)

    def tallest_within(self, n_rows: int) -> int:
        """The tallest height of at most n_rows rows (the shortest, if none is)."""
        return max((h for h in self.heights if h <= n_rows), default=self.heights[-1])

    def product(self, x, weight):
        """x [N, C] @ weight [C, out] as calls of this plan's heights alone: each row's result
        the same whichever rows share its call.  Every call is alike, as the probe makes it:
        `matmul(rows, weight, out=...)`, rows and out contiguous runs of rows; the last call's
        rows padded with zeros in a buffer of their own, its output in the spare rows of `out`."""
        xp = self.xp
        n_rows, n_in = x.shape
        cuts = self.cuts(n_rows)
        padded_rows = cuts[-1][0] + cuts[-1][1] if cuts else 0
        out = xp.empty((padded_rows, weight.shape[1]), dtype=xp.result_type(x, weight))
        for first, height in cuts:
            end = first + height
            rows = x[first:end]  # [height, C]
            if end > n_rows:
                # The last rows, padded with zeros to the shortest height.
                rows = xp.zeros((height, n_in), dtype=x.dtype)  # [height, C]
                rows[: n_rows - first] = x[first:]
            xp.matmul(rows, weight, out=out[first:end])  # [height, out]
        return out[:n_rows]  # [N, out]

    def rowwise(self, x, function):
        """function(rows) [h, ...] -> [h, ...] of x [N, ...] in calls of these heights (the last
        padded with zero rows): for arithmetic on each row alone, such as layer norm's sums,
        whose order a GPU's reduction kernel may pick by the array's whole shape (the probe
        checks these calls too)."""
        xp = self.xp
        n_rows = x.shape[0]
        out = None
        for first, height in self.cuts(n_rows):
            end = first + height
            if end <= n_rows:
                result = function(x[first:end])  # [height, ...]
            else:
                padded = xp.zeros((height, *x.shape[1:]), dtype=x.dtype)
                padded[: n_rows - first] = x[first:]
                result = function(padded)[: n_rows - first]  # [N - first, ...]
            if out is None:
                out = xp.empty((n_rows, *result.shape[1:]), dtype=result.dtype)
            out[first : first + len(result)] = result
        if out is None:
            # No rows at all: what the function gives for none.
            return function(x)
        return out


def candidate_heights(xp, dtype) -> tuple[int, ...]:
    """The heights exact mode may call a product of `dtype` with: every candidate where the BLAS
    computes it, LOOP_HEIGHTS where NumPy's own loops do (any dtype but float32 and float64)."""
    if xp is np and np.dtype(dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
        return LOOP_HEIGHTS
    return CANDIDATE_HEIGHTS


def describe_blas() -> str:
    """The BLAS NumPy runs on and its kernel, as OpenBLAS names them ("OpenBLAS 0.3.31, kernel
    Haswell"), as far as they can be found."""
    blas = np.__config__.CONFIG.get("Build Dependencies", {}).get("blas", {})
    name = f"{blas.get('name', 'an unknown BLAS')} {blas.get('version', '')}".strip()
    kernel = openblas_kernel()
    return f"{name}, kernel {kernel}" if kernel else name


def openblas_kernel() -> str | None:
    """The kernel OpenBLAS picked for this CPU (its `get_corename`), read from the library NumPy
    loaded; None when it cannot be asked."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower()}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            library = ctypes.CDLL(path)
        except OSError:
            continue
        for symbol in (
            "scipy_openblas_get_corename64_",
            "scipy_openblas_get_corename",
            "openblas_get_corename64_",
            "openblas_get_corename",
        ):
            function = getattr(library, symbol, None)
            if function is not None:
                function.restype = ctypes.c_char_p
                return function().decode()
    return None


def probe_row_tiles(
    xp, weights: list[tuple[Any, int]], heights=CANDIDATE_HEIGHTS, row_functions=()
) -> RowTiles:
    """The heights, among `heights`, at which this BLAS gives a row of a product with each weight
    the same bits wherever the row sits in the call and whatever shares the call, and the same bits
    as at the shortest height.  `weights` holds (weight, the most rows a call of it gets) for one
    weight of each shape, the model's own (a height past a weight's most rows is not asked of it).
    `row_functions` holds (what, features, function) for arithmetic done a row at a time in calls
    of the same heights (layer norm), checked the same way.

    Two calls a height and weight: one random row at every even place, zeros at the odd ones
    (what padding puts there); then the same row at every odd place, random rows at the even ones.
    The shortest height must pass: else a BatchInvarianceError naming the BLAS, its kernel and
    the call."""
    rng = np.random.default_rng(0)
    checks = [
        (f"@ [{w.shape[0]}, {w.shape[1]}]", w.shape[0], most, partial(host_product, xp, weight=w))
        for w, most in weights
    ]
    checks += [
        (what, n_in, max(heights), partial(host_rowwise, xp, function=function))
        for what, n_in, function in row_functions
    ]
    passing = set(heights)
    for what, n_in, most_rows, compute in checks:
        asked = {height for height in heights if height <= most_rows or height == heights[-1]}
        agreeing = agreeing_heights(rng, compute, n_in, heights, most_rows, what)
        passing -= asked - agreeing
    return RowTiles(xp, tuple(height for height in heights if height in passing))


def probe_model_tiles(
    xp, dtype, block_weights: list, head_weight, row_functions
) -> tuple[RowTiles, RowTiles]:
    """A model's exact-mode heights: for its blocks' weight products (one weight of each shape in
    `block_weights`) and for its head, whose calls are kept to HEAD_TILE_ROWS rows (taller ones
    would only speed up scoring every position, and would cost the probe a second or more).
    `row_functions`: its row-at-a-time arithmetic (the norms), as `probe_row_tiles` takes it."""
    heights = candidate_heights(xp, dtype)
    one_of_each_shape = {weight.shape: (weight, max(heights)) for weight in block_weights}
    one_of_each_shape[("head",)] = (head_weight, HEAD_TILE_ROWS)
    tiles = probe_row_tiles(xp, list(one_of_each_shape.values()), heights, row_functions)
    return tiles, tiles.capped(HEAD_TILE_ROWS)


def agreeing_heights(rng, compute, n_in: int, heights, most_rows: int, what: str) -> set[int]:
    """The heights (up to most_rows, and the shortest always) at which `compute` (host rows
    [h, n_in] -> host results [h, ...]) gives one random row, at every place, beside zeros or
    random rows, the bits it gives at the shortest height; a BatchInvarianceError if the
    shortest itself does not agree with itself."""
    shortest = heights[-1]
    row = rng.standard_normal(n_in).astype(np.float32)  # [C]
    reference = None
    agreeing = set()
    for height in sorted(heights):
        if height > most_rows and height != shortest:
            continue
        places = np.arange(height)
        even = np.zeros((height, n_in), np.float32)  # [height, C]
        even[places % 2 == 0] = row
        odd = rng.standard_normal((height, n_in)).astype(np.float32)  # [height, C]
        odd[places % 2 == 1] = row
        results = np.concatenate(
            [compute(even)[places % 2 == 0], compute(odd)[places % 2 == 1]]
        )  # [height, ...]
        if reference is None:
            reference = results[0]
        if all(np.array_equal(result, reference) for result in results):
            agreeing.add(height)
        elif height == shortest:
            raise BatchInvarianceError(
                f"exact batch invariance is not available on {describe_blas()}: a row's result "
                f"of [{height}, {n_in}] {what} changes with its place in the call or with the "
                "rows beside it; run without batch invariance (docs/batch-invariance.md says why)"
            )
    return agreeing


def host_rowwise(xp, rows: np.ndarray, function) -> np.ndarray:
    """function(rows) for host fp32 rows [M, C], on the backend, back on the host."""
    result = function(xp.asarray(rows))  # [M, ...]
    return xp.asnumpy(result) if hasattr(xp, "asnumpy") else result


def host_product(xp, rows: np.ndarray, weight=None) -> np.ndarray:
    """rows [M, C] (host fp32) @ weight [C, out] on the weight's backend and in its dtype, back on
    the host: one call of M rows, made as `RowTiles.product` makes every call."""
    call = RowTiles(xp, (len(rows),))
    product = call.product(xp.asarray(rows).astype(weight.dtype), weight)  # [M, out]
    return xp.asnumpy(product) if hasattr(xp, "asnumpy") else product


# ------------------------------------------------------------------ attention


def attend_exactly(xp, chains, q, k, v, batch, kv, scale: float):
    """Attention of one round as exact mode computes it, packed [N, H, D] queries and [N, G, D]
    keys and values in, [N, H, D] out: this round's keys into the cache (if any), then a prompt's
    queries in blocks aligned to their positions (`attend_in_aligned_blocks`), a row at a time,
    and each generated token's query against exactly its own keys (`attend_alone`), the rows
    whose histories are equally long in one call.  Nothing a query's numbers pass through
    depends on the other rows, on where the round's chunk began, or on how many keys the row's
    neighbours hold."""
    if kv is not None:
        kv.write(k, v)
    out = xp.empty_like(q)  # [N, H, D]
    # Generated tokens' rows by the keys they see.
    decoding_by_length: dict[int, list[int]] = {}
    for row in range(batch.batch_size):
        new_len = int(batch.new_lens[row])
        if new_len == 0:
            continue
        past_len = int(batch.past_lens[row])
        if batch.decoding[row]:
            # A generated token is decoded with its KV cache.
            assert kv is not None and new_len == 1
            decoding_by_length.setdefault(past_len + 1, []).append(row)
            continue
        start = int(batch.first_index[row])
        if kv is not None:
            keys, values = kv.read_row(int(batch.slots[row]), past_len + new_len)  # [G, L, D]
        else:
            keys = k[start : start + new_len].transpose(1, 0, 2)  # [G, L, D]
            values = v[start : start + new_len].transpose(1, 0, 2)  # [G, L, D]
        out[start : start + new_len] = attend_in_aligned_blocks(
            xp, chains, q[start : start + new_len], past_len, keys, values, batch, scale
        )  # [n, H, D]
    for n_keys, rows in decoding_by_length.items():
        # NumPy's matmul calls the BLAS once a matrix of a stack, and reduces each row alone, so
        # a stack of rows gives each the bits it gets alone (and saves a decode round of 32
        # rows about a tenth).  A GPU's batched GEMM and reductions choose their algorithm by the
        # stack's height too: there each row goes alone.
        groups = [rows] if xp is np else [[row] for row in rows]
        for group in groups:
            starts = [int(batch.first_index[row]) for row in group]
            keys, values = kv.read_rows([int(batch.slots[row]) for row in group], n_keys)
            out[starts] = attend_alone(xp, chains, q[starts], keys, values, batch, scale)
    return out


def attend_alone(xp, chains, queries, keys, values, batch, scale: float):
    """Generated tokens' queries [n, H, D], each against its own row's L keys and values
    [n, G, L, D], all of which it sees: for each row and head one call of shape [1, D] @ [D, L]
    (NumPy's matmul calls the BLAS once a matrix of the stack, so n does not change a row's
    call), the softmax's sums each over one row's L; [n, H, D] out."""
    n_keys = keys.shape[-2]
    mask = batch.cached_mask(("alone", n_keys), partial(alone_mask, xp, n_keys))
    return softmax_attention(xp, chains, queries[:, :, None, :], keys, values, mask, scale)[
        :, :, 0
    ]  # [n, H, D]


def attend_in_aligned_blocks(xp, chains, queries, past_len: int, keys, values, batch, scale):
    """A prompt's queries [n, H, D] at positions past_len .. past_len + n - 1, against its keys
    and values [G, past_len + n, D]: block b of QUERY_BLOCK positions (b * QUERY_BLOCK, ...) is
    one call against keys 0 .. (b + 1) * QUERY_BLOCK - 1, those not yet written (or not in the
    prompt) zero, those past each query masked.  A block the round only partly fills gets zero
    queries in the rest: their results are dropped."""
    n_queries, n_head, head_dim = queries.shape
    n_kv_head = keys.shape[0]
    end_position = past_len + n_queries
    first_block = past_len // QUERY_BLOCK
    last_block = (end_position - 1) // QUERY_BLOCK
    # The keys and values in a buffer of whole blocks, zero past the last written.
    n_padded = (last_block + 1) * QUERY_BLOCK
    padded_keys = xp.zeros((n_kv_head, n_padded, head_dim), dtype=keys.dtype)  # [G, P, D]
    padded_values = xp.zeros((n_kv_head, n_padded, head_dim), dtype=values.dtype)  # [G, P, D]
    padded_keys[:, :end_position] = keys
    padded_values[:, :end_position] = values
    out = xp.empty_like(queries)  # [n, H, D]
    for block in range(first_block, last_block + 1):
        block_start = block * QUERY_BLOCK
        n_keys = block_start + QUERY_BLOCK
        # The block's positions this round computes, [first, end).
        first = max(block_start, past_len)
        end = min(n_keys, end_position)
        block_queries = xp.zeros((n_head, QUERY_BLOCK, head_dim), dtype=queries.dtype)
        block_queries[:, first - block_start : end - block_start] = queries[
            first - past_len : end - past_len
        ].transpose(1, 0, 2)  # [H, QUERY_BLOCK, D]
        mask = batch.cached_mask(("block", block), partial(block_mask, xp, block))
        tile = softmax_attention(
            xp,
            chains,
            block_queries,
            padded_keys[:, :n_keys],
            padded_values[:, :n_keys],
            mask,
            scale,
        )  # [H, QUERY_BLOCK, D]
        out[first - past_len : end - past_len] = tile[
            :, first - block_start : end - block_start
        ].transpose(1, 0, 2)  # [end - first, H, D]
    return out


def block_mask(xp, block: int):
    """The KeyMask of query block `block` [1, QUERY_BLOCK, (block + 1) * QUERY_BLOCK]: the query
    at position block * QUERY_BLOCK + i sees the keys at positions 0 .. itself."""
    query_positions = block * QUERY_BLOCK + xp.arange(QUERY_BLOCK)  # [QUERY_BLOCK]
    key_positions = xp.arange((block + 1) * QUERY_BLOCK)  # [keys]
    return key_mask((key_positions[None, :] <= query_positions[:, None])[None])


def alone_mask(xp, n_keys: int):
    """The KeyMask of queries that each see all n_keys keys [1, 1, 1, n_keys]."""
    return key_mask(xp.ones((1, 1, 1, n_keys), dtype=bool))
