"""Rotary position embeddings (RoPE): how a Llama-family model tells positions apart.

Owns: `RopeSettings` (the base, the scaling), `inverse_frequencies` (one angle per pair of a
head's features, Llama 3's rescaling included), `rotary_tables`, the cos and sin of each of a
round's tokens, and `rotate`, which turns a token's queries or keys by its position.

GPT-2 adds a learned position vector to each token once, at the bottom.  A Llama block instead
rotates every query and key, in every layer, by an angle proportional to the token's position:
feature i of a head is paired with feature i + D/2, and the pair is turned by position * f_i, a
different frequency f_i for each pair.  The dot product of a rotated query and a rotated key then
depends on the two positions only through their difference.  So the position must be each
token's own, in its own sequence: it comes from the round's metadata (`Batch.positions`,
past_lens[b] + 0, 1, ... for row b), never from where the token sits in a padded batch.  A row
padded beside a longer one is rotated exactly as it would be alone.

The numbers are computed in float32, as transformers computes them (its LlamaRotaryEmbedding):
the frequencies 1 / theta^(2i / D), the angle position * f_i, then cos and sin.

Must not know: weights, checkpoints, requests or scheduling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .fusion import Chains


@dataclass(frozen=True)
class RopeSettings:
    """How a config turns positions into angles: `theta`, the base of the frequencies, and the
    scaling of them (`rope_type` "default": none; "linear": every frequency over `factor`;
    "llama3": Llama 3.1's, low frequencies over `factor`, high ones kept, a smooth blend
    between, by the wavelengths of `original_max_position_embeddings`)."""

    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


def inverse_frequencies(settings: RopeSettings, head_dim: int) -> np.ndarray:
    """f_i for each of a head's D/2 feature pairs, float32 [D/2]: 1 / theta^(2i / D), rescaled as
    `settings` says."""
    exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / head_dim  # [D/2]
    # The power correctly rounded to float32 (computed in float64), as torch's float32 pow gives
    # it: NumPy's float32 pow is a unit in the last place off for some pairs, and an angle's error
    # grows with the position (1e-3 in cos by position 8000 at Qwen2.5's shape).
    powers = (np.float64(settings.theta) ** exponents.astype(np.float64)).astype(np.float32)
    frequencies = np.float32(1.0) / powers  # [D/2] fp32
    if settings.rope_type == "linear":
        return (frequencies / np.float32(settings.factor)).astype(np.float32)
    if settings.rope_type == "llama3":
        return llama3_frequencies(frequencies, settings)
    return frequencies


def llama3_frequencies(frequencies: np.ndarray, settings: RopeSettings) -> np.ndarray:
    """Llama 3.1's rescaling, for a context longer than it was trained on: a pair whose wavelength
    (2 pi / f) is longer than the original context / low_freq_factor turns `factor` times slower;
    one shorter than the original context / high_freq_factor is kept; those between are blended
    smoothly by where their wavelength lies."""
    original = settings.original_max_position_embeddings
    low = settings.low_freq_factor
    high = settings.high_freq_factor
    factor = settings.factor
    wavelengths = 2 * math.pi / frequencies  # [D/2]
    slowed = np.where(wavelengths > original / low, frequencies / factor, frequencies)  # [D/2]
    blend = (original / wavelengths - low) / (high - low)  # [D/2]
    smoothed = (1 - blend) * slowed / factor + blend * slowed  # [D/2]
    medium = ~(wavelengths < original / high) & ~(wavelengths > original / low)  # [D/2]
    return np.where(medium, smoothed, slowed).astype(np.float32)  # [D/2]


@dataclass(frozen=True)
class RotaryTables:
    """A round's rotation, one row per token [N, 1, D], in the compute dtype: `cos`, the cosine of
    each feature's angle (a pair's two features share it), and `signed_sin`, its sine with the
    first half of the features negated, so that `rotate` is one elementwise expression."""

    cos: object
    signed_sin: object


def rotary_tables(xp, frequencies, positions, dtype) -> RotaryTables:
    """The cos and sin of each token's angles, from its own position [N] (Batch positions: past
    length plus place in its row, never its padded column) and the frequencies [D/2]."""
    angles = positions.astype(xp.float32)[:, None] * frequencies[None, :]  # [N, D/2] fp32
    cos = xp.cos(angles)  # [N, D/2]
    sin = xp.sin(angles)  # [N, D/2]
    both_cos = xp.concatenate([cos, cos], axis=-1)  # [N, D]
    signed_sin = xp.concatenate([-sin, sin], axis=-1)  # [N, D]
    # One row per token, broadcast over its heads; cast as transformers casts them.
    return RotaryTables(
        cos=both_cos[:, None, :].astype(dtype), signed_sin=signed_sin[:, None, :].astype(dtype)
    )  # [N, 1, D]


def rotate(xp, chains: Chains, x, tables: RotaryTables):
    """Each token's heads [N, heads, D] turned by its angles: feature pair (i, i + D/2), (a, b),
    becomes (a cos - b sin, b cos + a sin), the halves-paired layout Hugging Face checkpoints
    are stored in.  `xp.roll` by D/2 puts b beside a and a beside b."""
    swapped = xp.roll(x, x.shape[-1] // 2, axis=-1)  # [N, heads, D]: (b, a)
    return chains.rotate_pairs(x, swapped, tables.cos, tables.signed_sin)  # [N, heads, D]
