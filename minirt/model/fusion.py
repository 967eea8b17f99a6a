"""The elementwise chains of the layers, and their fusion: one GPU kernel each.

Owns: the runs of elementwise arithmetic the layers make (GELU; layer norm's centring, and its
normalise, scale and shift; RMSNorm's normalise and scale; SwiGLU's gate; RoPE's rotation;
softmax's subtract and exp, and its divide), each written once as a
function of `xp` and arrays, and `elementwise_chains`, which binds them to one array module:
NumPy runs each as written, and CuPy compiles each into one kernel (`cupy.fuse`).  A decode step
on a GPU is bound by how many kernels it launches, not by its arithmetic, so this is where the
GPU's speed is won; minirt/model/layers.py calls the chains by name and reads as its formulas.

Must not know: weights, models, batches, files or requests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable


# Each chain takes `xp` and arrays, and does elementwise arithmetic alone: no reduction, no index,
# no matmul (what cupy.fuse can compile into one kernel).  A chain either returns one new array,
# or works in place in its first argument and returns nothing: cupy.fuse writes every value a
# function returns to an output array of its own, so returning the argument it updated would cost
# a GPU a second array (NumPy too works best in place: no new array of a prompt tile's scores).
# `elementwise_chains` binds them.


def gelu_tanh(xp, x):
    """GPT-2's GELU, the tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), in
    place in one new array."""
    out = 0.044715 * x  # [N, I]
    out *= x
    out *= x
    out += x
    out *= math.sqrt(2.0 / math.pi)
    xp.tanh(out, out=out)
    out += 1.0
    out *= x
    # A power of two: the same number as 0.5 x times the rest.
    out *= 0.5  # [N, I]
    return out


def erf(xp, x):
    """The error function, from Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7): NumPy has none."""
    sign = xp.sign(x)  # [...]
    a = xp.abs(x)  # [...]
    t = 1.0 / (1.0 + 0.3275911 * a)  # [...]
    poly = t * (
        0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
    )  # [...]
    return sign * (1.0 - poly * xp.exp(-a * a))  # [...]


def gelu_erf(xp, x):
    """The exact GELU, 0.5 x (1 + erf(x / sqrt 2))."""
    return 0.5 * x * (1.0 + erf(xp, x * (1.0 / math.sqrt(2.0))))  # [N, I]


def centered_on_mean(xp, x, total, n):
    """Each token's features less their mean, from their sum over the n features."""
    return x - total / n  # [N, C] mean 0


def normalize_scale_shift(xp, centered, square_total, n, eps, weight, bias):
    """Layer norm's tail, in place in `centered`: the centred features over their standard
    deviation (from the sum of their squares), then scaled and shifted."""
    centered /= xp.sqrt(square_total / n + eps)  # [N, C] variance 1
    centered *= weight
    centered += bias


def rms_normalize_scale(xp, x32, square_total, n, eps, weight):
    """RMSNorm's tail, as a new fp32 array: each token's features over their root mean square
    (from the sum of their squares), times the learned scale (transformers' LlamaRMSNorm:
    x * rsqrt(mean(x^2) + eps), then the weight)."""
    return x32 * (1.0 / xp.sqrt(square_total / n + eps)) * weight  # [N, C]


def silu_times(xp, gate, up):
    """SwiGLU's gate: SiLU(gate) * up, where SiLU(g) = g * sigmoid(g) = g * 1 / (1 + e^-g), as a
    new array (a hidden g below -88 in fp32 makes e^-g inf and its sigmoid 0, not NaN)."""
    return gate * (1.0 / (1.0 + xp.exp(-gate))) * up  # [N, I]


def rotate_pairs(xp, x, swapped, cos, signed_sin):
    """RoPE's rotation as one expression, a new array: x cos + swapped sin, where `swapped` holds
    each feature's partner in its pair and `signed_sin` is negative on the first half, so that a
    pair (a, b) becomes (a cos - b sin, b cos + a sin) (minirt/model/rope.py)."""
    return x * cos + swapped * signed_sin  # [N, heads, D]


def shift_and_exp(xp, scores, row_max):
    """Softmax's unnormalised weights, in place in `scores`: exp(score - the row's max), so each
    row's largest is 1."""
    scores -= row_max  # [..., L]
    xp.exp(scores, out=scores)


def weighted_mean_or_zero(xp, weighted, total, sees_a_key):
    """Attention's output: the weighted sum of values over the weights' total, or zeros for a
    query that sees no key."""
    return xp.where(sees_a_key, weighted / total, 0.0)  # [..., D]


@dataclass(frozen=True)
class Chains:
    """The chains bound to one array module, each called with its arrays alone."""

    gelu_tanh: Callable
    gelu_erf: Callable
    centered_on_mean: Callable
    normalize_scale_shift: Callable
    rms_normalize_scale: Callable
    silu_times: Callable
    rotate_pairs: Callable
    shift_and_exp: Callable
    weighted_mean_or_zero: Callable


def elementwise_chains(xp) -> Chains:
    """The chains for `xp`: on CuPy each compiled into one kernel (cupy.fuse); on NumPy the
    functions as written.  Make them once per model: CuPy caches each compiled kernel on its
    fused function."""
    fuse = getattr(xp, "fuse", None)

    def bound(chain):
        def run(*arrays):
            return chain(xp, *arrays)

        run.__name__ = chain.__name__
        if fuse is None:
            return run
        return fuse(kernel_name=f"minirt_{chain.__name__}")(run)

    return Chains(
        gelu_tanh=bound(gelu_tanh),
        gelu_erf=bound(gelu_erf),
        centered_on_mean=bound(centered_on_mean),
        normalize_scale_shift=bound(normalize_scale_shift),
        rms_normalize_scale=bound(rms_normalize_scale),
        silu_times=bound(silu_times),
        rotate_pairs=bound(rotate_pairs),
        shift_and_exp=bound(shift_and_exp),
        weighted_mean_or_zero=bound(weighted_mean_or_zero),
    )
