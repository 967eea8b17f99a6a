"""`POST /v1/chat/completions`: a conversation in, the assistant's answer out, in OpenAI's shape.

Owns: `ChatCompletions`, the route's handler.  Its way: a model with no chat template answers
400 at once, saying so; the body is read and checked (minirt/server/protocol.py's
`ChatCompletionRequest`: 400 naming the field); the conversation is rendered with the model's
template and encoded with no special tokens added (`LLM.template_for`, `LLM.chat_prompt_ids`,
through minirt/chat_template.py), off the event loop as every encoding is.  A message's content
given as a list of text parts reaches the template in its content format (joined with "\n" for a
template that reads a string, a list for one that loops over it; `minirt serve
--chat-template-content-format` names it instead).  A conversation the template refuses (its
`raise_exception`), a bad message (its index and field named: an image part is
`messages[i].content[j].type`), or a prompt longer than the context is a 400 whose param is
"messages".  Then its n choices go the way every completion goes (minirt/server/
completion_flow.py: the hand-over to the engine's client, the watcher of a client that leaves,
the stream or the whole answer), worded by minirt/server/chat_responses.py.

Must not know: jinja2 or how a template is rendered, how rounds are computed, the engine beyond
its client, or how the process starts and stops.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..chat_template import ChatTemplate
from ..engine.client import Finished
from ..errors import InputError, RequestError
from .api_errors import APIError
from .chat_responses import ChatChunks, chat_body, chat_header
from .handover import ChoiceSpec, Completion
from .protocol import (
    ChatCompletionRequest,
    chat_api_names,
    chat_sampling_fields,
    refuse_unsupported_chat,
    sampling_params,
)

if TYPE_CHECKING:
    from .app import CompletionsAPI


@dataclass
class Conversation:
    """A chat body's conversation, rendered and checked: its prompt ids, and its choices."""

    ids: list[int]
    choices: list[ChoiceSpec]


class ChatCompletions:
    """The chat route, on the completions' API: its body reader, limits and flow."""

    def __init__(self, api: CompletionsAPI):
        self.api = api
        self.llm = api.llm

    async def create(self, request: Request) -> Response:
        received = time.perf_counter()
        template = self.template()
        body = await self.api.body_of(request, ChatCompletionRequest)
        assert isinstance(body, ChatCompletionRequest)
        refuse_unsupported_chat(body)
        self.api.refuse_too_many_choices(body.n)
        # Rendering and encoding grow with the conversation: off the event loop.
        conversation = await asyncio.to_thread(self.conversation, body, template)
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        completion = Completion(completion_id, conversation.choices, received)
        flow = self.api.flow
        watcher = await flow.start(request, completion)
        name = self.api.settings.model_name
        head = chat_header(completion_id, int(time.time()), name, chunk=body.stream)
        if body.stream:
            options = body.stream_options
            tokenizer = self.llm.tokenizer
            assert tokenizer is not None  # the conversation was encoded with it
            shape = ChatChunks(
                head,
                len(completion.choices),
                len(conversation.ids),
                tokenizer,
                logprobs=body.logprobs,
                include_usage=options is not None and options.include_usage,
            )
            return flow.streamed(completion, shape, watcher)
        finals = await flow.finals(completion, watcher)
        # Off the event loop: a reply of 128 choices with their logprobs takes a while to build.
        return await asyncio.to_thread(self.whole, finals, len(conversation.ids), head)

    def template(self) -> ChatTemplate:
        """The model's chat template; none is a 400 saying so (before the body is read)."""
        try:
            return self.llm.template_for(None)
        except RequestError:
            message = (
                f"the model {self.api.settings.model_name!r} has no chat template (no "
                "chat_template.jinja, no chat_template in its tokenizer_config.json), so there "
                "are no chat completions; send the text to POST /v1/completions"
            )
            raise APIError(400, message) from None

    def conversation(self, body: ChatCompletionRequest, template: ChatTemplate) -> Conversation:
        """The conversation rendered and encoded, its SamplingParams checked; n choices."""
        try:
            text = template.render(
                body.messages, body.add_generation_prompt, extra=body.chat_template_kwargs
            )
            # The context's bound, and BOS for an empty render, as for any prompt.
            ids = self.llm.prompt_ids(self.llm.chat_prompt_ids(text))
        except (RequestError, InputError) as exc:
            raise APIError(400, str(exc), param=exc.field or "messages") from None
        n_positions = self.llm.model.config.n_positions
        fields = chat_sampling_fields(body, len(ids), n_positions)
        params = sampling_params(fields, chat_api_names(body))
        try:
            self.llm.check_params(params)
        except (RequestError, InputError) as exc:
            raise APIError(400, str(exc), param=exc.field) from None
        choices = [ChoiceSpec(tuple(ids), params, sample) for sample in range(body.n)]
        return Conversation(ids, choices)

    def whole(self, finals: list[Finished], prompt_length: int, head: dict) -> Response:
        return JSONResponse(chat_body(head, finals, prompt_length, self.llm.tokenizer))
