"""Choosing each request's next token from its own logits.

Owns:
  * `processed_logits`: logit_bias, then repetition, frequency and presence penalties (formulas
    there);
  * `filtered_distribution`: temperature, then top-k, top-p and min-p, turning logits into
    probabilities;
  * `choose_token`: greedy or a draw from the request's own random stream, plus its
    log-probability under the raw model;
  * `choose_tokens`: the same for every row of a round, as a `Choice` each (the token, its
    logprob and rank, its top alternatives; when every row is greedy and wants no
    log-probabilities, the argmax runs on the backend and only B token ids cross to the host);
  * `log_softmax`, the one log-softmax in minirt (float64), `prompt_logprobs` (a block of
    prompt positions at a time) and `top_logprobs` (`most_likely`: the top n without sorting the
    vocabulary);
  * each request's random stream (`request_rng`, `sample_seed`, `derived_seed`).

Sampling runs on the host in float64 NumPy, one request at a time, with each request's own
`numpy.random.Generator`.  So a request's tokens depend only on its logits and its seed, never
on which rows it was batched with, and the CuPy backend samples exactly what the NumPy backend
does.

Must not know: models, batches, scheduling or text.
"""

from __future__ import annotations

import numpy as np

from .params import SamplingParams
from .request import Choice


def processed_logits(
    logits: np.ndarray, params: SamplingParams, prompt_ids, output_ids
) -> np.ndarray:
    """The logits [V] (float64) after the biases and penalties, in this order:

    1. logit_bias: logit[t] += bias[t];
    2. repetition_penalty r, for every token t in the prompt or the output (once, however
       often): logit[t] / r if logit[t] > 0, else logit[t] * r (transformers'
       RepetitionPenaltyLogitsProcessor);
    3. frequency and presence, with count[t] = how often the output so far holds t (vLLM,
       OpenAI): logit[t] -= frequency_penalty * count[t] + presence_penalty * (count[t] > 0).

    Temperature, top-k, top-p and min-p come after (`filtered_distribution`)."""
    # A copy.
    x = np.array(logits, dtype=np.float64)  # [V]
    for token, bias in params.logit_bias:
        if token < x.size:
            x[token] += bias
    if params.repetition_penalty != 1.0:
        seen_ids = list(prompt_ids) + list(output_ids)
        seen = np.unique(np.asarray(seen_ids, dtype=np.int64))  # [S]
        seen = seen[seen < x.size]
        penalty = params.repetition_penalty
        x[seen] = np.where(x[seen] > 0, x[seen] / penalty, x[seen] * penalty)
    if (params.presence_penalty or params.frequency_penalty) and len(output_ids):
        output = np.asarray(output_ids, dtype=np.int64)  # [N]
        counts = np.bincount(output, minlength=x.size)[: x.size]  # [V]
        x -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0)
    return x


def log_softmax(logits: np.ndarray, axis: int = -1) -> np.ndarray:
    """Log-probabilities along `axis` (the vocabulary), computed stably in float64."""
    x = np.asarray(logits, dtype=np.float64)  # [..., V]
    shifted = x - x.max(axis=axis, keepdims=True)  # [..., V]
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))  # [..., V]


