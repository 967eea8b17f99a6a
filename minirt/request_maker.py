"""Prompts and parameters in, requests of token ids out: the one place a request is made.

Owns: `RequestMaker`, which turns a prompt (text, or token ids) and its SamplingParams into the
engine's `Request`: the text encoded, the ids checked against the model's vocabulary and context
(BOS alone for an empty prompt), the parameters checked against this model (token ids in its
vocabulary, stop strings only with a tokenizer), and the request's own random stream seeded
(its own seed, or one drawn from the run's seed and its index, then its sample number).  A bad
prompt or parameter makes a request that is failed already, with an error of its own, so that
its peers still run.

The offline API (minirt/llm.py, and through it the command line) and the server's handlers
(minirt/server/handover.py) make their requests here, and nowhere else; the engine takes
requests of token ids and never sees text on the way in (vLLM's input processor, before the
engine core).

Must not know: how requests are served, files, command-line flags or HTTP.
"""

from __future__ import annotations

from typing import Sequence

from .engine.params import SamplingParams
from .engine.request import Request, fail_request
from .engine.sampler import derived_seed, request_rng, sample_seed
from .errors import InputError, RequestError
from .loading.tokenizer import Tokenizer
from .model.batch import check_token_ids
from .model.config import special_ids
from .model.interface import ModelConfig


class RequestMaker:
    """Makes one model's requests: its tokenizer (None: token-id prompts only), the size of its
    vocabulary and context, its BOS, and the run seed an unseeded request draws from."""

    def __init__(
        self,
        tokenizer: Tokenizer | None,
        vocab_size: int,
        n_positions: int,
        bos_token_id: int | None,
        run_seed: int = 0,
    ):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.n_positions = n_positions
        self.bos_token_id = bos_token_id
        self.run_seed = run_seed

    @classmethod
    def for_model(
        cls, config: ModelConfig, tokenizer: Tokenizer | None, run_seed: int = 0
    ) -> RequestMaker:
        """The maker of a model's requests: its BOS is the tokenizer's, else its config's when
        that lies in its vocabulary."""
        if tokenizer is not None:
            bos_token_id = tokenizer.bos_token_id
        else:
            _eos, bos_token_id = special_ids(
                config.eos_token_id, config.bos_token_id, config.vocab_size
            )
        return cls(tokenizer, config.vocab_size, config.n_positions, bos_token_id, run_seed)

    def make(
        self,
        index: int,
        prompt: str | Sequence[int],
        params: SamplingParams,
        request_id=None,
        want_logprobs: bool = False,
        sample: int = 0,
        output_index: int = -1,
    ) -> Request:
        """A Request for one prompt: `index` is its place in the input (an unseeded request's
        stream comes from it), `request_id` the user's id (default: the index), `sample` which
        of the prompt's n samples, `output_index` its place among the outputs.  A bad prompt or
        parameter comes back failed, with its own error."""
        request = Request(
            index=index,
            id=str(index if request_id is None else request_id),
            prompt=prompt if isinstance(prompt, str) else None,
            prompt_ids=[],
            params=params,
            want_logprobs=want_logprobs or params.logprobs is not None,
            sample=sample,
            output_index=output_index,
        )
        try:
            request.prompt_ids = self.prompt_ids(prompt)
            self.check_params(params)
        except (RequestError, InputError) as exc:
            fail_request(request, str(exc))
            return request
        if params.seed is not None:
            seed = params.seed
        else:
            seed = derived_seed(self.run_seed, index)
        request.rng = request_rng(sample_seed(seed, sample))
        return request

    def prompt_ids(self, prompt: str | Sequence[int]) -> list[int]:
        """What the model is fed first: the encoded text or the checked ids; BOS alone for an
        empty prompt.  A RequestError (or InputError) says what is wrong."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise RequestError("this model has no tokenizer, so prompts must be token-id lists")
            self.refuse_too_long_to_encode(prompt)
            # As transformers' tokenizer(text): with the BOS its post-processor adds (none for
            # GPT-2).
            ids = self.tokenizer.encode(prompt)
        else:
            ids = check_token_ids(prompt, self.vocab_size, "prompt")
        # An empty prompt starts from the beginning-of-text token.
        if not ids:
            if self.bos_token_id is None:
                raise RequestError(
                    "the prompt is empty and the model has no BOS/EOS token to start from"
                )
            ids = [self.bos_token_id]
        if len(ids) > self.n_positions:
            raise RequestError(
                f"the prompt has {len(ids)} tokens, more than the model's context of "
                f"{self.n_positions}; shorten it"
            )
        return ids

    def refuse_too_long_to_encode(self, text: str) -> None:
        """A text that no encoding could fit in the context, refused before it is encoded (the
        work grows with it: 2 MB take seconds): the special tokens `encode` adds (a BOS) take
        their room first, and each token is at most the tokenizer's longest (byte-level
        vocabularies; others are encoded), so the text's bytes after its normalizer must fit.
        A text of no more characters than that is let through without normalizing it (a
        character is at least one byte, unless a normalizer composes it: NFC)."""
        tokenizer = self.tokenizer
        assert tokenizer is not None
        most = tokenizer.most_bytes_per_token
        if most is None:
            return
        room = max(0, self.n_positions - tokenizer.special_tokens_added()) * most
        if len(text) <= room:
            return
        size = tokenizer.text_bytes(text)
        if size is not None and size > room:
            raise RequestError(
                f"the prompt has {len(text)} characters ({size} bytes), more than the model's "
                f"context of {self.n_positions} tokens can hold (no token here is more than "
                f"{most} bytes); shorten it"
            )

    def check_params(self, params: SamplingParams) -> None:
        """Refuse (RequestError or InputError) what SamplingParams cannot check alone, since it
        needs this model: token ids outside its vocabulary, stop strings without a tokenizer.
        The error's `field` names the SamplingParams field it is about."""
        if params.stop and self.tokenizer is None:
            raise RequestError(
                "stop strings need a tokenizer, and this model has none; use stop_token_ids",
                "stop",
            )
        check_token_ids(params.stop_token_ids, self.vocab_size, "stop", field="stop_token_ids")
        biased_tokens = [token for token, _ in params.logit_bias]
        check_token_ids(biased_tokens, self.vocab_size, "logit_bias")
