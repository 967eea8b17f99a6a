"""The flags that say how requests are computed and batched, for every command that serves them
(`generate` and `serve`): --backend, --dtype, --policy, --batch-size, --max-round-tokens,
--kv-budget, --prefix-cache, --no-chunked-prefill and --batch-invariant.

Owns: `add_serving_flags` (the one definition of those flags, each command giving its own default
policy: `add_compute_flags` and `add_batching_flags`), `kv_budget_arguments` (--kv-budget as
what `LLM` takes: MiB, or a number of tokens) and `llm_from_flags` (the one place a command
builds its `LLM` from them).

Must not know: what a command does with them.
"""

from __future__ import annotations

from pathlib import Path

from ..engine.scheduler import POLICIES
from ..llm import DEFAULT_KV_BUDGET_MIB, DEFAULT_ROUND_TOKENS, LLM
from ..model.backend import BACKEND_NAMES
from .kv_budget import parse_kv_budget

POLICY_HELP = {
    "static": "static groups (default), or continuous batching that refills free rows every round",
    "continuous": "continuous batching (default): free rows are refilled every round; static: a "
    "group admits nobody until its longest member ends",
}


def add_serving_flags(p, default_policy: str) -> None:
    """How the requests are computed and batched."""
    add_compute_flags(p)
    add_batching_flags(p, default_policy)


def add_compute_flags(p) -> None:
    """How a round's numbers are computed: the backend, the dtype, exact batch invariance."""
    p.add_argument(
        "--backend",
        choices=BACKEND_NAMES,
        default="auto",
        help="array backend (default auto: cupy if a GPU is usable)",
    )
    p.add_argument(
        "--dtype", default="float32", help="compute dtype: float32 (default), float16, float64"
    )
    p.add_argument(
        "--batch-invariant",
        action="store_true",
        help="exact batch invariance: each request's logits, and so its tokens, bitwise the same "
        "alone or in any batch, row, chunking or cache (the BLAS is probed at load, and refused "
        "if it cannot keep it); a decode step alone costs about 2.2-2.5x, from 8 rows on about "
        "nothing "
        "(docs/batch-invariance.md)",
    )


def add_batching_flags(p, default_policy: str) -> None:
    """How requests share rounds: the policy, the rows, the round's and the KV cache's budgets,
    the prefix cache and chunked prefill."""
    p.add_argument(
        "--policy", choices=POLICIES, default=default_policy, help=POLICY_HELP[default_policy]
    )
    p.add_argument(
        "--batch-size", type=int, default=8, metavar="N", help="rows per round (default 8)"
    )
    p.add_argument(
        "--max-round-tokens",
        type=int,
        default=DEFAULT_ROUND_TOKENS,
        metavar="N",
        help="continuous: tokens one round may process, decode rows first, a prompt fed in "
        f"chunks over several rounds when it does not fit what is left (default "
        f"{DEFAULT_ROUND_TOKENS})",
    )
    p.add_argument(
        "--kv-budget",
        default=f"{DEFAULT_KV_BUDGET_MIB}MiB",
        metavar="SIZE",
        help="what a static group's (or the continuous pool's) KV cache may hold: tokens "
        f"(20000) or memory (512MiB, 2GiB) (default {DEFAULT_KV_BUDGET_MIB}MiB); the prefix "
        "cache keeps what the running requests leave of it",
    )
    p.add_argument(
        "--prefix-cache",
        action="store_true",
        help="a prompt whose first tokens, in blocks of 16, an earlier prompt had copies their "
        "keys and values instead of computing them, within what --kv-budget leaves (off by "
        "default: the copies cost a few percent where prompts share nothing)",
    )
    p.add_argument(
        "--no-chunked-prefill",
        dest="chunked_prefill",
        action="store_false",
        help="continuous: feed each prompt whole in its first round (one over "
        "--max-round-tokens is refused) instead of in chunks beside the decoding rows",
    )


def kv_budget_arguments(text: str) -> tuple[float | None, int | None]:
    """--kv-budget as (MiB, None) for a memory size, or (None, tokens) for a number of tokens."""
    unit, amount = parse_kv_budget(text)
    if unit == "bytes":
        return amount / 2**20, None
    return None, amount


def llm_from_flags(args, folder: Path) -> LLM:
    """The `LLM` a command serves with: the model in `folder`, computed and batched as the serving
    flags (and --seed) say."""
    if args.kv_budget_mib is None:
        kv_budget_mib = DEFAULT_KV_BUDGET_MIB
    else:
        kv_budget_mib = args.kv_budget_mib
    return LLM(
        folder,
        backend=args.backend,
        dtype=args.dtype,
        batch_size=args.batch_size,
        seed=args.seed,
        kv_budget_mib=kv_budget_mib,
        kv_budget_tokens=args.kv_budget_tokens,
        policy=args.policy,
        round_token_budget=args.max_round_tokens,
        prefix_cache=args.prefix_cache,
        chunked_prefill=args.chunked_prefill,
        batch_invariant=args.batch_invariant,
    )
