"""Runs refused before anything is served, because every request would fail the same way.

Owns: `refuse_text_without_a_tokenizer` (every prompt is text and the model has no tokenizer) and
`refuse_budgets_no_request_fits` (the KV budget, or the round token budget, is below what every
request needs).  One fix in the command (a flag, the prompts, the model) mends each, so each is
one line and exit 2, and an existing --output stays as it was, instead of a file of error records
and exit 1.  A run in which only some requests fail still runs: each of those fails alone.

Must not know: how requests are served, files or output.
"""

from __future__ import annotations

from ..engine.request import Request
from ..errors import MinirtError
from ..llm import LLM
from .prompt_file import PromptEntry


def refuse_text_without_a_tokenizer(llm: LLM, entries: list[PromptEntry]) -> None:
    """Every prompt is text (--prompt, a .txt file, JSONL strings) and the model cannot encode
    text: refused, saying how to give token ids instead."""
    if llm.tokenizer is not None:
        return
    prompts = [entry.prompt for entry in entries if entry.error is None]
    all_text = bool(prompts) and all(isinstance(prompt, str) for prompt in prompts)
    if all_text:
        raise MinirtError(
            f"{llm.model.folder} has no tokenizer, and every prompt is text; give token ids in "
            'a .jsonl file ({"prompt": [464, 3290, 318]}), or a model folder with a tokenizer'
        )


def refuse_budgets_no_request_fits(llm: LLM, requests: list[Request]) -> None:
    """Every request that is not already failed needs more than the budgets allow (a --kv-budget
    of a few positions, a --max-round-tokens under every prompt): no round could take any."""
    waiting = [request for request in requests if not request.finished]
    reasons = [llm.refusal(request) for request in waiting]
    if waiting and all(reason is not None for reason in reasons):
        raise MinirtError(
            f"no request of this run fits its budgets (--kv-budget, --max-round-tokens), so "
            f"none could run: request {waiting[0].index} {reasons[0]}"
        )
