"""Mutation check: does the test suite catch plausible bugs?  A tool, not a test (a full run takes minutes).

Each mutant below is one exact edit of minirt/ (file, old text, new text) that a person could plausibly make:
a comparison off by one, a term dropped from the mask, a slot not zeroed, a stop rule skipped.  For each,
this tool copies the repository to a temporary folder, applies the edit there (never here), runs the quick
suite (`pytest -x -m "not slow"`, with a fixed hypothesis seed so that a run is reproducible), and reports
the mutant as killed (with the first failing test) or survived.  A survivor is a blind spot of the suite:
write the test that kills it, and check by hand that the test fails on the mutant.

Tests of the mutated module's own folder first.  A mutant of minirt/engine/ is run against tests/engine/
first, and against the whole quick suite only if those all pass (so a survivor has passed the whole suite,
and a kill is a test of that suite failing).  Most mutants die in their own folder's tests, in seconds,
instead of after the suite's slow tests of other folders; those that only another folder's tests kill
(tests/refuses, the browser's) still run the whole suite.  The baseline checks that each of those folders passes on its own too.

    python tools/quality/mutants.py                  # every mutant, two at a time; exits 1 if any survived
    python tools/quality/mutants.py --list           # the mutants, one line each
    python tools/quality/mutants.py --check          # after moving code: which mutants went stale
    python tools/quality/mutants.py --only top_p_boundary reused_slot_not_zeroed --jobs 1
    python tools/quality/mutants.py --only window_never_waits --tests tests/server   # a quick look

The mutants of minirt/distributed/ (worker_forgets_global_index, replay_chooses_groups_early,
replay_arrivals_counted_late) are killed only by the tests marked `ray`: run the tool from an environment with the ray extra
(`pip install -e ".[ray]"`), or they survive as blind spots of a suite that skipped those tests.  The mutants
of the replicas (#42: replica_client.py, engine_replica.py, prefix_router.py) are killed by the tests marked
`ray_serve`, which need both extras (`pip install -e ".[serve,ray,test]"`); for a quick look,
`--tests tests/distributed/test_serve_replicas.py`.

The mutants of minirt/server/ and minirt/serve.py are killed only by the tests marked `serve`: run the tool
with the serve extra and its test clients installed (`pip install -e ".[serve,test]"`); those of the round-grid
page (minirt/server/static/rounds.html) only by the tests marked `browser`, which need the browser extra and
Debian's Chromium too (`pip install -e ".[serve,test,browser]"`, `apt-get install chromium`).

When you write new code in minirt/, add mutants for it here.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
# The unmutated suite may take this long before the tool gives up on it.
BASELINE_TIMEOUT_S = 3600.0
COPY_IGNORE = shutil.ignore_patterns(
    ".git",
    ".venv",
    ".hypothesis",
    "__pycache__",
    ".pytest_cache",
    "*.egg-info",
    ".device_deps",
    "build",
    "dist",
)
PYTEST = [
    "-m",
    "pytest",
    "-x",
    "-q",
    "-m",
    "not slow",
    "-p",
    "no:cacheprovider",
    "--hypothesis-seed=0",
    "-W",
    "ignore::RuntimeWarning",
    # It checks that every mutant applies to the tree, which a mutated copy is not: left in, it would
    # kill every mutant that the tests before it let through.
    "--deselect",
    "tests/project/test_mutants_tool.py::test_every_mutant_applies_exactly_once",
]


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str  # relative to the repository root
    old: str  # must occur exactly once in the file
    new: str
    why: str  # the bug it stands for


MUTANTS = [
    # ---- the mask, attention and positions
    Mutant(
        "mask_not_causal_on_the_diagonal",
        "minirt/model/batch.py",
        "causal = key_pos[None, None, :] <= query_pos[:, :, None]",
        "causal = key_pos[None, None, :] < query_pos[:, :, None]",
        "a token cannot see itself",
    ),
    Mutant(
        "mask_without_key_is_real",
        "minirt/model/batch.py",
        "return (causal & key_is_real[:, None, :])[:, None, :, :]",
        "return causal[:, None, :, :]",
        "padding and stale keys become visible to padding queries",
    ),
    Mutant(
        "attention_scaled_by_1_over_d",
        "minirt/model/gpt2.py",
        "scale = 1.0 / math.sqrt(D) if config.scale_attn_weights else 1.0",
        "scale = 1.0 / D if config.scale_attn_weights else 1.0",
        "the wrong attention scale",
    ),
    Mutant(
        "attention_scale_flag_ignored",
        "minirt/model/gpt2.py",
        "scale = 1.0 / math.sqrt(D) if config.scale_attn_weights else 1.0",
        "scale = 1.0 / math.sqrt(D)",
        "scale_attn_weights false is not honoured",
    ),
    Mutant(
        "softmax_without_max_subtraction",
        "minirt/model/fusion.py",
        "    scores -= row_max  # [..., L]",
        "    scores -= 0.0 * row_max  # [..., L]",
        "exp overflows on large scores",
    ),
    Mutant(
        "softmax_normalised_off_by_one",
        "minirt/model/fusion.py",
        "return xp.where(sees_a_key, weighted / total, 0.0)  # [..., D]",
        "return xp.where(sees_a_key, weighted / (total + 1.0), 0.0)  # [..., D]",
        "the weights no longer sum to 1",
    ),
    Mutant(
        "decode_reads_the_cache_one_key_short",
        "minirt/model/kv_cache.py",
        "L = batch.max_kv_len",
        "L = batch.max_kv_len - 1",
        "a decode step's query misses its own key",
    ),
    Mutant(
        "no_key_query_not_zeroed",
        "minirt/model/fusion.py",
        "return xp.where(sees_a_key, weighted / total, 0.0)  # [..., D]",
        "return weighted / total  # [..., D]",
        "a query with no visible key averages hidden values",
    ),
    Mutant(
        "tile_misses_its_diagonal_key",
        "minirt/model/batch.py",
        "yield row, first, end, past_len + end",
        "yield row, first, end, past_len + end - 1",
        "a tile's last query loses the key at its own position",
    ),
    Mutant(
        "tile_ignores_the_history",
        "minirt/model/batch.py",
        "yield row, first, end, past_len + end",
        "yield row, first, end, end",
        "a resumed prompt's tile loses the slot's older keys",
    ),
    Mutant(
        "tiles_skip_a_query",
        "minirt/model/batch.py",
        "for first in range(0, new_len, size):",
        "for first in range(0, new_len, size + 1):",
        "a query between tiles is never computed",
    ),
    Mutant(
        "tiles_skip_the_last_row",
        "minirt/model/batch.py",
        "for row in range(self.batch_size):",
        "for row in range(self.batch_size - 1):",
        "the last row of a prompt round is never attended",
    ),
    Mutant(
        "tile_reads_the_wrong_slot",
        "minirt/model/layers.py",
        "kv.read_row(int(batch.slots[row]), n_keys)",
        "kv.read_row(row, n_keys)",
        "a prompt attends to the keys of the slot numbered like its row",
    ),
    Mutant(
        "tile_rows_start_at_zero",
        "minirt/model/layers.py",
        "start = int(batch.first_index[row])",
        "start = 0",
        "every row's tiles read the first row's tokens",
    ),
    Mutant(
        "row_mask_of_the_first_row",
        "minirt/model/batch.py",
        "one = slice(row, row + 1)",
        "one = slice(0, 1)",
        "a row's tile is masked with the first row's history",
    ),
    Mutant(
        "mlp_tiles_skip_a_token",
        "minirt/model/layers.py",
        "for first in range(0, x.shape[0], rows):",
        "for first in range(0, x.shape[0], rows + 1):",
        "a token between MLP tiles is never computed",
    ),
    Mutant(
        "mlp_tile_skips_the_rest",
        "minirt/model/layers.py",
        "out[first : first + rows] = linear(hidden, down, tiles)  # [rows, C]",
        "out[first : first + rows] = linear(hidden, down, tiles)  # [rows, C]\n        break",
        "only the first MLP tile is computed",
    ),
    Mutant(
        "head_tied_to_an_untied_model",
        "minirt/model/gpt2.py",
        "            if checkpoint.head_is_tied:\n                self.wte_t = self.head_weight",
        "            if True:\n                self.wte_t = self.head_weight",
        "an untied model embeds its tokens with its head",
    ),
    Mutant(
        "embeddings_not_cast_to_the_dtype",
        "minirt/model/gpt2.py",
        "return wte_t[:, token_ids].T.astype(wpe.dtype, copy=False) + wpe[positions]",
        "return wte_t[:, token_ids].T + wpe[positions]",
        "a tied fp16 model silently computes in fp32",
    ),
    Mutant(
        "head_chunks_stop_after_the_first",
        "minirt/model/layers.py",
        "for first in range(0, len(hidden), 1024):",
        "for first in range(0, min(len(hidden), 1024), 1024):",
        "logits past row 1024 are never written",
    ),
    Mutant(
        "history_without_a_cache_accepted",
        "minirt/model/decoder.py",
        "if kv_cache is None and batch.past_lens.any():",
        "if False:",
        "a round claiming past keys without a cache reads another row's tokens",
    ),
    Mutant(
        "byte_order_mark_kept",
        "minirt/cli/prompt_file.py",
        "if number == 1 and raw is not None",
        "if False",
        "a UTF-8 byte-order mark breaks line 1 of a .jsonl file",
    ),
    Mutant(
        "id_prompt_not_decoded",
        "minirt/engine/output.py",
        "if request.prompt is not None or detokenizer is None or not request.prompt_ids:",
        "if True:",
        "a token-id prompt is recorded and shown as null",
    ),
    Mutant(
        "subcommand_errors_unnamed",
        "minirt/__main__.py",
        'prog = f"minirt {args[0]}"',
        'prog = "minirt"',
        "`minirt generate`'s errors do not say which command failed",
    ),
    Mutant(
        "progress_final_state_not_drawn",
        "minirt/generate.py",
        "progress.update(stats, output.done, force=True)",
        "None",
        "the bar stops short of its final state",
    ),
    Mutant(
        "continuous_header_says_group_none",
        "minirt/cli/records.py",
        '    if request.group is None:\n        group = ""\n',
        '    if False:\n        group = ""\n',
        '"group None" in every header under continuous batching',
    ),
    Mutant(
        "prompt_flags_ignored",
        "minirt/generate.py",
        "    if args.prompt is not None:\n        return [PromptEntry(n, text)",
        "    if False:\n        return [PromptEntry(n, text)",
        "--prompt texts are dropped for a prompts file that is not there",
    ),
    Mutant(
        "transpose_drops_the_partial_block",
        "minirt/model/backend.py",
        "for first in range(0, rows.shape[0], 256):",
        "for first in range(0, rows.shape[0] - rows.shape[0] % 256, 256):",
        "a partial last block is never copied",
    ),
    Mutant(
        "tile_mask_from_query_zero",
        "minirt/model/batch.py",
        "(first_query + xp.arange(seq_len))[None, :]",
        "xp.arange(seq_len)[None, :]",
        "every tile is masked as if it were the first",
    ),
    Mutant(
        "positions_ignore_history",
        "minirt/model/batch.py",
        "self.positions = self.past_lens[rows] + cols",
        "self.positions = cols",
        "every decode step is embedded at position 0",
    ),
    Mutant(
        "position_embedding_by_token_id",
        "minirt/model/gpt2.py",
        "+ wpe[positions]  # [N, C]",
        "+ wpe[token_ids % wpe.shape[0]]",
        "positions read from the wrong index",
    ),
    Mutant(
        "next_token_from_first_token",
        "minirt/model/batch.py",
        "    return (np.cumsum(new_lens) - 1)[(new_lens > 0) & wanted]  # [M]",
        "    return (np.cumsum(new_lens) - new_lens)[(new_lens > 0) & wanted]  # [M]",
        "logits taken at a row's first token",
    ),
    Mutant(
        "padding_lands_on_the_wrong_row",
        "minirt/model/batch.py",
        "padded[self.device.rows, self.device.cols] = packed",
        "padded[self.device.rows[::-1], self.device.cols] = packed",
        "packed tokens scattered to the wrong rows",
    ),
    # ---- the KV cache
    Mutant(
        "reused_slot_not_zeroed",
        "minirt/model/kv_cache.py",
        "            self.keys[:, slot, :, overwritten:] = 0\n            self.values[:, slot, :, overwritten:] = 0\n",
        "            pass\n",
        "an earlier occupant's inf/NaN leaks through 0 x inf",
    ),
    Mutant(
        "written_slot_not_noted",
        "minirt/model/kv_cache.py",
        "        self.written[batch.slots] = True\n",
        "",
        "a reused slot is taken as never written, and not zeroed",
    ),
    Mutant(
        "values_written_as_keys",
        "minirt/model/kv_cache.py",
        "value_rows[self.rows] = new_values  # [N, G, D]",
        "value_rows[self.rows] = new_keys  # [N, G, D]",
        "the value cache holds keys",
    ),
    Mutant(
        "kv_length_not_advanced_by_history",
        "minirt/model/kv_cache.py",
        "self.lengths[batch.slots] = batch.kv_lens",
        "self.lengths[batch.slots] = batch.new_lens",
        "a slot forgets its history",
    ),
    Mutant(
        "freed_slot_not_returned",
        "minirt/engine/scheduler.py",
        "            if request.finished:\n                self.kv.free(request)",
        "            if request.finished:\n                pass",
        "a finished request's slot is lost",
    ),
    # ---- layers
    Mutant(
        "gelu_constant",
        "minirt/model/fusion.py",
        "out = 0.044715 * x  # [N, I]",
        "out = 0.04715 * x  # [N, I]",
        "a typo in GELU",
    ),
    Mutant(
        "gelu_form_swapped",
        "minirt/model/config.py",
        'return "tanh" if self.activation_function in GELU_TANH_NAMES else "erf"',
        'return "erf" if self.activation_function in GELU_TANH_NAMES else "tanh"',
        "the other GELU",
    ),
    Mutant(
        "layer_norm_eps_outside_sqrt",
        "minirt/model/fusion.py",
        "centered /= xp.sqrt(square_total / n + eps)  # [N, C] variance 1",
        "centered /= xp.sqrt(square_total / n)  # [N, C] variance 1",
        "epsilon dropped",
    ),
    Mutant(
        "layer_norm_shift_twice",
        "minirt/model/fusion.py",
        "    centered += bias\n",
        "    centered += bias\n    centered += bias\n",
        "the shift added twice",
    ),
    # ---- sampling
    Mutant(
        "temperature_multiplies",
        "minirt/engine/sampler.py",
        "scaled = np.asarray(logits, dtype=np.float64) / params.temperature",
        "scaled = np.asarray(logits, dtype=np.float64) * params.temperature",
        "temperature inverted",
    ),
    Mutant(
        "top_k_drops_boundary_ties",
        "minirt/engine/sampler.py",
        "scaled = np.where(scaled >= kth_largest, scaled, -np.inf)",
        "scaled = np.where(scaled > kth_largest, scaled, -np.inf)",
        "the k-th token itself is dropped",
    ),
    Mutant(
        "top_p_boundary",
        "minirt/engine/sampler.py",
        "kept_in_order = mass_before < params.top_p",
        "kept_in_order = mass_before <= params.top_p",
        "one token too many at an exact boundary",
    ),
    Mutant(
        "top_p_keeps_nothing_extra",
        "minirt/engine/sampler.py",
        "mass_before = np.cumsum(probs[order]) - probs[order]",
        "mass_before = np.cumsum(probs[order])",
        "the token that crosses top_p is dropped",
    ),
    Mutant(
        "greedy_ties_to_highest_id",
        "minirt/engine/sampler.py",
        "token = int(np.argmax(chosen_from))",
        "token = int(chosen_from.size - 1 - np.argmax(chosen_from[::-1]))",
        "ties broken the other way",
    ),
    Mutant(
        "draw_side_left",
        "minirt/engine/sampler.py",
        'token = int(np.searchsorted(cumulative, u, side="right"))',
        'token = int(np.searchsorted(cumulative, u, side="left"))',
        "a zero-probability token can be drawn",
    ),
    Mutant(
        "seed_ignores_request_index",
        "minirt/engine/sampler.py",
        "np.random.SeedSequence([run_seed, index])",
        "np.random.SeedSequence([run_seed, 0])",
        "every request without a seed draws the same stream",
    ),
    Mutant(
        "shortcut_argmax_over_the_batch",
        "minirt/engine/sampler.py",
        "picked = backend.to_numpy(xp.where(finite, xp.argmax(logits, axis=-1), -1))  # [B]",
        "picked = backend.to_numpy(xp.where(finite, xp.argmax(logits, axis=0)[: len(rows)], -1))",
        "the all-greedy shortcut reduces the wrong axis",
    ),
    Mutant(
        "non_finite_row_served",
        "minirt/engine/sampler.py",
        "finite = xp.isfinite(logits).all(axis=-1)  # [B] bool",
        "finite = xp.isfinite(logits).any(axis=-1)  # [B] bool",
        "a NaN row is served as garbage",
    ),
    Mutant(
        "non_finite_sampled_row_served",
        "minirt/engine/sampler.py",
        "finite = np.isfinite(host).all(axis=-1)  # [B] bool",
        "finite = np.isfinite(host).any(axis=-1)  # [B] bool",
        "a sampled row of NaN logits is served as garbage",
    ),
    # ---- the CuPy path: host checks and per-round costs (issue 25)
    Mutant(
        "forward_lets_an_id_past_the_vocabulary_through",
        "minirt/model/decoder.py",
        "outside = (ids < 0) | (ids >= c.vocab_size)  # [N]",
        "outside = ids < 0  # [N]",
        "on CuPy the embedding gather wraps a too-large id around to another token's row",
    ),
    Mutant(
        "forward_lets_a_negative_id_through",
        "minirt/model/decoder.py",
        "outside = (ids < 0) | (ids >= c.vocab_size)  # [N]",
        "outside = ids >= c.vocab_size  # [N]",
        "a negative id picks a row from the end, on NumPy and CuPy alike",
    ),
    Mutant(
        "logits_at_unchecked",
        "minirt/model/decoder.py",
        "outside = (at < 0) | (at >= batch.n_tokens)  # [M]",
        "outside = at < 0  # [M]",
        "logits_at past the round's tokens wraps around on CuPy",
    ),
    Mutant(
        "two_rows_in_one_slot_allowed",
        "minirt/model/batch.py",
        "if len(set(slots.tolist())) < len(slots):",
        "if False:",
        "a scatter that writes one slot twice, undefined on CuPy",
    ),
    Mutant(
        "slot_past_the_cache_allowed",
        "minirt/model/kv_cache.py",
        "if (beyond := batch.slots >= n_slots).any():",
        "if (beyond := batch.slots > n_slots).any():",
        "a round writes the slot one past the cache's last (wrapped to slot 0 on CuPy)",
    ),
    Mutant(
        "kv_rows_swap_slot_and_head",
        "minirt/model/kv_cache.py",
        "return (slots * n_kv_head + heads) * capacity + positions  # [N, G]",
        "return (heads * n_kv_head + slots) * capacity + positions  # [N, G]",
        "a token's keys land in another slot's rows",
    ),
    Mutant(
        "an_upload_per_array",
        "minirt/model/batch.py",
        "return uploaded_once(self.backend, host_arrays)",
        "return DeviceArrays(**{k: self.backend.asarray(a) for k, a in host_arrays.items()})",
        "nine host-to-device copies a round instead of one",
    ),
    Mutant(
        "tile_masks_rebuilt_by_every_layer",
        "minirt/model/batch.py",
        "if key not in self.masks:",
        "if True:",
        "each layer builds each prompt tile's mask again",
    ),
    Mutant(
        "decode_mask_rebuilt_by_every_layer",
        "minirt/model/layers.py",
        "out = softmax_attention(xp, chains, queries, keys, values, batch.key_mask, scale)",
        "out = softmax_attention(xp, chains, queries, keys, values, KeyMask(~batch.mask, batch.mask.any(axis=-1, keepdims=True)), scale)",
        "each layer derives the decode mask's hidden keys again",
    ),
    Mutant(
        "chains_not_fused",
        "minirt/model/fusion.py",
        'fuse = getattr(xp, "fuse", None)',
        "fuse = None",
        "on CuPy every elementwise operation of a chain is a kernel of its own",
    ),
    Mutant(
        "greedy_picks_cross_twice",
        "minirt/engine/sampler.py",
        "picked = backend.to_numpy(xp.where(finite, xp.argmax(logits, axis=-1), -1))  # [B]",
        "picked = np.where(backend.to_numpy(finite), backend.to_numpy(xp.argmax(logits, -1)), -1)",
        "two blocking device-to-host copies a greedy round",
    ),
    Mutant(
        "sampled_finiteness_read_from_the_device",
        "minirt/engine/sampler.py",
        "finite = np.isfinite(host).all(axis=-1)  # [B] bool",
        "finite = backend.to_numpy(backend.xp.isfinite(logits).all(axis=-1))  # [B] bool",
        "a second blocking copy in a sampling round",
    ),
    Mutant(
        "decode_gathers_every_last_token",
        "minirt/model/decoder.py",
        "if batch.last_index.size != batch.n_tokens:",
        "if True:",
        "a decode step gathers the hidden states it already has in order",
    ),
    Mutant(
        "one_tile_mlp_copied_into_place",
        "minirt/model/layers.py",
        "if x.shape[0] <= rows:",
        "if False:",
        "every decode step copies the MLP's output into a second array",
    ),
    Mutant(
        "queries_copied_before_scaling",
        "minirt/model/layers.py",
        "q32 = q.astype(xp.float32, copy=False) * xp.float32(scale)  # [B, H, T, D] fp32",
        "q32 = q.astype(xp.float32) * xp.float32(scale)  # [B, H, T, D] fp32",
        "an fp32 query copied for nothing, each layer",
    ),
    # ---- stopping
    Mutant(
        "eos_ignores_ignore_eos",
        "minirt/engine/request.py",
        "is_eos = token in eos_token_ids and not params.ignore_eos",
        "is_eos = token in eos_token_ids",
        "ignore_eos has no effect",
    ),
    Mutant(
        "stop_token_ids_ignored",
        "minirt/engine/request.py",
        "if is_eos or token in params.stop_token_ids:",
        "if is_eos:",
        "stop_token_ids never stop",
    ),
    Mutant(
        "max_new_tokens_off_by_one",
        "minirt/engine/request.py",
        "elif len(request.token_ids) >= params.max_tokens:",
        "elif len(request.token_ids) > params.max_tokens:",
        "one token too many",
    ),
    Mutant(
        "context_full_off_by_one",
        "minirt/engine/request.py",
        "elif request.prompt_len + len(request.token_ids) >= n_positions:",
        "elif request.prompt_len + len(request.token_ids) > n_positions:",
        "a position past the context",
    ),
    Mutant(
        "stop_string_cannot_straddle",
        "minirt/engine/request.py",
        "search_from = max(0, before - max(len(s) for s in stops) + 1)",
        "search_from = before",
        "a stop string split across tokens is missed",
    ),
    Mutant(
        "stop_string_cut_at_the_last_hit",
        "minirt/engine/request.py",
        "request.text = request.decoded[: min(hits)]",
        "request.text = request.decoded[: max(hits)]",
        "the text is cut too late",
    ),
    Mutant(
        "stream_flush_not_final",
        "minirt/loading/tokenizer.py",
        'return self._utf8.decode(b"", final=True)',
        'return self._utf8.decode(b"", final=False)',
        "an unfinished character is dropped, not U+FFFD",
    ),
    # ---- scheduling and rounds
    Mutant(
        "static_group_ignores_the_kv_budget",
        "minirt/engine/scheduler.py",
        "if count and (count + 1) * longest_with_it > self.kv_budget:",
        "if count and count * longest_with_it > self.kv_budget:",
        "a group one member over the budget",
    ),
    Mutant(
        "static_group_ends_at_first_finish",
        "minirt/engine/scheduler.py",
        "if all(r.finished for r in group.members):",
        "if any(r.finished for r in group.members):",
        "the next group starts before the longest member ends",
    ),
    Mutant(
        "continuous_admission_ignores_kv_budget",
        "minirt/engine/scheduler.py",
        "if needed > self.pool.capacity or reserved + needed > self.kv_budget:",
        "if needed > self.pool.capacity:",
        "admission relies on the pool's shape, not the rule",
    ),
    Mutant(
        "kv_need_one_short",
        "minirt/engine/scheduler.py",
        "wanted = prompt_len + request.params.max_tokens - 1",
        "wanted = prompt_len + request.params.max_tokens - 2",
        "a slot one position too short",
    ),
    Mutant(
        "rounds_waited_off_by_one",
        "minirt/engine/scheduler.py",
        "request.rounds_waited = round_number - 1",
        "request.rounds_waited = round_number",
        "the round count is off",
    ),
    # ---- checkpoints and input checks
    Mutant(
        "shape_check_skipped",
        "minirt/loading/checkpoint.py",
        "    if entry.shape != want:",
        "    if False:",
        "a tensor of the wrong shape is accepted",
    ),
    Mutant(
        "shard_dotdot_allowed",
        "minirt/loading/checkpoint.py",
        '        or Path(name).is_absolute()\n        or ".." in Path(name).parts\n',
        '        or Path(name).is_absolute()\n        or ".." in Path(name).parts[:0]\n',
        "an index may name ../outside",
    ),
    Mutant(
        "bf16_shift",
        "minirt/loading/checkpoint.py",
        "return (words.astype(np.uint32) << 16).view(np.float32)",
        "return (words.astype(np.uint32) << 15).view(np.float32)",
        "bf16 widened wrongly",
    ),
    Mutant(
        "overlapping_tensors_accepted",
        "minirt/loading/safetensors_header.py",
        "        if entry.start < covered:",
        "        if False:",
        "two tensors may share bytes",
    ),
    Mutant(
        "config_size_check_skipped",
        "minirt/loading/checkpoint.py",
        "    if 2 * config.n_weights > file_bytes:",
        "    if False:",
        "an absurd config is sized before it is refused",
    ),
    Mutant(
        "float_ids_accepted",
        "minirt/model/batch.py",
        "isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in items",
        "isinstance(t, (int, float, np.integer)) and not isinstance(t, bool) for t in items",
        "2.7 silently becomes token 2",
    ),
    Mutant(
        "special_id_at_vocab_size",
        "minirt/model/config.py",
        "return token_id if token_id is not None and 0 <= token_id < vocab_size else fallback",
        "return token_id if token_id is not None and 0 <= token_id <= vocab_size else fallback",
        "an EOS id one past the vocabulary is used",
    ),
    Mutant(
        "byte_piece_runs_not_held",
        "minirt/loading/tokenizer.py",
        "        if self.tokenizer.text_may_change(token_id):",
        "        if False:",
        "a SentencePiece byte piece's run is decoded before it ends: the stream is not decode's text",
    ),
    Mutant(
        "stream_window_from_the_start",
        "minirt/loading/tokenizer.py",
        "        self._prefix = self._read",
        "        self._prefix = 0",
        "a stream that is not byte-level decodes all its ids for every token again (quadratic)",
    ),
    Mutant(
        "generation_config_eos_ignored",
        "minirt/loading/tokenizer.py",
        "    others = [*eos_token_ids, *generation_eos_ids(folder), named_eos]",
        "    others = [*eos_token_ids, named_eos]",
        "generation_config.json's end ids (Llama 3's <|eot_id|>) do not stop a request",
    ),
    Mutant(
        "prompts_encoded_without_bos",
        "minirt/loading/tokenizer.py",
        "    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:",
        "    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:",
        "a Llama prompt is encoded without its <s>, unlike transformers' tokenizer(text)",
    ),
    Mutant(
        "tokenizer_panic_escapes",
        "minirt/loading/tokenizer.py",
        "except BaseException as exc:  # noqa: BLE001 (pyo3's PanicException)",
        "except Exception as exc:  # noqa: BLE001",
        "a Rust panic on one prompt ends the whole run",
    ),
    Mutant(
        "tokenizer_truncation_kept",
        "minirt/loading/tokenizer.py",
        "        hf_tokenizer.no_truncation()",
        "        pass",
        "a tokenizer.json's truncation silently cuts prompts",
    ),
    Mutant(
        "json_files_read_whatever_they_are",
        "minirt/loading/json_file.py",
        "    kind = not_a_regular_file(path)\n    if kind:\n        raise NotAJsonFile",
        "    kind = None\n    if kind:\n        raise NotAJsonFile",
        "a FIFO config.json hangs the loader, /dev/zero eats memory",
    ),
    Mutant(
        "untied_head_silently_tied",
        "minirt/loading/checkpoint.py",
        "if head_is_tied and not config.tie_word_embeddings:",
        "if False:",
        "a missing untied head is replaced by wte without a word",
    ),
    Mutant(
        "generation_config_values_unchecked_when_greedy",
        "minirt/llm.py",
        "        SamplingParams(**read)\n        if raw.get",
        "        SamplingParams()\n        if raw.get",
        "a bad generation_config.json value passes while do_sample is false",
    ),
    Mutant(
        "tokenizer_size_not_checked",
        "minirt/loading/tokenizer.py",
        "(n_tokens > vocab_size or top_id >= vocab_size)",
        "(n_tokens > vocab_size)",
        "a tokenizer with ids past the model's vocabulary loads",
    ),
    Mutant(
        "stream_holds_nothing_back",
        "minirt/engine/request.py",
        "    if request.finished or not stops:\n        held_back = 0",
        "    if True:\n        held_back = 0",
        "a stream shows text that a stop string completed later cuts away",
    ),
    Mutant(
        "stream_holds_back_after_the_end",
        "minirt/engine/request.py",
        "    if request.finished or not stops:\n        held_back = 0",
        "    if not stops:\n        held_back = 0",
        "a finished request's last characters never reach its stream",
    ),
    Mutant(
        "no_token_events",
        "minirt/llm.py",
        "                        on_token(TokenEvent.from_request(request))\n",
        "                        pass\n",
        "on_token is never called: nothing streams",
    ),
    Mutant(
        "stream_shows_any_request",
        "minirt/cli/records.py",
        "            or request.output_index != self.next_index\n",
        "",
        "--stream interleaves the requests' text out of input order",
    ),
    Mutant(
        "record_without_prompt_token_ids",
        "minirt/cli/records.py",
        "    if request.prompt is None:\n",
        "    if False:\n",
        "a token-id prompt's record loses its ids",
    ),
    Mutant(
        "utilization_over_the_batch_size",
        "minirt/engine/scheduler.py",
        "return len(self.groups[-1].members)",
        "return self.max_rows",
        "a single request, or a short last group, counts rows it never held",
    ),
    Mutant(
        "kv_budget_tokens_read_as_mib",
        "minirt/engine/engine.py",
        "if kv_budget_tokens is None",
        "if True",
        "--kv-budget 20000 is ignored and the default memory budget used",
    ),
    Mutant(
        "kv_budget_units_confused",
        "minirt/cli/kv_budget.py",
        '{"kib": 2**10, "mib": 2**20, "gib": 2**30}',
        '{"kib": 2**10, "mib": 2**10, "gib": 2**30}',
        "--kv-budget 512MiB means 512 KiB",
    ),
    Mutant(
        "chunk_index_restarts",
        "minirt/distributed/prompt_chunks.py",
        "            index += entries\n",
        "",
        "every chunk numbers its rows from the same index",
    ),
    Mutant(
        "chunk_line_numbers_off",
        "minirt/distributed/prompt_chunks.py",
        "            first_line = line.number + 1",
        "            first_line = line.number",
        "a chunk's error messages name the wrong line",
    ),
    Mutant(
        "worker_forgets_global_index",
        "minirt/distributed/ray_data.py",
        "self.config.logprobs, indexes=indexes",
        "self.config.logprobs, indexes=indexes[:0] or None",
        "a worker numbers its batch from 0: wrong seeds and ids",
    ),
    Mutant(
        "replay_chooses_groups_early",
        "minirt/distributed/serve_on_ray.py",
        "short = choosing and len(engine.scheduler.waiting) < self.batch_size",
        "short = choosing and not engine.scheduler.waiting",
        "a static group is chosen before all its members arrived: a short group, wrong rounds",
    ),
    Mutant(
        "repetition_penalty_sign_ignored",
        "minirt/engine/sampler.py",
        "x[seen] = np.where(x[seen] > 0, x[seen] / penalty, x[seen] * penalty)",
        "x[seen] = x[seen] / penalty",
        "a negative logit is raised by the repetition penalty",
    ),
    Mutant(
        "presence_counts_like_frequency",
        "minirt/engine/sampler.py",
        "params.presence_penalty * (counts > 0)",
        "params.presence_penalty * counts",
        "the presence penalty grows with each repeat",
    ),
    Mutant(
        "min_p_against_the_wrong_top",
        "minirt/engine/sampler.py",
        "probs >= params.min_p * probs.max()",
        "probs >= params.min_p",
        "min-p compares with min_p itself, not min_p x the top probability",
    ),
    Mutant(
        "greedy_shortcut_skips_the_bias",
        "minirt/engine/sampler.py",
        "and not r.params.changes_logits for r in rows",
        "for r in rows",
        "an all-greedy round ignores logit_bias and penalties",
    ),
    Mutant(
        "top_logprobs_least_likely_first",
        "minirt/engine/sampler.py",
        'candidates[np.argsort(-values[candidates], kind="stable")[:n]]',
        'candidates[np.argsort(values[candidates], kind="stable")[:n]]',
        "top_logprobs lists the least likely tokens",
    ),
    Mutant(
        "prompt_logprobs_off_by_one",
        "minirt/engine/sampler.py",
        "targets = np.asarray(prompt_ids[1:], dtype=np.int64)",
        "targets = np.asarray(prompt_ids[:-1], dtype=np.int64)",
        "each prompt token's logprob is read at the wrong token",
    ),
    Mutant(
        "samples_share_a_stream",
        "minirt/engine/sampler.py",
        "    return derived_seed(request_seed, sample)",
        "    return request_seed",
        "every sample of a prompt draws the same tokens",
    ),
    Mutant(
        "sample_seed_depends_on_n",
        "minirt/llm.py",
        "sample=k,\n",
        "sample=k + sp.n - 1,\n",
        "sample k's stream changes with n",
    ),
    # ---- the engine that steps (add_request, step, abort, a pool that grows), and what a new
    # user trips on
    Mutant(
        "abort_keeps_the_slot",
        "minirt/engine/scheduler.py",
        "            self.leave_queue(request)\n        self.kv.free(request)",
        "            self.leave_queue(request)",
        "an aborted running request's slot is never given to the next request",
    ),
    Mutant(
        "abort_leaves_the_request_queued",
        "minirt/engine/engine.py",
        "            ended_group = self.scheduler.remove(request)",
        "            ended_group = None",
        "an aborted request stays in the queue or its row, and runs on",
    ),
    Mutant(
        "aborted_static_group_never_ends",
        "minirt/engine/scheduler.py",
        "        group.last_round = group.first_round + len(group.active_rows) - 1\n        self.end_group()",
        "        group.last_round = group.first_round + len(group.active_rows) - 1\n        self.running = []",
        "a group whose last members were aborted keeps its cache, and the next group is given it",
    ),
    Mutant(
        "pool_grows_without_copying",
        "minirt/engine/kv_manager.py",
        "            new.copy_from(old)",
        "            pass",
        "a pool that grows loses the running requests' keys",
    ),
    Mutant(
        "pool_copy_forgets_the_lengths",
        "minirt/model/kv_cache.py",
        "        self.lengths[:rows] = smaller.lengths  # [rows]",
        "        pass",
        "a grown pool's running slots look empty",
    ),
    Mutant(
        "pool_never_grows",
        "minirt/engine/scheduler.py",
        "        if grown == self.pool:\n            return None, False\n        return grown, rows_in_budget < wanted_rows",
        "        return None, False",
        "a longer request arriving after the pool started is never served",
    ),
    Mutant(
        "draining_admits_anyway",
        "minirt/engine/scheduler.py",
        "        if self.draining:\n            return []\n",
        "",
        "short requests keep a long one waiting for ever",
    ),
    Mutant(
        "add_request_ignores_the_refusal",
        "minirt/engine/engine.py",
        "            refusal = self.scheduler.refusal(request)\n            if refusal is not None:\n                fail_request",
        "            refusal = None\n            if refusal is not None:\n                fail_request",
        "a request over the KV budget is queued and can never run",
    ),
    Mutant(
        "command_line_streams_no_tokens",
        "minirt/generate.py",
        "                for request in step.new_tokens:",
        "                for request in step.new_tokens[:0]:",
        "the command line's streaming hears of no token",
    ),
    Mutant(
        "step_reports_nothing_finished",
        "minirt/engine/engine.py",
        "        output.finished += finished",
        "        output.finished += []",
        "finished requests are never handed on: their records are lost",
    ),
    Mutant(
        "abort_finish_round_one_late",
        "minirt/engine/request.py",
        "request.finish_round = first_token_round + len(request.token_ids) - 1",
        "request.finish_round = first_token_round + len(request.token_ids)",
        "an aborted request's last round is one past its last token",
    ),
    Mutant(
        "late_arrival_reuses_the_first_round",
        "minirt/engine/engine.py",
        "            arrival_s = self.seconds()\n        request.arrival_s = arrival_s",
        "            arrival_s = 0.0\n        request.arrival_s = arrival_s",
        "a request added mid-run says it arrived at the start",
    ),
    Mutant(
        "progress_bar_never_cleared",
        "minirt/cli/progress.py",
        '        self.stream.write("\\r" + " " * self.drawn_width + "\\r")',
        '        self.stream.write("")',
        "a completion is printed on the progress bar's line",
    ),
    Mutant(
        "one_is_plural",
        "minirt/cli/plural.py",
        "    if count == 1:\n        return noun",
        "    if False:\n        return noun",
        '"1 groups", "1 requests"',
    ),
    Mutant(
        "prompt_file_note_missing",
        "minirt/generate.py",
        "        if os.path.isfile(text):",
        "        if False:",
        "--prompt FILE silently generates from the path's text",
    ),
    Mutant(
        "prompts_text_hint_missing",
        "minirt/cli/prompt_file.py",
        '    return f"; to generate from this text itself, use --prompt {shlex.quote(path)}"',
        '    return ""',
        "--prompts TEXT does not suggest --prompt",
    ),
    Mutant(
        "inspect_model_flag_ignored",
        "minirt/inspect.py",
        "    if args.model_flag is not None:\n        return args.model_flag",
        "    if False:\n        return args.model_flag",
        "inspect --model M describes the shipped model",
    ),
    Mutant(
        "help_into_head_fails",
        "minirt/cli/command.py",
        "    except BrokenPipeError:\n        mute_stdout()\n        return EXIT_OK",
        "    except KeyError:\n        mute_stdout()\n        return EXIT_OK",
        "minirt -h | head exits 141 with a message",
    ),
    # ---- an engine that stays usable: one add per request, aborts reported, a round that raises,
    # a new run after serve, times and waits from arrival, a pool that grows twofold
    Mutant(
        "a_request_added_twice",
        "minirt/engine/engine.py",
        "        if request.finish_s is not None or request.arrival_s is not None:",
        "        if False:",
        "a request added twice runs in two rows at once",
    ),
    Mutant(
        "aborts_never_reported",
        "minirt/engine/engine.py",
        "        output.finished = self.aborted_since_step",
        "        output.finished = []",
        "an aborted request's record never reaches on_final",
    ),
    Mutant(
        "a_raising_round_leaves_the_run",
        "minirt/engine/engine.py",
        "        except BaseException:\n            self.reset_run()\n            raise\n        return output",
        "        except BaseException:\n            raise\n        return output",
        "a round that raises leaves half-updated state for the next",
    ),
    Mutant(
        "offline_run_leaves_the_run_behind",
        "minirt/engine/engine.py",
        "            finally:\n                self.reset_run()",
        "            finally:\n                pass",
        "after an offline run, its KV cache and half-served requests outlive it",
    ),
    Mutant(
        "ttft_from_the_run_start",
        "minirt/engine/engine.py",
        "                arrived = request.arrival_s or 0.0",
        "                arrived = 0.0",
        "a late request's time to first token counts from the run's start",
    ),
    Mutant(
        "waits_counted_from_the_run_start",
        "minirt/engine/scheduler.py",
        "request.rounds_waited = round_number - 1 - request.arrival_round",
        "request.rounds_waited = round_number - 1",
        "a late request waited through rounds that ran before it came",
    ),
    Mutant(
        "pool_grows_row_by_row",
        "minirt/engine/scheduler.py",
        "            rows = min(max(rows, 2 * self.pool.rows), self.max_rows, rows_in_budget)",
        "            rows = min(rows, self.max_rows, rows_in_budget)",
        "a stream of arrivals reallocates the pool once per request",
    ),
    Mutant(
        "grown_pool_never_kv_limited",
        "minirt/engine/scheduler.py",
        "        return grown, rows_in_budget < wanted_rows",
        "        return grown, False",
        "the summary hides that the budget held a grown pool down",
    ),
    # ---- bad input, second pass (#23): sampling bounds, flags the model refuses, re-entry, and the
    # blind spots (a check pre-empted by an earlier one, logprobs under a bias, the stop rules' order)
    Mutant(
        "logit_bias_unbounded",
        "minirt/engine/params.py",
        "            if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:",
        "            if False:",
        "a bias of 1.7e308 overflows logits / T and a token is drawn from NaN",
    ),
    Mutant(
        "penalty_bound_one_sided",
        "minirt/engine/params.py",
        "not -MAX_PRESENCE_OR_FREQUENCY <= value <= MAX_PRESENCE_OR_FREQUENCY",
        "not -MAX_PRESENCE_OR_FREQUENCY * 1e308 <= value <= MAX_PRESENCE_OR_FREQUENCY",
        "frequency_penalty -1e308 passes, and the penalty times a count overflows",
    ),
    Mutant(
        "sampling_in_float32",
        "minirt/engine/sampler.py",
        "    x = np.array(logits, dtype=np.float64)  # [V]",
        "    x = np.array(logits, dtype=np.float32)  # [V]",
        "the biases and penalties in float32: a large finite logit / a small temperature overflows",
    ),
    Mutant(
        "flags_not_checked_against_the_model",
        "minirt/cli/sampling_flags.py",
        "            check_params(SamplingParams().updated(**{field: value}))",
        "            SamplingParams().updated(**{field: value})",
        "--logit-bias 99999999999=1 runs and every request fails, replacing --output with errors",
    ),
    Mutant(
        "reentry_not_refused",
        "minirt/engine/engine.py",
        "        if not self.busy.acquire(blocking=False):\n            raise self.reentry_error(call)\n"
        "        try:\n            yield\n        finally:\n            self.busy.release()",
        "        if self.busy.locked():\n            raise self.reentry_error(call)\n        yield",
        "the engine is never held: generate() from on_token starts a second run inside the first",
    ),
    Mutant(
        "generate_not_refused_early",
        "minirt/llm.py",
        '        self.engine.refuse_reentry("LLM.generate")\n',
        "",
        "a generate() from a callback is refused only by the engine, naming Engine.serve",
    ),
    Mutant(
        "forward_position_check_off_by_one",
        "minirt/model/decoder.py",
        "if int(batch.positions.max(initial=0)) >= c.n_positions:",
        "if int(batch.positions.max(initial=0)) > c.n_positions:",
        "position n_positions reaches the position table (an index error, or the wrong row on a GPU)",
    ),
    Mutant(
        "kv_capacity_check_off_by_one",
        "minirt/model/kv_cache.py",
        "if (over := batch.kv_lens > self.capacity).any():",
        "if (over := batch.kv_lens > self.capacity + 1).any():",
        "a round may write one key past a slot's capacity",
    ),
    Mutant(
        "logprob_under_the_processed_logits",
        "minirt/engine/sampler.py",
        "        raw_logprobs = log_softmax(logits)  # [V] float64",
        "        raw_logprobs = log_softmax(chosen_from)  # [V] float64",
        "logprobs under the biased and penalised logits, not the raw model's",
    ),
    Mutant(
        "stop_string_before_stop_token",
        "minirt/engine/request.py",
        "    if is_eos or token in params.stop_token_ids:\n"
        "        # The token is kept in token_ids; its text is not added.\n"
        '        finish(request, "stop", round_number)\n'
        "    elif request.decoder is not None and found_stop_string(request, request.decoder.push(token)):\n"
        '        finish(request, "stop", round_number, text_was_cut=True)\n',
        "    if request.decoder is not None and found_stop_string(request, request.decoder.push(token)):\n"
        '        finish(request, "stop", round_number, text_was_cut=True)\n'
        "    elif is_eos or token in params.stop_token_ids:\n"
        "        # The token is kept in token_ids; its text is not added.\n"
        '        finish(request, "stop", round_number)\n',
        "the stop string is checked first: a stop token's text is added to the kept text",
    ),
    Mutant(
        "jsonl_id_of_a_wrong_type_served",
        "minirt/cli/prompt_file.py",
        "    wrong_id = id_error(obj)\n",
        "    wrong_id = None\n",
        "an id that is null, true, 1.5, a list or an object is served instead of failing its line",
    ),
    Mutant(
        "sampling_refusal_shows_a_python_repr",
        "minirt/cli/requests_from_prompts.py",
        '    return f"{rule}, got {json_text(overrides[name])}"',
        '    return f"{rule}, got {json_text(repr(overrides[name]))}"',
        "a wrong-typed sampling field's record says got 'hot' / True / {'a': 1}",
    ),
    Mutant(
        "jsonl_id_zero_taken_as_none",
        "minirt/cli/prompt_file.py",
        "    if is_json_integer(request_id):\n        return str(request_id)",
        "    if is_json_integer(request_id) and request_id:\n        return str(request_id)",
        '"id": 0 becomes the request\'s index',
    ),
    Mutant(
        "evaluate_window_of_one_passes_the_flag_check",
        "minirt/evaluate.py",
        "    if args.window is not None and args.window < 2:",
        "    if args.window is not None and args.window < 1:",
        "--window 1 is refused only after the model loads",
    ),
    Mutant(
        "read_only_output_told_as_permission_denied",
        "minirt/cli/output_file.py",
        "            if st is not None:\n                os.close(os.open(self.target, os.O_WRONLY))",
        "            if st is not None and not os.access(self.target, os.W_OK):\n"
        "                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))",
        "an existing --output on a read-only file system is reported as Permission denied",
    ),
    Mutant(
        "inspect_ids_trailing_comma_dropped",
        "minirt/inspect.py",
        '    if "" in parts:',
        '    if "" in parts[:-1]:',
        "--ids 5,6, is not told it has an empty item",
    ),
    Mutant(
        "empty_ray_address_runs_locally",
        "minirt/generate.py",
        '    "--ray": "give local, auto or ray://HOST:PORT, or leave --ray out to serve in this process",\n',
        "",
        '--ray "" (an unset variable) quietly serves in this process',
    ),
    Mutant(
        "dataset_nulls_kept_as_values",
        "minirt/distributed/ray_data.py",
        "    given = {name: value for name, value in fields.items() if value is not None}",
        "    given = fields",
        "an Arrow null (a value another row has) fails the row instead of meaning the field left out",
    ),
    Mutant(
        "tensor_named_twice_accepted",
        "minirt/loading/safetensors_header.py",
        "    if repeated_keys(header):",
        "    if False:",
        "a header naming a tensor twice silently loads the last entry (an all-zero embedding)",
    ),
    Mutant(
        "hole_in_data_accepted",
        "minirt/loading/safetensors_header.py",
        "        if entry.start > covered:",
        "        if False:",
        "bytes that belong to no tensor (a polyglot file) are accepted",
    ),
    Mutant(
        "header_limit_in_mib",
        "minirt/loading/safetensors_header.py",
        "MAX_HEADER_BYTES = 100_000_000",
        "MAX_HEADER_BYTES = 100 * 1024 * 1024",
        "a header the format's own reader refuses is read",
    ),
    Mutant(
        "empty_weight_map_blamed_on_config",
        "minirt/loading/checkpoint.py",
        "    if not weight_map:",
        "    if False:",
        "an empty shard index is reported as config.json implying too many weights",
    ),
    Mutant(
        "ambiguous_snapshots_not_named",
        "minirt/loading/checkpoint.py",
        "    if ambiguous:",
        "    if False:",
        "two snapshots without refs/main read as 'not in the cache'",
    ),
    Mutant(
        "loop_called_a_dangling_link",
        "minirt/loading/json_file.py",
        "    if reason.errno == errno.ELOOP:",
        "    if False:",
        "a symlink loop is reported as a link to a missing file",
    ),
    Mutant(
        "dangling_generation_config_taken_as_absent",
        "minirt/llm.py",
        "    link_problem = broken_link(path)\n    if link_problem:\n        raise CheckpointError",
        "    link_problem = broken_link(path) and None\n    if link_problem:\n        raise CheckpointError",
        "a generation_config.json that links to nothing is silently greedy defaults",
    ),
    Mutant(
        "complex_taken_for_a_number",
        "minirt/engine/params.py",
        "    if isinstance(value, np.complexfloating):\n        return False",
        "    if False:\n        return False",
        "np.complex128 passes as a penalty, warns, and then kills the whole run",
    ),
    Mutant(
        "bias_token_twice_summed",
        "minirt/engine/params.py",
        "            seen.add(token)\n",
        "",
        '"38" and "038" add their biases, past the range, or cancel a ban',
    ),
    Mutant(
        "flag_shown_as_python",
        "minirt/cli/sampling_flags.py",
        '    return f"{flag_name(field)} {flag_text(field, overrides[field])}: {rule}"',
        '    return f": {refusal}"',
        "a bad sampling flag is shown as ((5, nan),), without its flag",
    ),
    Mutant(
        "text_for_no_tokenizer_runs",
        "minirt/cli/run_refusals.py",
        "    if all_text:\n",
        "    if all_text and False:\n",
        "text prompts for a model without a tokenizer fail every request, and --output is replaced",
    ),
    Mutant(
        "budget_no_request_fits_runs",
        "minirt/cli/run_refusals.py",
        "    if waiting and all(reason is not None for reason in reasons):",
        "    if waiting and all(reason is not None for reason in reasons[1:]) and False:",
        "a --kv-budget no request fits runs, every request fails, --output is replaced",
    ),
    Mutant(
        "budget_refused_when_one_fits",
        "minirt/cli/run_refusals.py",
        "    if waiting and all(reason is not None for reason in reasons):",
        "    if waiting and any(reason is not None for reason in reasons):",
        "a run is refused although one request fits the budget",
    ),
    Mutant(
        "weights_kind_not_checked",
        "minirt/loading/checkpoint.py",
        "    kind = not_a_regular_file(path)\n    if kind:\n        raise CheckpointError",
        "    kind = not_a_regular_file(path) and None\n    if kind:\n        raise CheckpointError",
        "a model.safetensors, index or shard that is a folder or FIFO is reported absent or missing",
    ),
    Mutant(
        "half_pair_checked_one_way",
        "minirt/loading/tokenizer.py",
        "for present, absent in ((first, second), (second, first)):",
        "for present, absent in ((first, second),):",
        "merges.txt without vocab.json is taken for no tokenizer",
    ),
    # ---- #24: the MLP's tiles
    Mutant(
        "mlp_tile_sized_by_the_input_width",
        "minirt/model/layers.py",
        "MLP_SCRATCH_BYTES // (up.weight.shape[1] * x.itemsize)",
        "MLP_SCRATCH_BYTES // (up.weight.shape[0] * x.itemsize)",
        "the MLP's tiles are sized by n_embd, not n_inner: 4x the scratch it is allowed",
    ),
    # ---- #26: minirt serve (killed by tests/server, marked `serve`: run with the serve extra installed)
    Mutant(
        "server_drops_the_seed",
        "minirt/server/protocol.py",
        '"seed": body.seed,',
        '"seed": None,',
        "a seeded request over HTTP draws a stream of its own, not the one offline gives it",
    ),
    Mutant(
        "max_tokens_default_not_vllms",
        "minirt/engine/params.py",
        "DEFAULT_MAX_TOKENS = 16",
        "DEFAULT_MAX_TOKENS = 64",
        "a request (offline or a body) that says nothing gets 64 tokens, not vLLM's and OpenAI's 16",
    ),
    Mutant(
        "server_samples_share_one_stream",
        "minirt/server/app.py",
        "prompted.choices.append(ChoiceSpec(tuple(ids), params, sample))",
        "prompted.choices.append(ChoiceSpec(tuple(ids), params, 0))",
        "n samples of a prompt are n copies of sample 0",
    ),
    Mutant(
        "server_ignores_a_waiting_clients_disconnect",
        "minirt/server/completion_flow.py",
        '            if message["type"] == "http.disconnect":\n                self.handover.abort(completion_id)',
        '            if message["type"] == "http.disconnect":\n                pass',
        "a client that leaves while its completion waits or runs unstreamed is still computed",
    ),
    Mutant(
        "server_api_key_not_checked",
        "minirt/server/app.py",
        "if self.expected is not None and guarded:",
        "if self.expected is not None and guarded and False:",
        "--api-key is accepted and never enforced",
    ),
    Mutant(
        "server_health_behind_the_key",
        "minirt/server/app.py",
        'guarded = scope["type"] == "http" and (path.startswith("/v1") or path in GUARDED_PATHS)',
        'guarded = scope["type"] == "http"',
        "/health (and /metrics) need the API key, so a load balancer's probe fails",
    ),
    Mutant(
        "server_streamed_body_limit_doubled",
        "minirt/server/bodies.py",
        "            if size > limit:",
        "            if size > 2 * limit:",
        "a chunked body (no Content-Length) may pass the limit",
    ),
    Mutant(
        "server_one_completion_may_pass_the_queue",
        "minirt/engine/client.py",
        "        if count > self.max_queue:",
        "        if count > 10**9:",
        "one completion of more choices than --max-queue is queued whole (or refused 503 for ever)",
    ),
    Mutant(
        "server_engine_thread_dies_on_a_fault",
        "minirt/engine/client.py",
        "            try:\n                self.iterate()\n            except Exception as exc:  # noqa: BLE001 (told to every client, and logged)\n                traceback.print_exc(file=sys.stderr)\n                self.fail_everything(exc)",
        "            self.iterate()",
        "a fault in the engine's thread kills it: every later completion waits for ever",
    ),
    Mutant(
        "server_history_never_forgotten",
        "minirt/engine/engine.py",
        "        del self.scheduler.active_rows[:]",
        "        return\n        del self.scheduler.active_rows[:]",
        "a never-idle server keeps every round's rows and every ended group's members",
    ),
    Mutant(
        "server_queue_unbounded",
        "minirt/engine/client.py",
        "        if waiting + count > self.max_queue:",
        "        if waiting + count > 10**9:",
        "--max-queue is never enforced: no 503, the queue grows without bound",
    ),
    Mutant(
        "server_usage_counts_one_choice",
        "minirt/server/responses.py",
        "completion_tokens = sum(len(final.output.token_ids) for final in finals)",
        "completion_tokens = sum(len(final.output.token_ids) for final in finals[:1])",
        "usage counts the first choice's tokens only",
    ),
    Mutant(
        "server_text_offset_off_by_one",
        "minirt/server/responses.py",
        "        start = self.offset\n",
        "        start = self.offset + 1\n",
        "each token's text_offset points one character past its text",
    ),
    Mutant(
        "server_top_logprobs_without_the_chosen_token",
        "minirt/server/responses.py",
        "            alternatives.setdefault(token_text, json_logprob(logprob))\n",
        "",
        "top_logprobs lacks the sampled token when it is not among the N most likely (logprobs 0: empty)",
    ),
    Mutant(
        "server_echo_drops_the_prompt",
        "minirt/server/responses.py",
        "        text = prompt_text + completion_text",
        "        text = completion_text",
        "echo is accepted and ignored",
    ),
    Mutant(
        "server_failed_choice_answered_200",
        "minirt/server/completion_flow.py",
        '            if final.output.finish_reason in ("error", "abort"):\n                raise choice_failure(final)',
        '            if final.output.finish_reason in ("abort",):\n                raise choice_failure(final)',
        "a completion whose logits went NaN is answered 200 as if it had finished",
    ),
    Mutant(
        "server_no_grace_period",
        "minirt/server/run.py",
        "self.engine_client.begin_shutdown(self.grace_s)",
        "self.engine_client.begin_shutdown(0.0)",
        "SIGTERM aborts the streams in flight at once instead of letting them finish",
    ),
    Mutant(
        "server_grace_period_never_ends",
        "minirt/engine/client.py",
        "        if self.deadline is not None and time.monotonic() >= self.deadline:\n            self.abort_all()",
        "        if self.deadline is not None and time.monotonic() >= self.deadline:\n            pass",
        "after the grace period nothing is aborted: streams are cut by uvicorn without an error event",
    ),
    Mutant(
        "server_policy_flag_ignored",
        "minirt/cli/serving_flags.py",
        "        policy=args.policy,",
        '        policy="continuous",',
        "minirt serve --policy static (or generate --policy static) serves with continuous batching",
    ),
    Mutant(
        "server_stream_cuts_at_a_finished_choice",
        "minirt/server/completion_flow.py",
        "                yield sse(shape.finish(event))",
        "                yield sse(shape.finish(event))\n                break",
        "with n > 1, a stream ends when its first choice does",
    ),
    # ---- the round grid: the engine's records, the feed, the page, the batch window and the delay
    Mutant(
        "record_held_rows_drawn_active",
        "minirt/engine/round_record.py",
        "        elif id(request) in ran:",
        "        elif True:",
        "a finished member of a static group shows as active while its row is only held",
    ),
    Mutant(
        "record_rows_read_after_the_scheduler_freed_them",
        "minirt/engine/engine.py",
        "output.round_record = self.record(holding, active, output.finished + finished, kv_rows)",
        "output.round_record = self.record(list(self.scheduler.running), active, output.finished + finished, kv_rows)",
        "a static group's last round (and a continuous row's last token) is missing from the grid",
    ),
    Mutant(
        "record_waiting_rounds_off_by_one",
        "minirt/engine/round_record.py",
        "        waited = round_number - request.arrival_round",
        "        waited = round_number - request.arrival_round - 1",
        "the queue says a request has waited one round fewer than it has",
    ),
    Mutant(
        "feed_keeps_no_recent_rounds",
        "minirt/server/round_feed.py",
        "            self.recent.append((published, record))",
        "            pass",
        "GET /rounds/recent and a new page's backlog are empty",
    ),
    Mutant(
        "feed_not_closed_on_shutdown",
        "minirt/engine/client.py",
        "            # Open round-grid pages must not hold up the exit.\n            self.on_shutdown()",
        "            # Open round-grid pages must not hold up the exit.",
        "an open page holds the server's exit until uvicorn's own limit",
    ),
    Mutant(
        "window_waits_for_a_full_group",
        "minirt/engine/scheduler.py",
        "        return kv_limited or count >= self.max_rows",
        "        return kv_limited or count > self.max_rows",
        "a full static group still waits out its batch window",
    ),
    Mutant(
        "window_never_waits",
        "minirt/engine/scheduler.py",
        "        return max(0.0, window_s - waited)",
        "        return 0.0",
        "--batch-window does nothing: online static groups start with one member",
    ),
    Mutant(
        "window_waits_when_full_by_memory",
        "minirt/engine/scheduler.py",
        "        return kv_limited or count >= self.max_rows",
        "        return count >= self.max_rows",
        "a static group that the KV budget has already filled waits out its batch window",
    ),
    Mutant(
        "round_delay_ignored",
        "minirt/engine/client.py",
        "        deadline = time.monotonic() + self.round_delay_s",
        "        deadline = time.monotonic()",
        "--round-delay does nothing",
    ),
    Mutant(
        "exercise_not_behind_the_key",
        "minirt/server/app.py",
        'GUARDED_PATHS = ("/rounds/exercise",)',
        "GUARDED_PATHS: tuple[str, ...] = ()",
        "anyone may spend the server's compute through the exercise when --api-key is set",
    ),
    Mutant(
        "exercise_takes_a_length_of_0",
        "minirt/server/rounds_page.py",
        "            if not 1 <= length <= longest:",
        "            if not 0 <= length <= longest:",
        "a length of 0 reaches the engine",
    ),
    Mutant(
        "page_draws_every_held_row_active",
        "minirt/server/static/rounds.html",
        "      cell.dataset.state = holder.state;",
        '      cell.dataset.state = "active";',
        "the page hides what a static group costs: held rows look active",
    ),
    Mutant(
        "page_form_keeps_only_the_last_piece",
        "minirt/server/static/rounds.html",
        "        text.textContent += choice.text;",
        "        text.textContent = choice.text;",
        "the form shows the last streamed piece, not the completion",
    ),
    # ---- the prefix cache and chunked prefill (#28)
    Mutant(
        "prefix_match_skips_the_token_check",
        "minirt/engine/prefix_cache.py",
        "            if block is None or block.tokens != tokens or block.parent is not parent:",
        "            if block is None:",
        "a block whose key collides serves another prompt's keys and values",
    ),
    Mutant(
        "prefix_match_skips_the_parent_check",
        "minirt/engine/prefix_cache.py",
        "            if block is None or block.tokens != tokens or block.parent is not parent:",
        "            if block is None or block.tokens != tokens:",
        "a block is used after another prefix than its own",
    ),
    Mutant(
        "prefix_uses_the_prompts_last_token",
        "minirt/engine/prefix_cache.py",
        "        usable = (len(prompt_ids) - 1) // self.block_tokens\n",
        "        usable = len(prompt_ids) // self.block_tokens\n",
        "a prompt of whole blocks is cached to its end, leaving nothing to give its first token",
    ),
    Mutant(
        "prefix_blocks_copied_to_position_0",
        "minirt/engine/prefix_cache.py",
        "            kv_cache.write_positions(slot, index * self.block_tokens, block.keys, block.values)",
        "            kv_cache.write_positions(slot, 0, block.keys, block.values)",
        "cached blocks land at the wrong positions of the slot",
    ),
    Mutant(
        "prefix_cache_ignores_its_limit",
        "minirt/engine/prefix_cache.py",
        "        while self.positions + self.block_tokens > self.limit_positions:",
        "        while False:",
        "the cache grows past what the KV budget leaves",
    ),
    Mutant(
        "prefix_cache_evicts_the_most_recent",
        "minirt/engine/prefix_cache.py",
        "        for key, block in self.blocks.items():",
        "        for key, block in reversed(self.blocks.items()):",
        "eviction drops the blocks just used, not the least recent",
    ),
    Mutant(
        "prefix_cache_limit_ignores_the_kv_cache",
        "minirt/engine/kv_manager.py",
        "        self.prefix_cache.set_limit(self.budget_positions - kv_positions)",
        "        self.prefix_cache.set_limit(self.budget_positions)",
        "the prefix cache and the running requests' KV cache together exceed the budget",
    ),
    Mutant(
        "admitted_row_prefills_the_cached_part_again",
        "minirt/engine/kv_manager.py",
        "            request.prefilled = cached\n",
        "            request.prefilled = 0\n",
        "the cached prefix is copied and then computed again on top of itself",
    ),
    Mutant(
        "room_made_after_the_kv_cache_is_allocated",
        "minirt/engine/kv_manager.py",
        "        self.make_room(rows * capacity + (self.allocated_positions() if held else 0))",
        "        pass",
        "the KV cache is allocated beside a prefix cache that still holds what it must give up",
    ),
    Mutant(
        "no_wait_for_a_prefix_in_flight",
        "minirt/engine/scheduler.py",
        "            if self.kv.shared_in_flight(candidate, in_flight) > start:",
        "            if False:",
        "requests sharing a prefix still being fed compute it again, each",
    ),
    Mutant(
        "prompt_never_enters_the_cache",
        "minirt/engine/scheduler.py",
        "            if request.prompt_done:\n                self.kv.insert_prompt(request)",
        "            if False:\n                self.kv.insert_prompt(request)",
        "no prompt is ever cached",
    ),
    Mutant(
        "chunk_row_gets_a_token",
        "minirt/engine/runner.py",
        "        wants_logits = [plan.prefill_to.get(r, r.prompt_len) == r.prompt_len for r in active]",
        "        wants_logits = [True for r in active]",
        "a row fed a chunk that does not end its prompt picks a token from a mid-prompt position",
    ),
    Mutant(
        "chunk_takes_the_whole_budget",
        "minirt/engine/scheduler.py",
        "        left = max(0, self.token_budget - tokens)",
        "        left = self.token_budget",
        "prompts take the round's budget as if the decode rows cost nothing",
    ),
    Mutant(
        "unchunked_prompt_is_chunked",
        "minirt/engine/scheduler.py",
        "        if self.chunked_prefill:\n            return left\n        return 0",
        "        return left",
        "--no-chunked-prefill still chunks",
    ),
    Mutant(
        "chunking_refuses_long_prompts",
        "minirt/engine/scheduler.py",
        "        if too_big is None and over_round and not self.chunked_prefill:",
        "        if too_big is None and over_round:",
        "a prompt over the round budget is refused although it could be chunked",
    ),
    Mutant(
        "record_chunk_round_drawn_active",
        "minirt/engine/round_record.py",
        "        if id(request) in ran and not request.prompt_done:",
        "        if False:",
        "the grid draws a chunk round as a round that gave a token",
    ),
    Mutant(
        "usage_cached_tokens_always_0",
        "minirt/server/responses.py",
        '"prompt_tokens_details": {"cached_tokens": sum(cached_per_prompt.values())},',
        '"prompt_tokens_details": {"cached_tokens": 0},',
        "the server never reports the cached prompt tokens",
    ),
    # ---- the KV owner (minirt/engine/kv_manager.py), which the scheduler owns
    # (Dropping the prefix cache's new limit when a group's cache is released is no mutant: the
    # next allocation sets the limit before anything can be inserted, so no test can tell.)
    Mutant(
        "prompts_cached_in_plan_order",
        "minirt/engine/scheduler.py",
        "        for request in sorted(plan.prefill_to, key=slot_of):",
        "        for request in list(plan.prefill_to):",
        "prompts that end in one round enter the prefix cache in the plan's order, not the rows'",
    ),
    Mutant(
        "grown_pool_loses_a_new_row",
        "minirt/engine/kv_manager.py",
        "list(range(len(old.lengths), rows))",
        "list(range(len(old.lengths) + 1, rows))",
        "a pool that grows never hands out its first new row",
    ),
    Mutant(
        "held_pool_replaced_not_grown",
        "minirt/engine/kv_manager.py",
        "        return self.cache is not None and len(self.free_slots) < len(self.cache.lengths)",
        "        return False",
        "a pool that grows is made anew, and the running requests lose their keys",
    ),
    Mutant(
        "chunk_cached_before_it_is_computed",
        "minirt/engine/scheduler.py",
        "            if request.prompt_done:\n                self.kv.insert_prompt(request)",
        "            if True:\n                self.kv.insert_prompt(request)",
        "a chunked prompt's blocks are cached before all of them are in its slot",
    ),
    # ---- the model runner (minirt/engine/runner.py)
    Mutant(
        "rows_not_in_slot_order",
        "minirt/engine/runner.py",
        "        active = sorted(plan.active, key=slot_of)",
        "        active = list(plan.active)",
        "a round's rows leave slot order, and a full pool is gathered instead of read as one view",
    ),
    Mutant(
        "decode_row_feeds_its_first_token",
        "minirt/engine/runner.py",
        "        return request.token_ids[-1:]",
        "        return request.token_ids[:1]",
        "a decoding row feeds its first token again instead of its newest",
    ),
    # ---- the offline loop over step() (minirt/llm.py)
    Mutant(
        "refused_at_once_never_reported",
        "minirt/llm.py",
        "    yield StepOutput(round_number=None, finished=final_at_once)",
        "    yield StepOutput(round_number=None, finished=[])",
        "a request refused as it is added (over the KV budget) never reaches on_final or the output file",
    ),
    Mutant(
        "prefix_cache_flag_ignored",
        "minirt/cli/serving_flags.py",
        "        prefix_cache=args.prefix_cache,",
        "        prefix_cache=False,",
        "--prefix-cache is accepted by generate and serve, and the cache stays off",
    ),
    Mutant(
        "simulated_cache_never_used",
        "minirt/cli/simulation.py",
        "        prefix_cache=prefix_cache,\n        chunked_prefill=chunked_prefill,\n",
        "        prefix_cache=False,\n        chunked_prefill=chunked_prefill,\n",
        "minirt rounds --shared-prefix --prefix-cache shows no saving",
    ),
    Mutant(
        "trace_draws_no_chunk_rounds",
        "minirt/cli/grids.py",
        "        if round_number < first + request.prefill_rounds - 1:",
        "        if False:",
        "--trace draws a chunk round as a token round",
    ),
    # ---- inputs and outputs out of the core (minirt/request_maker.py, the command line's bad lines)
    Mutant(
        "bad_line_not_failed",
        "minirt/cli/requests_from_prompts.py",
        "    fail_request(request, error)\n",
        "    request.error = error\n",
        "a bad line of a prompts file is queued and run with an empty prompt",
    ),
    Mutant(
        "bad_line_record_without_logprobs",
        "minirt/cli/requests_from_prompts.py",
        "        want_logprobs=logprobs or params.logprobs is not None,",
        "        want_logprobs=False,",
        "with --logprobs, a bad line's record lacks the logprobs field its peers have",
    ),
    Mutant(
        "unseeded_requests_share_a_stream",
        "minirt/request_maker.py",
        "            seed = derived_seed(self.run_seed, index)",
        "            seed = derived_seed(self.run_seed, 0)",
        "every unseeded request of a run draws the same random stream",
    ),
    Mutant(
        "run_seed_ignored",
        "minirt/request_maker.py",
        "        return cls(tokenizer, config.vocab_size, config.n_positions, bos_token_id, run_seed)",
        "        return cls(tokenizer, config.vocab_size, config.n_positions, bos_token_id)",
        "--seed and LLM(seed=...) change nothing: every run samples the same",
    ),
    Mutant(
        "empty_prompt_without_bos",
        "minirt/request_maker.py",
        "            bos_token_id = tokenizer.bos_token_id",
        "            bos_token_id = None",
        "an empty prompt is refused although the tokenizer has a BOS",
    ),
    # ---- a narrow server surface (#37): the engine's client, refusals as values, the budget once
    Mutant(
        "kv_refusal_names_the_prompt",
        "minirt/engine/scheduler.py",
        'return Refusal(KV_BUDGET, "max_tokens", needed=needed, limit=self.kv_budget)',
        'return Refusal(KV_BUDGET, "prompt", needed=needed, limit=self.kv_budget)',
        "a request over the KV budget is refused about its prompt, not max_tokens",
    ),
    Mutant(
        "stop_token_refusal_names_stop",
        "minirt/request_maker.py",
        'check_token_ids(params.stop_token_ids, self.vocab_size, "stop", field="stop_token_ids")',
        'check_token_ids(params.stop_token_ids, self.vocab_size, "stop")',
        "a stop token id outside the vocabulary is a 400 naming stop, not stop_token_ids",
    ),
    Mutant(
        "add_requests_queues_as_it_checks",
        "minirt/engine/engine.py",
        "        for request in requests:\n            if request.finished:\n                continue\n            refusal = self.scheduler.refusal(request)\n            if refusal is not None:\n                return refusal\n        for request in requests:\n            self.enter(request, None, None)\n",
        "        for request in requests:\n            refusal = None if request.finished else self.scheduler.refusal(request)\n            if refusal is not None:\n                return refusal\n            self.enter(request, None, None)\n",
        "a completion refused for one choice leaves the choices before it queued (all or none broken)",
    ),
    Mutant(
        "add_requests_skips_the_budget",
        "minirt/engine/engine.py",
        "            refusal = self.scheduler.refusal(request)\n            if refusal is not None:\n                return refusal",
        "            refusal = None\n            if refusal is not None:\n                return refusal",
        "a served request over the KV budget is queued and can never run",
    ),
    Mutant(
        "snapshot_queries_one_short",
        "minirt/engine/client.py",
        "        self.prefix_cache_queries += looked_up",
        "        self.prefix_cache_queries += looked_up - 1",
        "the snapshot counts each prompt's lookups one token short",
    ),
    Mutant(
        "events_to_the_first_submission",
        "minirt/engine/client.py",
        "                    self.tracked[request] = (submission, choice)",
        "                    self.tracked[request] = (submissions[0], choice)",
        "submissions queued together all hear the first one's tokens and finals",
    ),
    Mutant(
        "shutting_down_answered_400",
        "minirt/server/handover.py",
        'return APIError(503, "the server is shutting down; send it to another server")',
        'return APIError(400, "the server is shutting down; send it to another server")',
        "a completion refused while the server shuts down is told it was bad, not to retry elsewhere",
    ),
    Mutant(
        "final_output_shares_the_token_list",
        "minirt/engine/output.py",
        "            token_ids=list(request.token_ids),",
        "            token_ids=request.token_ids,",
        "a final output shares the request's token list, which a later change would alter",
    ),
    # ---- one scheduler everywhere: the model-free runner (minirt rounds, the Ray replay)
    Mutant(
        "replayed_failure_ignored",
        "minirt/engine/model_free_runner.py",
        "            if ending is not None and ending.fails and len(request.token_ids) == ending.tokens:",
        "            if False:",
        "the Ray replay runs a request that failed mid-run to its max_new_tokens",
    ),
    Mutant(
        "replayed_stop_ignored",
        "minirt/engine/model_free_runner.py",
        "            if len(request.token_ids) == ending.tokens:",
        "            if len(request.token_ids) == ending.tokens + 1:",
        "the Ray replay runs a request that stopped early one round too long",
    ),
    Mutant(
        "replay_arrivals_counted_late",
        "minirt/distributed/serve_on_ray.py",
        "            self.engine.add_request(stub, arrival_s=0.0, arrival_round=0)",
        "            self.engine.add_request(stub, arrival_s=0.0)",
        "a replayed request that joins after earlier groups ran is said to have waited fewer rounds",
    ),
    Mutant(
        "tokenizer_eos_ignored",
        "minirt/engine/engine.py",
        "            runner.eos_token_ids = tuple(detokenizer.eos_token_ids)",
        "            pass",
        "a model whose config has no EOS never stops at the tokenizer's <|endoftext|>",
    ),
    Mutant(
        "model_free_rows_out_of_slot_order",
        "minirt/engine/model_free_runner.py",
        "        return sorted(plan.active, key=slot_of), None",
        "        return list(plan.active), None",
        "the simulated rounds run rows in admission order, so prefix-cache inserts differ from the engine's",
    ),
    # ---- the model-family seam (minirt/model/registry.py, interface.py, grouped K/V heads)
    Mutant(
        "kv_heads_tiled_not_repeated",
        "minirt/model/layers.py",
        "    grouped_q = q.reshape(*q.shape[:-3], n_kv_head, group, *q.shape[-2:])",
        "    grouped_q = q.reshape(*q.shape[:-3], group, n_kv_head, *q.shape[-2:]).swapaxes(-4, -3)",
        "query head h reads K/V head h % G (tiled), not h // (H / G) (grouped)",
    ),
    Mutant(
        "kv_budget_by_query_heads",
        "minirt/engine/runner.py",
        "            c.n_layer, c.n_kv_head, c.head_dim, 1, 1, model.dtype",
        "            c.n_layer, c.n_head, c.head_dim, 1, 1, model.dtype",
        "a model with grouped K/V heads is budgeted as if each query head had its own",
    ),
    Mutant(
        "unknown_model_type_read_as_gpt2",
        "minirt/model/registry.py",
        "    family = FAMILIES.get(model_type) if isinstance(model_type, str) else None",
        "    family = FAMILIES.get(model_type, FAMILIES[DEFAULT_MODEL_TYPE]) if isinstance(model_type, str) else None",
        "a Llama config.json is read as GPT-2's, and fails later on its tensor names",
    ),
    Mutant(
        "architecture_named_wrong",
        "minirt/loading/checkpoint.py",
        '            f"this is not a {family.architecture} checkpoint"',
        '            "this is not a checkpoint"',
        "a checkpoint with foreign tensors is refused without naming what minirt expected",
    ),
    Mutant(
        "waiting_need_kept_on_leave",
        "minirt/engine/scheduler.py",
        "        self.waiting.remove(request)\n        self.waiting_need.discard(self.kv_positions_needed(request))\n",
        "        self.waiting.remove(request)\n",
        "a request that leaves the queue (admitted or aborted) still counts as its longest need: the pool grows for it",
    ),
    Mutant(
        "longest_need_stale_top",
        "minirt/engine/scheduler.py",
        "        while self.queued[-self.heap[0]] == 0:\n            heapq.heappop(self.heap)\n",
        "",
        "the longest waiting need is read off the heap's top without dropping needs no queued request has",
    ),
    Mutant(
        "round_records_always_spared",
        "minirt/engine/engine.py",
        "        if self.round_records:\n            output.round_record = self.record(",
        "        if not self.round_records:\n            output.round_record = self.record(",
        "a run that asks for round records gets none (the live page and grids go blank)",
    ),
    Mutant(
        "growth_counts_the_new_pool_alone",
        "minirt/engine/kv_manager.py",
        "rows * capacity + (self.allocated_positions() if held else 0)",
        "rows * capacity",
        "while a pool grows, the old pool it copies from is not counted: the budget is overrun",
    ),
    Mutant(
        "admitted_slot_highest_first",
        "minirt/engine/kv_manager.py",
        "request.slot = self.free_slots.pop(0)",
        "request.slot = self.free_slots.pop()",
        "slots are handed out highest first: rows (and round grids) come out in another order",
    ),
    Mutant(
        "admitted_slot_not_reset",
        "minirt/engine/kv_manager.py",
        "        self.cache.reset_slot(request.slot, overwritten=cached)\n",
        "",
        "a slot reused after its earlier occupant keeps that occupant's keys and length",
    ),
    # The server under attack (#38): each bound at its edge, each rule alone.
    Mutant(
        "stop_bound_one_short",
        "minirt/server/protocol.py",
        "    if count > MAX_STOP:",
        "    if count >= MAX_STOP:",
        "OpenAI's 4 stop sequences refused: a body at the bound is a 400",
    ),
    Mutant(
        "stop_chars_unbounded",
        "minirt/server/protocol.py",
        "        if len(stop) > MAX_STOP_CHARS:",
        "        if len(stop) > 100 * MAX_STOP_CHARS:",
        "a stop string of 50,000 characters is searched for in every piece of text, every round",
    ),
    Mutant(
        "logit_bias_bound_one_short",
        "minirt/server/protocol.py",
        "    if count > MAX_LOGIT_BIAS_ENTRIES:",
        "    if count >= MAX_LOGIT_BIAS_ENTRIES:",
        "OpenAI's 300 logit_bias entries refused",
    ),
    Mutant(
        "stop_token_ids_unbounded",
        "minirt/server/protocol.py",
        "    if count > MAX_STOP_TOKEN_IDS:",
        "    if count > 100 * MAX_STOP_TOKEN_IDS:",
        "30,000 stop token ids looked up for every token, every round",
    ),
    Mutant(
        "prompts_counted_as_one",
        "minirt/server/protocol.py",
        "        return 1\n    return len(prompt)",
        "        return 1\n    return 1",
        "100,000 prompts are each encoded before the queue's bound refuses them",
    ),
    Mutant(
        "max_tokens_filling_the_context_refused",
        "minirt/server/protocol.py",
        "if max_tokens >= 1 and prompt_len + max_tokens > n_positions:",
        "if max_tokens >= 1 and prompt_len + max_tokens >= n_positions:",
        "a completion that fills the context exactly is refused as past it",
    ),
    Mutant(
        "nested_field_named_by_its_object",
        "minirt/server/protocol.py",
        '        field = f"{field}.{location[1]}"',
        "        field = field",
        "an error in stream_options.include_usage names stream_options alone",
    ),
    Mutant(
        "surrogates_in_lists_unchecked",
        "minirt/server/protocol.py",
        '                pending.append((inner, param, f"{where}[{place}]"))',
        "                pass",
        "a lone surrogate inside a list (a stop sequence) reaches the engine",
    ),
    Mutant(
        "json_suffix_types_refused",
        "minirt/server/bodies.py",
        'return kind == "application" and (subtype == "json" or subtype.endswith("+json"))',
        'return kind == "application" and subtype == "json"',
        "a body declared application/merge-patch+json (JSON by RFC 6839) is a 415",
    ),
    Mutant(
        "text_plain_read_as_json",
        "minirt/server/bodies.py",
        "    if content_type is not None and not is_json(content_type):",
        '    if content_type is not None and not (is_json(content_type) or "text/" in content_type):',
        "a text/plain post, which any web page may send without a preflight, runs as a completion",
    ),
    Mutant(
        "leading_zeros_counted_as_digits",
        "minirt/server/bodies.py",
        '    significant = digits.lstrip("0")',
        "    significant = digits",
        "a Content-Length of 0000000000000000000005 is refused as past the limit",
    ),
    Mutant(
        "origin_default_port_ignored",
        "minirt/server/origin.py",
        "port if port is not None else DEFAULT_PORTS[parts.scheme]",
        "port",
        "http://host and http://host:80 are two sites: the page of the server on port 80 is refused",
    ),
    Mutant(
        "origin_null_passes",
        "minirt/server/origin.py",
        "        if site is None or site != site_of_host(host, urlsplit(shown).scheme):",
        "        if site is not None and site != site_of_host(host, urlsplit(shown).scheme):",
        "Origin: null (a sandboxed frame, a file: page) is let through as if it were a program",
    ),
    Mutant(
        "missing_host_allowed",
        "minirt/server/http_rules.py",
        '    if scope.get("http_version") == "1.1" and hosts != 1:',
        '    if scope.get("http_version") == "1.1" and hosts > 1:',
        "an HTTP/1.1 request without a Host is answered (RFC 9112 requires a 400)",
    ),
    Mutant(
        "header_limit_doubled",
        "minirt/server/http_rules.py",
        "    if size > HEADER_LIMIT:",
        "    if size > 2 * HEADER_LIMIT:",
        "headers of 100 KiB are read and answered",
    ),
    Mutant(
        "arriving_head_unbounded",
        "minirt/server/connections.py",
        "        if self.head_bytes > HEAD_LIMIT:",
        "        if self.head_bytes > 1000 * HEAD_LIMIT:",
        "a head of megabytes that never ends is kept whole, its pieces appended (RSS and time)",
    ),
    Mutant(
        "head_count_not_reset",
        "minirt/server/connections.py",
        "        self.awaiting_head = False\n        self.head_bytes = 0\n",
        "        self.awaiting_head = False\n",
        "the second big head on a keep-alive connection is counted on top of the first: a 431",
    ),
    Mutant(
        "head_counted_from_the_chunk_that_ended_a_body",
        "minirt/server/connections.py",
        "        if counted and self.messages_completed == completed_before:",
        "        if counted:",
        "a head that begins where a pipelined body ends is charged the body's bytes: a 431",
    ),
    Mutant(
        "no_room_for_the_request_line",
        "minirt/server/connections.py",
        "REQUEST_LINE_ROOM = 8 * 1024",
        "REQUEST_LINE_ROOM = 0",
        "headers within HostRule's limit, sent in pieces, are refused for their request line",
    ),
    Mutant(
        "silent_connection_never_times_out",
        "minirt/server/connections.py",
        "        super().connection_made(transport)\n        self.head_deadline = self.loop.call_later(self.timeout_s, self.head_too_slow)\n",
        "        super().connection_made(transport)\n",
        "a connection that sends nothing stays open for ever",
    ),
    Mutant(
        "each_byte_restarts_the_head_deadline",
        "minirt/server/connections.py",
        "            self.head_begun = True\n            if self.head_deadline is None:\n",
        "            self.head_begun = True\n            self.cancel_head_deadline()\n            if True:\n",
        "a head sent a byte at a time is never late (slowloris)",
    ),
    Mutant(
        "late_head_closed_without_a_408",
        "minirt/server/connections.py",
        "        if self.head_begun:",
        "        if False:",
        "a client whose head stalled is cut off without being told why",
    ),
    Mutant(
        "stalled_body_never_times_out",
        "minirt/server/connections.py",
        "        self.body_deadline = self.loop.call_later(self.timeout_s, self.body_too_slow)\n        # uvicorn",
        "        # uvicorn",
        "a connection that stops in its body holds its request (and its slot) for ever",
    ),
    Mutant(
        "body_pause_counted_from_the_head",
        "minirt/server/connections.py",
        "        if self.body_expected:\n            self.body_last_arrival = self.loop.time()\n",
        "",
        "a body sent steadily in pieces is cut off as if it had stalled",
    ),
    Mutant(
        "head_deadline_runs_during_the_answer",
        "minirt/server/connections.py",
        "        self.awaiting_head = True\n        self.messages_completed += 1\n",
        "        self.awaiting_head = True\n        self.messages_completed += 1\n"
        "        if self.head_deadline is None:\n"
        "            self.head_deadline = self.loop.call_later(self.timeout_s, self.head_too_slow)\n",
        "an answer longer than the head's deadline ends its keep-alive connection",
    ),
    Mutant(
        "connection_limit_one_short",
        "minirt/server/connections.py",
        "            len(self.connections) > self.max_connections",
        "            len(self.connections) >= self.max_connections",
        "the last connection the limit allows gets a 503 (uvicorn's own off-by-one)",
    ),
    Mutant(
        "connection_limit_ignored",
        "minirt/server/connections.py",
        "            self.app = TooManyConnections(self.max_connections)",
        "            pass",
        "connections past the limit are answered",
    ),
    Mutant(
        "prompt_length_bound_one_short",
        "minirt/request_maker.py",
        "room = max(0, self.n_positions - tokenizer.special_tokens_added()) * most",
        "room = max(0, self.n_positions - tokenizer.special_tokens_added() - 1) * most",
        "a text that could just fit the context is refused unread",
    ),
    Mutant(
        "watchers_one_past_the_cap",
        "minirt/server/round_feed.py",
        "            elif len(self.watchers) >= MAX_WATCHERS:",
        "            elif len(self.watchers) > MAX_WATCHERS:",
        "33 pages watch the rounds, one past the documented cap",
    ),
    Mutant(
        "idle_feed_silent",
        "minirt/server/rounds_page.py",
        "                        yield HEARTBEAT\n",
        "                        pass\n",
        "an idle round feed writes nothing: a proxy drops it, a page that left is never let go",
    ),
    Mutant(
        "head_of_the_feed_streams",
        "minirt/server/rounds_page.py",
        '        if request.method == "HEAD":',
        '        if request.method == "HEAD" and False:',
        "HEAD /rounds/events never ends, and its keep-alive connection hangs",
    ),
    Mutant(
        "cancellations_logged",
        "minirt/server/run.py",
        "        if isinstance(error, asyncio.CancelledError):\n            return False",
        "        if isinstance(error, asyncio.CancelledError):\n            return True",
        "a second Ctrl-C fills the log with a CancelledError traceback per stream",
    ),
    Mutant(
        "lookups_counted_without_a_cache",
        "minirt/engine/client.py",
        "looked_up = request.prompt_len if self.engine.prefix_cache is not None else 0",
        "looked_up = request.prompt_len",
        "/metrics counts prefix-cache lookups on a server that has no prefix cache",
    ),
    Mutant(
        "failed_stream_leaves_the_rest_unreported",
        "minirt/server/completion_flow.py",
        "        self.handover.abort(completion.id)\n        async for final in self.rest_of(",
        "        self.handover.abort(completion.id)\n        yield DONE\n        return\n        async for final in self.rest_of(",
        "when one choice of a stream fails, the stream ends: the others get neither a finish_reason nor an error",
    ),
    Mutant(
        "cut_report_says_so",
        "minirt/cli/command.py",
        "        if not quiet_when_cut:",
        "        if True:",
        "minirt rounds | head says 'standard output was closed', where GNU tools are quiet",
    ),
    # The suite's blind spots (#38): a stream's bytes, a gauge's value, a queue exactly full, a
    # whole completion cut by a shutdown.
    Mutant(
        "event_ended_by_one_newline",
        "minirt/server/responses.py",
        "separators=(',', ':'))}\\n\\n\"",
        "separators=(',', ':'))}\\n\"",
        "each server-sent event ends with one newline: a client reads the whole stream as one event",
    ),
    Mutant(
        "queue_exactly_full_refused",
        "minirt/engine/client.py",
        "        if waiting + count > self.max_queue:",
        "        if waiting + count >= self.max_queue:",
        "a completion that fills the queue exactly is a 503: with every row busy and nobody waiting, a queue of one takes nobody",
    ),
    Mutant(
        "kv_usage_counts_the_last_token",
        "minirt/engine/scheduler.py",
        "        wanted = prompt_len + request.params.max_tokens - 1\n",
        "        wanted = prompt_len + request.params.max_tokens\n",
        "each request reserves one KV position more than it writes: the budget holds fewer",
    ),
    Mutant(
        "cut_whole_completion_a_500",
        "minirt/server/completion_flow.py",
        'return APIError(503, f"choice {final.choice}: {message}", code="aborted")',
        'return APIError(500, f"choice {final.choice}: {message}", code="aborted")',
        "a whole completion cut by the shutdown is a 500, as if the server had failed",
    ),
    Mutant(
        "rebinding_let_through",
        "minirt/server/app.py",
        "SameOriginGuard(APIKeyGuard(app, settings.api_key), settings.loopback_only)",
        "SameOriginGuard(APIKeyGuard(app, settings.api_key))",
        "a page that points its own name at 127.0.0.1 (DNS rebinding) uses the keyless API",
    ),
    Mutant(
        "same_site_fetch_let_through",
        "minirt/server/origin.py",
        'FROM_ANOTHER_SITE = (b"cross-site", b"same-site")',
        'FROM_ANOTHER_SITE = (b"cross-site",)',
        "a page on another port of this machine reads the round feed through an <img> or a GET",
    ),
    Mutant(
        "page_framed_anywhere",
        "minirt/server/rounds_page.py",
        "return HTMLResponse(self.html, headers=NOT_IN_A_FRAME)",
        "return HTMLResponse(self.html)",
        "any site shows the round-grid page in a frame, and the operator's clicks pass as its own",
    ),
    Mutant(
        "error_quotes_everything",
        "minirt/server/api_errors.py",
        '"message": cut(message, MAX_MESSAGE_CHARS),',
        '"message": message,',
        "a 2 MiB model name is sent back whole in the error",
    ),
    Mutant(
        "surrogate_escape_of_high_halves_only",
        "minirt/server/protocol.py",
        'rb"\\\\u[dD][89a-fA-F]"',
        'rb"\\\\u[dD][89abAB]"',
        "a lone low surrogate (\\udc00-\\udfff) is not looked for, and reaches the engine",
    ),
    Mutant(
        "lists_checked_item_by_item_first",
        "minirt/server/protocol.py",
        "    if limits is not None:\n        model_class.refuse_by_count(body, limits)",
        "    if limits is None:\n        model_class.refuse_by_count(body, limits)",
        "half a million prompts are each checked by pydantic, on the event loop, before their count refuses them",
    ),
    Mutant(
        "ids_bound_one_short",
        "minirt/server/protocol.py",
        "            if len(ids) > limits.most_ids:",
        "            if len(ids) >= limits.most_ids:",
        "a prompt of ids that fills the context exactly is refused",
    ),
    Mutant(
        "detokenize_bound_one_short",
        "minirt/server/protocol.py",
        "if isinstance(tokens, list) and len(tokens) > limits.most_ids:",
        "if isinstance(tokens, list) and len(tokens) >= limits.most_ids:",
        "/detokenize refuses the context's own number of ids",
    ),
    Mutant(
        "tokenize_encodes_any_length",
        "minirt/server/app.py",
        "            self.llm.request_maker.refuse_too_long_to_encode(body.prompt)\n",
        "",
        "/tokenize encodes 2 MB of text (seconds of a thread) that no context could hold",
    ),
    # ---- the kinds of test an outside review found missing (#38)
    Mutant(
        "pool_edge_held_one_row_short",
        "minirt/engine/scheduler.py",
        "        rows_in_budget = max(1, self.kv_budget // capacity)\n",
        "        rows_in_budget = max(1, (self.kv_budget - 1) // capacity)\n",
        "a pool that would grow to exactly the KV budget grows one row short: a request waits for nothing",
    ),
    Mutant(
        "prefix_blocks_alias_the_slot",
        "minirt/model/kv_cache.py",
        "        keys = self.keys[:, slot, :, start:end].copy()  # [n_layer, H, end - start, D]\n"
        "        values = self.values[:, slot, :, start:end].copy()  # [n_layer, H, end - start, D]\n",
        "        keys = self.keys[:, slot, :, start:end]  # [n_layer, H, end - start, D]\n"
        "        values = self.values[:, slot, :, start:end]  # [n_layer, H, end - start, D]\n",
        "cached blocks are views of the slot they came from: its next occupant overwrites them",
    ),
    Mutant(
        "pool_copy_forgets_written",
        "minirt/model/kv_cache.py",
        "        self.written[:rows] = smaller.written  # [rows]\n",
        "",
        "a slot freed before the pool grew is taken as never written: its next occupant meets what was left",
    ),
    Mutant(
        "request_stream_not_pcg64",
        "minirt/engine/sampler.py",
        "return np.random.Generator(np.random.PCG64(seed))",
        "return np.random.Generator(np.random.PCG64DXSM(seed))",
        "a seed gives another stream than numpy's PCG64 of it: every seeded output changes",
    ),
    Mutant(
        "changes_logits_forgets_presence",
        "minirt/engine/params.py",
        "            or bool(self.presence_penalty)\n",
        "",
        "a presence penalty set alone changes nothing (it only works beside another control)",
    ),
    Mutant(
        "logits_at_permutation_not_gathered",
        "minirt/model/decoder.py",
        "            elif at.size != batch.n_tokens or not np.array_equal(at, np.arange(batch.n_tokens)):",
        "            elif at.size != batch.n_tokens:",
        "logits_at naming every token in another order comes back in packed order",
    ),
    Mutant(
        "server_top_k_minus_1_refused",
        "minirt/server/protocol.py",
        '"top_k": 0 if body.top_k in (None, -1) else body.top_k,',
        '"top_k": 0 if body.top_k is None else body.top_k,',
        "vLLM's top_k -1 (no top-k) is a 400",
    ),
    Mutant(
        "special_tokens_skipped_when_not_byte_level",
        "minirt/loading/tokenizer.py",
        "            return self.hf.decode(list(token_ids), skip_special_tokens=False)",
        "            return self.hf.decode(list(token_ids), skip_special_tokens=True)",
        "a tokenizer that is not byte-level drops its special tokens' text from prompts and completions",
    ),
    Mutant(
        "kv_budget_mib_truncated_to_whole",
        "minirt/engine/engine.py",
        "            return int(kv_budget_mib * 2**20) // self.kv_bytes_per_position",
        "            return int(kv_budget_mib) * 2**20 // self.kv_bytes_per_position",
        "a KV budget of a fraction of a MiB holds no position: every request is refused",
    ),
    Mutant(
        "dropped_watcher_keeps_its_place",
        "minirt/server/round_feed.py",
        "            self.watchers = [watcher for watcher in self.watchers if not watcher.dropped]\n",
        "",
        "pages that stopped reading hold the 32 places of the round feed for as long as their writes stall",
    ),
    # ---- what logprobs cost the engine's thread (issue 38): top k without a full sort, one
    # log-softmax a row, prompt logprobs a block at a time and once for a prompt's n choices
    Mutant(
        "most_likely_drops_boundary_ties",
        "minirt/engine/sampler.py",
        "candidates = np.flatnonzero(values >= nth_largest)",
        "candidates = np.flatnonzero(values > nth_largest)",
        "the n-th most likely token (and its ties) is missing from top_logprobs",
    ),
    Mutant(
        "most_likely_ties_by_highest_id",
        "minirt/engine/sampler.py",
        "np.flatnonzero(values >= nth_largest)  # [C >= n]",
        "np.flatnonzero(values >= nth_largest)[::-1]  # [C >= n]",
        "equal logprobs listed highest id first, unlike the full stable sort",
    ),
    Mutant(
        "most_likely_partition_off_by_one",
        "minirt/engine/sampler.py",
        "np.partition(values, values.size - n)[values.size - n]",
        "np.partition(values, values.size - n + 1)[values.size - n + 1]",
        "the threshold is the (n-1)-th largest: one token short",
    ),
    Mutant(
        "most_likely_keeps_every_tie",
        "minirt/engine/sampler.py",
        'candidates[np.argsort(-values[candidates], kind="stable")[:n]]  # [n]',
        'candidates[np.argsort(-values[candidates], kind="stable")]  # [n]',
        "top_logprobs lists more than n tokens when the n-th ties",
    ),
    Mutant(
        "top_logprobs_second_log_softmax",
        "minirt/engine/sampler.py",
        "top = top_logprobs(row, r.params.logprobs, raw)",
        "top = top_logprobs(row, r.params.logprobs)",
        "a row with top logprobs computes its log-softmax twice",
    ),
    Mutant(
        "prompt_blocks_lose_the_last",
        "minirt/engine/sampler.py",
        "for start in range(0, targets.size, PROMPT_ROWS_AT_ONCE):",
        "for start in range(0, targets.size - 1, PROMPT_ROWS_AT_ONCE):",
        "the last prompt token's logprob is lost when the last block holds it alone",
    ),
    Mutant(
        "prompt_block_rows_shifted",
        "minirt/engine/sampler.py",
        "log_softmax(prompt_logits[start : start + block_targets.size])",
        "log_softmax(prompt_logits[start + 1 : start + 1 + block_targets.size])",
        "each prompt token's logprob is read at the position after the one that predicts it",
    ),
    Mutant(
        "prompt_blocks_unbounded",
        "minirt/engine/sampler.py",
        "PROMPT_ROWS_AT_ONCE = 64",
        "PROMPT_ROWS_AT_ONCE = 2**20",
        "a long prompt's log-softmax is held as [L, V] float64 again",
    ),
    Mutant(
        "shared_prompt_key_drops_last_token",
        "minirt/engine/engine.py",
        "self.scored_prompts.setdefault(tuple(request.prompt_ids), ScoredPrompt())",
        "self.scored_prompts.setdefault(tuple(request.prompt_ids[:-1]), ScoredPrompt())",
        "prompts that differ in their last token share one's logprobs",
    ),
    Mutant(
        "shared_prompt_never_found",
        "minirt/engine/engine.py",
        "scored = self.scored_prompts.get(tuple(request.prompt_ids)) or self.hold_prompt(request)",
        "scored = ScoredPrompt([request])",
        "a prompt's n choices are each scored again",
    ),
    Mutant(
        "scored_prompt_keeps_the_finished",
        "minirt/engine/engine.py",
        "scored.holders = [r for r in scored.holders if not r.finished]",
        "scored.holders = [r for r in scored.holders if r.finished]",
        "a shared prompt record is kept by its finished requests and dropped while others run",
    ),
    Mutant(
        "scored_prompts_kept_after_the_round",
        "minirt/engine/engine.py",
        "        output.finished += finished\n        self.drop_scored_prompts()\n",
        "        output.finished += finished\n",
        "a prompt's record outlives its last request until some later step",
    ),
    Mutant(
        "waiting_choices_not_held",
        "minirt/engine/engine.py",
        "            if request.params.prompt_logprobs is not None:\n                self.hold_prompt(request)\n",
        "",
        "choices that wait for a later static group are scored again",
    ),
    Mutant(
        "scored_prompt_never_marked_scored",
        "minirt/engine/engine.py",
        "            scored.scored = True\n",
        "",
        "every request of a prompt gets a scoring pass of its own",
    ),
    # vLLM's API (#39): SamplingParams' names and defaults, the prompt forms, RequestOutput's shape.
    Mutant(
        "max_new_tokens_alias_ignored",
        "minirt/engine/params.py",
        '                kwargs["max_tokens"] = max_new_tokens\n',
        "",
        "SamplingParams(max_new_tokens=5) runs to the default 16",
    ),
    Mutant(
        "max_tokens_alias_conflict_by_equality",
        "minirt/engine/params.py",
        "if given is not None and not (is_int(given) and given == max_new_tokens):",
        "if given is not None and given != max_new_tokens:",
        "max_tokens=16.0 (or True) beside max_new_tokens=16 (or 1) is taken, the float dropped",
    ),
    Mutant(
        "generation_config_repetition_penalty_ignored",
        "minirt/llm.py",
        '    "min_p",\n    "repetition_penalty",\n',
        '    "min_p",\n',
        "a model's generation_config.json repetition_penalty is dropped (transformers applies it)",
    ),
    Mutant(
        "prompt_dict_text_taken_as_ids",
        "minirt/llm.py",
        '    if key == "prompt" and not isinstance(value, str):',
        "    if False:",
        '{"prompt": [1, 2]} is served as token ids',
    ),
    Mutant(
        "cumulative_logprob_of_nothing_is_zero",
        "minirt/engine/output.py",
        "            if request.logprobs:\n                cumulative",
        "            if True:\n                cumulative",
        "a request refused before its first token reports a cumulative logprob of 0 (probability 1)",
    ),
    Mutant(
        "top_k_minus_one_kept",
        "minirt/engine/params.py",
        '            object.__setattr__(self, "top_k", 0)\n',
        "",
        "vLLM's top_k=-1 (no limit) is refused",
    ),
    Mutant(
        "temperature_default_greedy",
        "minirt/engine/params.py",
        "    temperature: float = 1.0\n",
        "    temperature: float = 0.0\n",
        "SamplingParams() is greedy, not vLLM's temperature 1",
    ),
    Mutant(
        "prompt_logprobs_zero_is_off",
        "minirt/engine/engine.py",
        "            if request.params.prompt_logprobs is not None:\n                self.hold_prompt",
        "            if request.params.prompt_logprobs:\n                self.hold_prompt",
        "prompt_logprobs=0 (vLLM's ask for them) scores nothing",
    ),
    Mutant(
        "rank_counts_only_the_more_likely",
        "minirt/engine/sampler.py",
        "np.count_nonzero(raw_logprobs >= raw_logprobs[token])",
        "np.count_nonzero(raw_logprobs > raw_logprobs[token])",
        "the most likely token has rank 0",
    ),
    Mutant(
        "cumulative_logprob_skips_the_first",
        "minirt/engine/output.py",
        "cumulative = math.fsum(request.logprobs)",
        "cumulative = math.fsum(request.logprobs[1:])",
        "the cumulative logprob leaves out the first token",
    ),
    Mutant(
        "chosen_token_after_its_alternatives",
        "minirt/engine/output.py",
        "        entry = {token: Logprob(request.logprobs[step], request.logprob_ranks[step], None)}\n",
        "        entry = {}\n",
        "a chosen token outside the top N is missing from its step's logprobs",
    ),
    Mutant(
        "prompt_dict_of_both_keys_taken",
        "minirt/llm.py",
        "    if len(keys) != 1 or not keys <= set(PROMPT_KEYS):",
        "    if not keys <= set(PROMPT_KEYS) or not keys:",
        "a prompt dict of both text and ids is served as one of them",
    ),
    Mutant(
        "on_final_before_every_sample",
        "minirt/llm.py",
        "                    if all(r.finished for r in prompt_samples):",
        "                    if any(r.finished for r in prompt_samples):",
        "on_final hears a prompt when its first sample is final",
    ),
    Mutant(
        "on_final_heard_again",
        "minirt/llm.py",
        "                        reported.add(request.index)\n",
        "",
        "on_final hears a prompt once per sample",
    ),
    Mutant(
        "outputs_not_in_sample_order",
        "minirt/llm.py",
        "        samples: dict[int, list[Request]] = {}\n        for request in requests:",
        "        samples: dict[int, list[Request]] = {}\n        for request in reversed(requests):",
        "a prompt's completions come last sample first, and prompts in reverse",
    ),
    Mutant(
        "generation_config_max_new_tokens_ignored",
        "minirt/llm.py",
        '    "repetition_penalty",\n    "max_new_tokens",\n)',
        '    "repetition_penalty",\n)',
        "a model's generation_config.json max_new_tokens is not its default length",
    ),
    Mutant(
        "max_tokens_flag_alias_lost",
        "minirt/cli/sampling_flags.py",
        '        "--max-tokens",\n        "--max-new-tokens",\n',
        '        "--max-tokens",\n',
        "--max-new-tokens, the flag every earlier command used, is refused",
    ),
    Mutant(
        "jsonl_max_new_tokens_unknown",
        "minirt/cli/prompt_file.py",
        "    known = set(FIELD_NAMES) | {MAX_TOKENS_ALIAS}\n",
        "    known = set(FIELD_NAMES)\n",
        'a JSONL line\'s "max_new_tokens" fails its line as an unknown field',
    ),
    # ---- exact batch invariance (#40)
    Mutant(
        "exact_last_call_at_the_tallest_height",
        "minirt/model/invariant.py",
        "            cuts.append((first, self.heights[-1]))",
        "            cuts.append((first, self.heights[0]))",
        "the padded last call of a weight product is 2048 rows tall: 8 decode rows cost a prefill",
    ),
    Mutant(
        "exact_probe_asks_the_head_every_height",
        "minirt/model/invariant.py",
        "        if height > most_rows and height != shortest:\n            continue\n",
        "",
        "the probe calls the head with 2048 rows: seconds more at every load",
    ),
    Mutant(
        "exact_block_mask_hides_the_diagonal",
        "minirt/model/invariant.py",
        "(key_positions[None, :] <= query_positions[:, None])",
        "(key_positions[None, :] < query_positions[:, None])",
        "in exact mode a prompt's query does not see its own key: consistent, and wrong",
    ),
    Mutant(
        "exact_block_keys_end_at_the_chunk",
        "minirt/model/invariant.py",
        "        n_keys = block_start + QUERY_BLOCK\n",
        "        n_keys = min(block_start + QUERY_BLOCK, end_position)\n",
        "a prompt block's keys end where the round's chunk ends, so chunking changes the call",
    ),
    Mutant(
        "exact_decode_rows_stacked_on_a_gpu",
        "minirt/model/invariant.py",
        "groups = [rows] if xp is np else [[row] for row in rows]",
        "groups = [rows]",
        "on a GPU, decode rows of one length share a batched call whose algorithm the batch picks",
    ),
    Mutant(
        "exact_layer_norm_untiled",
        "minirt/model/gpt2.py",
        "    normed = layer_norm(xp, chains, x, block.ln_1, eps, tiles)  # [N, C]",
        "    normed = layer_norm(xp, chains, x, block.ln_1, eps)  # [N, C]",
        "layer norm's sums over the whole round's rows: a GPU's reduction picks its layout by N",
    ),
    Mutant(
        "exact_head_untiled",
        "minirt/model/decoder.py",
        "            return lm_head(self.xp, x, self.head_weight, self.head_tiles)  # [M, V] fp32",
        "            return lm_head(self.xp, x, self.head_weight)  # [M, V] fp32",
        "in exact mode the head is one call of the round's rows: a GEMV alone, a GEMM batched",
    ),
    Mutant(
        "exact_flag_not_passed_to_the_llm",
        "minirt/cli/serving_flags.py",
        "        batch_invariant=args.batch_invariant,\n",
        "",
        "--batch-invariant is accepted and ignored",
    ),
    Mutant(
        "exact_mlp_tile_not_a_height",
        "minirt/model/layers.py",
        "        rows = tiles.tallest_within(rows)\n",
        "        pass\n",
        "in exact mode an MLP tile of 682 rows is cut into 8 calls: prefill 20% slower",
    ),
    Mutant(
        "exact_decoding_rows_not_flagged",
        "minirt/engine/runner.py",
        "        decoding = [r not in plan.prefill_to for r in active]",
        "        decoding = [False for r in active]",
        "generated tokens go through prompt blocks of 64 queries: exact decode far slower",
    ),
    Mutant(
        "exact_flag_dropped_on_ray",
        "minirt/distributed/serve_on_ray.py",
        '        "batch_invariant": args.batch_invariant,\n',
        "",
        "generate --ray --batch-invariant: the workers run the default mode",
    ),
    # ---- chat (#41): the template, its encoding, the chat route's stream
    Mutant(
        "chat_prompt_gets_a_second_bos",
        "minirt/llm.py",
        "return self.tokenizer.encode(text, add_special_tokens=False)",
        "return self.tokenizer.encode(text)",
        "a rendered conversation is encoded with the tokenizer's BOS in front of the template's own",
    ),
    Mutant(
        "chat_tojson_escapes_non_ascii",
        "minirt/chat_template.py",
        "value, ensure_ascii=ensure_ascii, indent=indent",
        "value, ensure_ascii=True, indent=indent",
        "tojson writes é as \\u00e9, not as transformers does",
    ),
    Mutant(
        "chat_jinja_file_ignored",
        "minirt/chat_template.py",
        "if jinja_path.exists() or broken_link(jinja_path):",
        "if False:",
        "chat_template.jinja (how transformers saves a template now) is never read",
    ),
    Mutant(
        "chat_parts_listed_for_every_template",
        "minirt/chat_template.py",
        '    if content_format == "openai":\n        return [{"type": "text", "text": text}',
        '    if True:\n        return [{"type": "text", "text": text}',
        "text parts reach a template that reads a string as a list (Llama 3's prints its repr)",
    ),
    Mutant(
        "chat_parts_joined_without_newlines",
        "minirt/chat_template.py",
        '    return "\\n".join(texts)',
        '    return "".join(texts)',
        "a string template gets the parts run together, not joined with \\n as vLLM joins them",
    ),
    Mutant(
        "chat_content_loops_not_detected",
        "minirt/chat_template.py",
        "            if isinstance(node, self.nodes.For) and self.is_content(node.iter):",
        "            if False:",
        "a template that loops over a message's parts is taken for one that reads a string",
    ),
    Mutant(
        "chat_content_format_override_ignored",
        "minirt/chat_template.py",
        "            chosen.content_format = content_format",
        "            chosen.content_format = self.detected_format",
        "--chat-template-content-format and chat_template_content_format= change nothing",
    ),
    Mutant(
        "chat_stream_opens_without_the_role",
        "minirt/server/chat_responses.py",
        'opening = self.choice(index, {"role": "assistant", "content": ""})',
        'opening = self.choice(index, {"content": ""})',
        "a streamed chat answer never says its role is the assistant's",
    ),
    # ---------------------------------------------------------------- the Llama family (#41)
    Mutant(
        "rope_turns_by_the_padded_column",
        "minirt/model/llama.py",
        "rotary = rotary_tables(xp, self.frequencies, device.positions, self.dtype)",
        "rotary = rotary_tables(xp, self.frequencies, device.cols, self.dtype)",
        "a token is rotated by its column in the padded batch, not its position: history lost",
    ),
    Mutant(
        "rope_llama3_scaling_ignored",
        "minirt/model/rope.py",
        '    if settings.rope_type == "llama3":',
        "    if False:",
        "Llama 3.1/3.2's rescaled frequencies are computed as the plain ones",
    ),
    Mutant(
        "rope_linear_scaling_ignored",
        "minirt/model/rope.py",
        "        return (frequencies / np.float32(settings.factor)).astype(np.float32)",
        "        return frequencies",
        "rope_type linear's factor is read and never applied",
    ),
    Mutant(
        "rope_pairs_adjacent_features",
        "minirt/model/rope.py",
        "    swapped = xp.roll(x, x.shape[-1] // 2, axis=-1)",
        "    swapped = xp.roll(x, 1, axis=-1)",
        "features paired (i, i + 1), Meta's layout, not Hugging Face's (i, i + D/2)",
    ),
    Mutant(
        "rope_sine_sign_flipped",
        "minirt/model/rope.py",
        "    signed_sin = xp.concatenate([-sin, sin], axis=-1)  # [N, D]",
        "    signed_sin = xp.concatenate([sin, -sin], axis=-1)  # [N, D]",
        "queries and keys turned the other way",
    ),
    Mutant(
        "rope_theta_of_transformers_4_ignored",
        "minirt/model/llama_config.py",
        '        parameters = {"rope_theta": raw["rope_theta"], **parameters}',
        "        pass",
        "a hub config's top-level rope_theta (Llama 3's 500000) falls back to 10000",
    ),
    Mutant(
        "rope_power_in_float32",
        "minirt/model/rope.py",
        "    powers = (np.float64(settings.theta) ** exponents.astype(np.float64)).astype(np.float32)",
        "    powers = np.float32(settings.theta) ** exponents",
        "NumPy's float32 pow: a frequency a unit off, cos 3e-3 off by position 32767 (SmolLM2)",
    ),
    Mutant(
        "family_defaults_ignored",
        "minirt/model/llama_config.py",
        "        raw = {**FAMILY_DEFAULTS[model_type], **raw}",
        "        pass",
        "a Qwen3 config.json without head_dim (transformers' 128) is refused as a misfit",
    ),
    Mutant(
        "any_role_refused_but_openais",
        "minirt/chat_template.py",
        "    if not role:",
        "    if role not in ROLES:",
        "Llama 3.1's ipython messages are refused before its template sees them",
    ),
    Mutant(
        "qwen3_norms_skipped",
        "minirt/model/llama.py",
        "    if attn.q_norm is not None:",
        "    if False:",
        "Qwen3's per-head query and key norms are loaded and never applied",
    ),
    Mutant(
        "qwen3_keys_normed_with_the_query_scale",
        "minirt/model/llama.py",
        "k = rms_norm(xp, chains, k, attn.k_norm, config.rms_norm_eps, tiles)",
        "k = rms_norm(xp, chains, k, attn.q_norm, config.rms_norm_eps, tiles)",
        "the keys' norm scale is the queries'",
    ),
    Mutant(
        "gate_and_up_swapped",
        "minirt/model/llama.py",
        'gate_up=self.side_by_side([f"{mlp}gate_proj", f"{mlp}up_proj"]),',
        'gate_up=self.side_by_side([f"{mlp}up_proj", f"{mlp}gate_proj"]),',
        "SiLU is applied to the up projection and the gate multiplies it",
    ),
    Mutant(
        "silu_without_its_sigmoid",
        "minirt/model/fusion.py",
        "    return gate * (1.0 / (1.0 + xp.exp(-gate))) * up  # [N, I]",
        "    return gate * up  # [N, I]",
        "SwiGLU without its nonlinearity",
    ),
    Mutant(
        "rms_norm_centres_like_layer_norm",
        "minirt/model/layers.py",
        "    square_total = xp.square(x32).sum(axis=-1, keepdims=True)  # [N, ..., 1]",
        "    square_total = xp.square(x32 - x32.mean(axis=-1, keepdims=True)).sum(axis=-1, "
        "keepdims=True)",
        "RMSNorm divides by the standard deviation, not the root mean square",
    ),
    Mutant(
        "qwen2_bias_not_expected",
        "minirt/model/llama_config.py",
        '        "qkv_bias": attention_bias or model_type == "qwen2",',
        '        "qkv_bias": attention_bias,',
        "Qwen2's Q/K/V biases are taken for unexpected tensors",
    ),
    Mutant(
        "sliding_window_ignored",
        "minirt/model/llama_config.py",
        "    return context if window is None else min(context, window)",
        "    return context",
        "Mistral 7B v0.1 takes requests past its 4096-token window and attends past it",
    ),
    Mutant(
        "llama2_rotary_buffers_not_skipped",
        "minirt/loading/checkpoint.py",
        '".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")',
        '".attn.bias", ".attn.masked_bias")',
        "an old Llama 2 checkpoint's inv_freq buffers refuse it as unexpected tensors",
    ),
    Mutant(
        "tied_llama_embeds_from_the_wrong_axis",
        "minirt/model/llama.py",
        "        return self.head_weight[:, token_ids].T.astype(self.dtype)  # [N, C]",
        "        return self.head_weight[token_ids % self.head_weight.shape[0]].astype(self.dtype)",
        "a tied model's embedding gathered as rows of the [C, V] head",
    ),
    Mutant(
        "llama_family_prefix_kept",
        "minirt/model/registry.py",
        '            prefix="model.",',
        '            prefix="transformer.",',
        "a Llama checkpoint's names keep their model. prefix: every tensor unexpected",
    ),
    # ---- a completion's text after its prompt, token strings and bytes, echo's offsets (#41)
    Mutant(
        "stream_not_seeded_with_the_prompt",
        "minirt/engine/engine.py",
        "request.decoder = self.detokenizer.stream(request.prompt_ids)",
        "request.decoder = self.detokenizer.stream()",
        "a SentencePiece completion's first piece loses its space: 'it it', not vLLM's ' it it'",
    ),
    Mutant(
        "prompt_tail_cuts_a_byte_run",
        "minirt/loading/tokenizer.py",
        "    while start > 0 and tokenizer.text_may_change(prompt_ids[start - 1]):",
        "    while False:",
        "a prompt ending in a long run of byte pieces is cut inside it: its bytes, and the "
        "completion's that continue it, read as U+FFFD",
    ),
    Mutant(
        "prompt_tail_without_text_kept",
        "minirt/loading/tokenizer.py",
        "    if start > 0 and not tokenizer.decode(tail):",
        "    if False:",
        "a prompt ending in ids without text: the completion's first space is stripped",
    ),
    Mutant(
        "piece_marker_not_a_space",
        "minirt/loading/tokenizer.py",
        '                table[token_id] = token.replace(marker, " ").encode("utf-8")',
        '                table[token_id] = token.encode("utf-8")',
        "a SentencePiece token's string and bytes keep '▁' instead of a space",
    ),
    Mutant(
        "byte_piece_bytes_as_its_name",
        "minirt/loading/tokenizer.py",
        "                table[token_id] = bytes([int(token[3:5], 16)])",
        '                table[token_id] = token.encode("utf-8")',
        "a byte piece <0xE2> reports the bytes of its name, not the byte 0xE2",
    ),
    Mutant(
        "token_strings_decoded_alone",
        "minirt/loading/tokenizer.py",
        "        if self._token_bytes is None and self._piece_bytes is None:",
        "        if self._token_bytes is None:",
        "a SentencePiece token's logprobs string is decoded alone: ' it' shows as 'it'",
    ),
    Mutant(
        "chat_token_decoded_alone",
        "minirt/server/chat_responses.py",
        '        "token": tokenizer.token_string(token_id),',
        '        "token": tokenizer.decode([token_id]),',
        "chat's logprobs give a SentencePiece token without its leading space",
    ),
    Mutant(
        "echo_offsets_count_the_bos",
        "minirt/server/responses.py",
        "            self.text_offset[first:] = [to_sent(o) for o in self.text_offset[first:]]\n",
        "",
        "echo's prompt offsets count a BOS's string that the echoed text does not hold",
    ),
    Mutant(
        "offset_before_held_bytes",
        "minirt/server/responses.py",
        "                start += len(new_text) - len(token_text)",
        "                pass",
        "a token after a character's held-back byte pieces is placed where that character starts",
    ),
    Mutant(
        "streamed_offsets_without_a_stand_in_prompt",
        "minirt/server/responses.py",
        "        prompt_ids = () if bos is None else (bos,)",
        "        prompt_ids = ()",
        "a streamed SentencePiece choice's offsets lose its first piece's space: one short after",
    ),
    Mutant(
        "completion_offsets_not_after_the_prompt",
        "minirt/server/responses.py",
        "        self.decoder = completion_decoder(self.tokenizer, prompt_ids)\n        self.offset",
        "        self.decoder = self.tokenizer.stream() if self.tokenizer else None\n"
        "        self.offset",
        "with echo, the completion's first piece is decoded as a text's start: its space is lost",
    ),
    Mutant(
        "offsets_past_the_cut_text",
        "minirt/server/responses.py",
        '        logprobs["text_offset"] = [min(o, len(text)) for o in logprobs["text_offset"]]\n',
        "",
        "a token past a stop string is given an offset past the end of the text",
    ),
    # ---- replicas on Ray Serve (#42)
    Mutant(
        "prefix_router_margin_inclusive",
        "minirt/distributed/prefix_router.py",
        "                if self.load(replica_id) - least > self.imbalance:",
        "                if self.load(replica_id) - least >= self.imbalance:",
        "a prefix's replica exactly at the margin is given up (the margin is 'more than')",
    ),
    Mutant(
        "prefix_router_never_counts_completions",
        "minirt/distributed/prefix_router.py",
        "            in_flight.discard(internal_request_id)\n            return\n",
        "            return\n",
        "finished requests stay counted in flight: a busy-once replica loses its prefixes",
    ),
    Mutant(
        "block_keys_include_the_last_token",
        "minirt/engine/prefix_cache.py",
        "    for index in range((len(prompt_ids) - 1) // block_tokens):\n        start",
        "    for index in range(len(prompt_ids) // block_tokens):\n        start",
        "a prompt is routed by a block the prefix cache can never use",
    ),
    Mutant(
        "replica_series_for_every_counter",
        "minirt/server/metrics.py",
        '                if sample_name not in (family.name, family.name + "_total"):',
        '                if not sample_name.startswith(family.name.split("_")[0]):',
        "each replica's figures land in families that are not theirs",
    ),
    Mutant(
        "dead_replica_choices_left_open",
        "minirt/distributed/replica_client.py",
        "                        relay.close_open(replica_lost(exc), self.observer)\n",
        "                        pass\n",
        "a stream whose replica died is never told: it hangs",
    ),
    Mutant(
        "observer_snapshot_taken_after_calls",
        "minirt/distributed/engine_replica.py",
        "        snapshot = self.latest\n        with self.lock:\n"
        "            calls = tuple(self.calls)\n            self.calls = []\n",
        "        with self.lock:\n            calls = tuple(self.calls)\n            self.calls = []\n"
        "        snapshot = self.latest\n",
        "a report's snapshot can be newer than its calls (gauges at 0 before the aborts count)",
    ),
    Mutant(
        "ctrl_c_in_an_imports_callback_ignored",
        "minirt/__main__.py",
        "    if signals:\n        return None\n    return module\n",
        "    return module\n",
        "Ctrl-C that Python could only report as 'Exception ignored' lets the command run on",
    ),
    Mutant(
        "prefix_router_counts_early_completions",
        "minirt/distributed/prefix_router.py",
        "        if request_id in self.completed_early:\n",
        "        if False:\n",
        "a request completed before it was routed counts as in flight for ever: affinity lost",
    ),
    Mutant(
        "fleet_refusal_one_short",
        "minirt/distributed/replica_client.py",
        "        if in_flight + count <= self.fleet_rows + self.fleet_queue:\n",
        "        if in_flight + count < self.fleet_rows + self.fleet_queue:\n",
        "a fleet exactly full refuses its last request (503 one early)",
    ),
    Mutant(
        "fleet_refusal_counts_rows_only",
        "minirt/distributed/replica_client.py",
        "        self.fleet_queue = replicas * max_queue\n",
        "        self.fleet_queue = max_queue\n",
        "the fleet's queue is one replica's: 503s while replicas have room",
    ),
    Mutant(
        "lost_choices_not_counted",
        "minirt/distributed/replica_client.py",
        "                observer.finished(final.output, time.perf_counter() - submission.received_s)\n",
        "",
        "requests that died with their replica are missing from request_success_total",
    ),
]


def apply(mutant: Mutant, tree: Path) -> None:
    path = tree / mutant.file
    text = path.read_text(encoding="utf-8")
    count = text.count(mutant.old)
    if count != 1:
        raise SystemExit(
            f"mutant {mutant.name}: its old text occurs {count} times in {mutant.file}, not once; "
            "update the mutant to the current code"
        )
    path.write_text(text.replace(mutant.old, mutant.new), encoding="utf-8")


def first_failure(output: str) -> str:
    match = re.search(r"^(?:FAILED|ERROR) (\S+)", output, flags=re.MULTILINE)
    if match:
        return match.group(1)
    lines = [line for line in output.strip().splitlines() if line.strip()]
    return lines[-1][:100] if lines else "(no output)"


def default_signals() -> None:
    """In the child, before pytest starts: Ctrl-C as in a terminal, even when this tool runs in the background
    (`cmd &` starts with SIGINT ignored, which the suite's signal tests would otherwise inherit)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def first_look(file: str) -> str | None:
    """The tests of a module's own folder (tests/ mirrors minirt/): minirt/engine/kv_manager.py ->
    tests/engine, minirt/request_maker.py -> tests/request_maker; the commands at minirt/'s top
    (generate.py, serve.py, ...) -> tests/cli.  None when no such folder exists."""
    parts = Path(file).parts
    if len(parts) > 2:
        folder = ROOT / "tests" / parts[1]
    elif (ROOT / "tests" / Path(parts[-1]).stem).is_dir():
        folder = ROOT / "tests" / Path(parts[-1]).stem
    else:
        folder = ROOT / "tests" / "cli"
    return folder.relative_to(ROOT).as_posix() if folder.is_dir() else None


def run_one(
    mutant: Mutant | None, timeout: float, tests: list[str], first: list[str] | None = None
) -> tuple[Mutant | None, str, str, float]:
    """(mutant, "killed" | "survived", first failing test or note, seconds) for one mutant in its own copy;
    None runs the unmutated suite, the baseline every verdict rests on.  Without `tests`, the mutant's own
    folder's tests run first (`first_look`; `first` instead, when given), and the whole suite only if they
    pass."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(
        prefix=f"mutant-{mutant.name if mutant else 'baseline'}-"
    ) as scratch:
        tree = Path(scratch) / "repo"
        shutil.copytree(ROOT, tree, ignore=COPY_IGNORE, symlinks=True)
        if mutant is not None:
            apply(mutant, tree)
        env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
        runs = [tests]
        if not tests:
            if first is None:
                look = first_look(mutant.file) if mutant is not None else None
                first = [look] if look is not None else []
            runs = [first, []] if first else [[]]
        for paths in runs:
            try:
                done = subprocess.run(
                    [sys.executable, *PYTEST, *paths],
                    cwd=tree,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=timeout,
                    preexec_fn=default_signals,
                )
            except subprocess.TimeoutExpired:
                return (
                    mutant,
                    "killed",
                    f"(timed out after {timeout:.0f} s)",
                    time.perf_counter() - start,
                )
            if done.returncode != 0:
                seconds = time.perf_counter() - start
                return mutant, "killed", first_failure(done.stdout + done.stderr), seconds
    return mutant, "survived", "", time.perf_counter() - start


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutants")
    parser.add_argument("--jobs", type=int, default=2, help="mutants run at once (default 2)")
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds per mutant before it counts as killed (default: three times the baseline's, "
        "at least 300: a mutant that reaches the whole suite runs its own folder's tests first)",
    )
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument(
        "--check",
        action="store_true",
        help="check that every mutant's old text occurs exactly once in its file (after moving "
        "code), list the stale ones, and exit 1 if any (0 if none); runs no test",
    )
    parser.add_argument(
        "--tests",
        nargs="+",
        default=[],
        metavar="PATH",
        help="run only these test files or folders against each mutant (default: the whole quick "
        "suite); a mutant that survives them may still die elsewhere, so quote a full run",
    )
    return parser.parse_args(argv)


def stale_mutants(mutants: list[Mutant]) -> list[tuple[Mutant, str]]:
    """The mutants that cannot be applied, each with why: a file that is gone, or old text
    that does not occur exactly once in it."""
    stale = []
    for m in mutants:
        path = ROOT / m.file
        if not path.is_file():
            stale.append((m, f"{m.file} does not exist"))
            continue
        count = path.read_text(encoding="utf-8").count(m.old)
        if count != 1:
            stale.append((m, f"its old text occurs {count} times in {m.file}, not once"))
    return stale


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = [m.name for m in MUTANTS]
    if len(set(names)) != len(names):
        raise SystemExit("two mutants share a name")
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    unknown = set(args.only or ()) - set(names)
    if unknown:
        raise SystemExit(f"unknown mutant(s): {', '.join(sorted(unknown))}; see --list")
    if args.list:
        for m in chosen:
            print(f"{m.name:42s} {m.file:30s} {m.why}")
        return 0
    stale = stale_mutants(chosen)
    if args.check:
        for m, problem in stale:
            print(f"stale: {m.name}: {problem}")
        print(f"{len(chosen) - len(stale)} of {len(chosen)} mutants apply")
        return 1 if stale else 0
    if stale:  # refuse a stale list before spending minutes on it
        m, problem = stale[0]
        raise SystemExit(f"mutant {m.name}: {problem}")
    print(
        f"{len(chosen)} mutants, {args.jobs} at a time, each against "
        f"`pytest {' '.join(PYTEST[2:] + args.tests)}`",
        file=sys.stderr,
    )
    start = time.perf_counter()
    # A kill means something only if these pass: the whole suite, and each folder run first on its own.
    looks = [] if args.tests else sorted({look for m in chosen if (look := first_look(m.file))})
    checks = [args.tests] + [[look] for look in looks]
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        baselines = list(
            pool.map(lambda paths: run_one(None, args.timeout or BASELINE_TIMEOUT_S, paths), checks)
        )
    for paths, (_, verdict, note, _seconds) in zip(checks, baselines, strict=True):
        if verdict != "survived":
            what = " ".join(paths) or "the suite"
            print(f"{what} fails with no mutant at all ({note}); fix that first", file=sys.stderr)
            return 2
    print(
        f"[baseline] the unmutated suite passes ({baselines[0][3]:.1f} s), and on their own: "
        + (", ".join(looks) or "nothing else"),
        flush=True,
    )
    timeout = args.timeout or max(300.0, 3 * baselines[0][3])
    print(f"[timeout] a mutant still running after {timeout:.0f} s counts as killed", flush=True)
    survivors = []
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for n, (mutant, verdict, note, seconds) in enumerate(
            pool.map(lambda m: run_one(m, timeout, args.tests), chosen), start=1
        ):
            print(
                f"[{n:2d}/{len(chosen)}] {verdict:8s} {mutant.name:42s} {seconds:5.1f} s  {note}",
                flush=True,
            )
            if verdict == "survived":
                survivors.append(mutant)
    killed = len(chosen) - len(survivors)
    print(
        f"\nkilled {killed} of {len(chosen)} ({100 * killed / len(chosen):.0f}%) in "
        f"{time.perf_counter() - start:.0f} s"
        + (f"; survived: {', '.join(m.name for m in survivors)}" if survivors else "")
    )
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