def filtered_distribution(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The probabilities [V] (float64, summing to 1) a token is drawn from: softmax(logits / T),
    then top-k (every token whose logit is at least the k-th largest: boundary ties are kept),
    then top-p (the most likely tokens, in order, until their total probability reaches top_p;
    the top token always), then min-p (the tokens whose probability is at least min_p x the top
    one's; transformers' MinPLogitsWarper), renormalised."""
    scaled = np.asarray(logits, dtype=np.float64) / params.temperature  # [V]
    if 0 < params.top_k < scaled.size:
        kth_largest = np.partition(scaled, -params.top_k)[-params.top_k]
        # -inf outside the top k.
        scaled = np.where(scaled >= kth_largest, scaled, -np.inf)  # [V]
    # Zero outside the top k.
    probs = np.exp(log_softmax(scaled))  # [V]
    if params.top_p < 1.0:
        # Most likely first, by the logits themselves (rounding can tie probabilities they tell
        # apart), then by id.
        order = np.argsort(-scaled, kind="stable")  # [V]
        # The probability of the tokens ranked above each one.
        mass_before = np.cumsum(probs[order]) - probs[order]  # [V]
        # The first token has mass_before 0: it is always kept.
        kept_in_order = mass_before < params.top_p  # [V]
        # Zero outside the nucleus.
        probs[order[~kept_in_order]] = 0.0  # [V]
        probs = probs / probs.sum()
    if params.min_p > 0:
        # The top token always stays.
        probs = np.where(probs >= params.min_p * probs.max(), probs, 0.0)  # [V]
        probs = probs / probs.sum()
    return probs


def choose_token(
    logits: np.ndarray,
    params: SamplingParams,
    rng: np.random.Generator | None,
    want_logprob: bool = True,
    prompt_ids=(),
    output_ids=(),
    raw_logprobs: np.ndarray | None = None,
) -> tuple[int, float | None]:
    """(token id, its log-probability under the raw model, or None when not wanted) for one
    request.  Greedy takes the argmax (ties to the lowest id) and draws no random number;
    otherwise one uniform number from the request's own stream is mapped through the filtered
    distribution's cumulative sum, in id order.  `raw_logprobs`: `log_softmax(logits)` when the
    caller has it already (else computed here, if wanted)."""
    # From the model.
    logits = np.asarray(logits)  # [V] fp32
    if params.changes_logits:
        chosen_from = processed_logits(logits, params, prompt_ids, output_ids)
    else:
        chosen_from = logits
    if params.greedy:
        token = int(np.argmax(chosen_from))
    else:
        probs = filtered_distribution(chosen_from, params)  # [V]
        cumulative = np.cumsum(probs)  # [V]
        assert rng is not None, "a sampled request has its own random stream"
        u = rng.random() * cumulative[-1]
        token = int(np.searchsorted(cumulative, u, side="right"))
        # Guard the u == total edge.
        token = min(token, int(np.flatnonzero(probs)[-1]))
    if not want_logprob:
        return token, None
    if raw_logprobs is None:
        raw_logprobs = log_softmax(logits)  # [V] float64
    return token, float(raw_logprobs[token])


# Prompt positions whose log-softmax `prompt_logprobs` holds at once: [64, V] float64 (26 MB at
# GPT-2's vocabulary), never [L, V] (a 1024-token prompt's is 411 MB).
PROMPT_ROWS_AT_ONCE = 64


def prompt_logprobs(prompt_logits: np.ndarray, prompt_ids) -> list[float | None]:
    """Each prompt token's log-probability given the tokens before it, from the logits [L, V] at
    every prompt position (position i predicts token i + 1); the first token has none (None).
    The log-softmax runs on a block of positions at a time, each row as it would alone, so the
    numbers are those of the whole [L-1, V] at once, in a bounded amount of memory."""
    targets = np.asarray(prompt_ids[1:], dtype=np.int64)  # [L-1]
    chosen: list[float | None] = [None]
    for start in range(0, targets.size, PROMPT_ROWS_AT_ONCE):
        block_targets = targets[start : start + PROMPT_ROWS_AT_ONCE]  # [C]
        block = log_softmax(prompt_logits[start : start + block_targets.size])  # [C, V]
        chosen += block[np.arange(block_targets.size), block_targets].tolist()
    return chosen


def most_likely(values: np.ndarray, n: int) -> np.ndarray:
    """The indices of the n largest values, largest first, equal values in index order: exactly
    `np.argsort(-values, kind="stable")[:n]`, without sorting all of them (a partition finds
    the n-th largest; only the values at least as large are sorted)."""
    if n <= 0:
        return np.zeros(0, dtype=np.intp)
    if n >= values.size:
        return np.argsort(-values, kind="stable")
    nth_largest = np.partition(values, values.size - n)[values.size - n]
    # Every value >= the n-th largest, in index order: the n largest, and their ties.
    candidates = np.flatnonzero(values >= nth_largest)  # [C >= n]
    return candidates[np.argsort(-values[candidates], kind="stable")[:n]]  # [n]


def top_logprobs(
    logits: np.ndarray, n: int, raw_logprobs: np.ndarray | None = None
) -> list[tuple[int, float]]:
    """The n most likely tokens under the raw model, most likely first (ties: the lower id
    first), with their log-probabilities: [(token id, logprob), ...].  `raw_logprobs`:
    `log_softmax(logits)` when the caller has it already."""
    if raw_logprobs is None:
        raw_logprobs = log_softmax(logits)  # [V]
    return [(int(token), float(raw_logprobs[token])) for token in most_likely(raw_logprobs, n)]


def logprob_rank(raw_logprobs: np.ndarray, token: int) -> int:
    """A token's rank under the raw model, vLLM's way: 1 for the most likely, and in general how
    many tokens are at least as likely as it (itself included), so a token tied with others
    ranks after all of them."""
    return int(np.count_nonzero(raw_logprobs >= raw_logprobs[token]))


def choose_tokens(backend, logits, rows) -> list[Choice | None]:
    """Every row's `Choice` (its token; its log-probability and rank under the raw model, or
    None; its top alternatives, or None), from its own logits row and settings.  `rows` are the
    round's requests (with `params`, `rng`, `want_logprobs`); `logits` [B, V] is a backend
    array.  The all-greedy shortcut picks what `choose_token` would (same fp32 numbers, ties to
    the lowest id).  A row holding NaN or inf chooses nothing: None tells the caller to fail
    that request."""
    chosen: list[Choice | None] = []
    if all(r.params.greedy and not r.want_logprobs and not r.params.changes_logits for r in rows):
        # One device-to-host copy of B ids: each row's argmax, or -1 where it is not finite.
        xp = backend.xp
        finite = xp.isfinite(logits).all(axis=-1)  # [B] bool
        picked = backend.to_numpy(xp.where(finite, xp.argmax(logits, axis=-1), -1))  # [B]
        for token in picked:
            if token >= 0:
                chosen.append(Choice(int(token)))
            else:
                chosen.append(None)
        return chosen
    # One device-to-host copy of the logits; the rest on the host.
    host = backend.to_numpy(logits)  # [B, V] fp32
    finite = np.isfinite(host).all(axis=-1)  # [B] bool
    for row, r, ok in zip(host, rows, finite, strict=True):
        if not ok:
            chosen.append(None)
            continue
        # The raw model's log-probabilities, once, for the chosen token and the top n.
        raw = log_softmax(row) if r.want_logprobs or r.params.logprobs else None  # [V]
        token, logprob = choose_token(
            row, r.params, r.rng, r.want_logprobs, r.prompt_ids, r.token_ids, raw
        )
        if r.params.logprobs:
            top = top_logprobs(row, r.params.logprobs, raw)
        else:
            top = None
        if logprob is None:
            rank = None
        else:
            assert raw is not None  # computed above, since a logprob was wanted
            rank = logprob_rank(raw, token)
        chosen.append(Choice(token, logprob, top, rank))
    return chosen


def request_rng(seed: int) -> np.random.Generator:
    """A request's own random stream."""
    return np.random.Generator(np.random.PCG64(seed))


def sample_seed(request_seed: int, sample: int) -> int:
    """Sample k's seed: the request's own for sample 0 (so n = 1 draws what it always drew),
    else derived from the request's seed and k alone, so sample k is the same whatever n is."""
    if sample == 0:
        return request_seed
    return derived_seed(request_seed, sample)


def derived_seed(run_seed: int, index: int) -> int:
    """The seed of a request that set none, fixed by the run's seed and its input position alone
    (not batch size, order of service or neighbours), so runs are reproducible and outputs the
    same in any batch."""
    state = np.random.SeedSequence([run_seed, index]).generate_state(1, dtype=np.uint64)
    return int(state[0] >> 1)
