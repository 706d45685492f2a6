"""The client APIs agentrl samples for, in one table: OpenAI's Chat Completions (what vLLM speaks), and OpenAI's
Responses and Anthropic's Messages, each translated into the chat completion the server samples and its answer
told back in its own format. The gateway routes by this table and automatic capture (`agentrl.client.capture`) records
by it, so an API is one row, never a string compared in several places."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentrl.gateway import messages_api, responses_api
from agentrl.gateway.chunks import StreamedAnswer
from agentrl.gateway.responses_stream import CompletedResponse, ResponseEvents

Thread = responses_api.Thread
ThreadOf = Callable[[str], "Thread | None"]
AnswerEvents = ResponseEvents | messages_api.MessageEvents
"""A streamed chat completion told as a translated API's server-sent events, chunk by chunk (the gateway's side)."""
AnswerReader = StreamedAnswer | CompletedResponse | messages_api.MessageStream
"""A stream in an API's own events read back into its final answer (capture's side)."""


@dataclass(frozen=True)
class Translation:
    """How a client API other than Chat Completions becomes a chat completion, and back."""

    chat_request: Callable[[dict[str, Any], ThreadOf], tuple[dict[str, Any], Thread]]
    """Its request as a chat completion request, and the thread it continues (Responses' previous_response_id)."""
    new_id: Callable[[], str]
    """A fresh id for its answer (resp_..., msg_...), under which the sampled tokens are kept."""
    answer: Callable[[dict[str, Any], str, dict[str, Any]], dict[str, Any]]
    """(its request, answer id, the chat answer) -> its answer in its own format."""
    choice_fields: Callable[[dict[str, Any]], dict[str, Any]]
    """Its answer -> the chat choice it was translated from (what a trajectory records)."""
    answer_marker: tuple[str, str]
    """A field and value its answer object carries (an error body does not)."""
    events: Callable[[dict[str, Any], str], AnswerEvents]
    """(its request, answer id) -> the writer of its stream's events."""
    thread_after: Callable[[Thread, dict[str, Any]], Thread] | None
    """(the thread a request continued, its chat answer) -> the thread a later request may continue from its
    answer's id (Responses' previous_response_id); None for an API without threads (Messages)."""


@dataclass(frozen=True)
class ClientApi:
    """One client API: the route it is asked on (how the path ends), how its errors are shaped, how its stream
    reads back into an answer, and (all but Chat Completions) its `Translation`."""

    name: str
    path: str
    anthropic_errors: bool
    reader: Callable[[], AnswerReader]
    translation: Translation | None = None

    def is_answer(self, answer: dict[str, Any]) -> bool:
        """Whether `answer` (a JSON body) is an answer of this API rather than an error."""
        if self.translation is None:
            return True
        field, value = self.translation.answer_marker
        return answer.get(field) == value


CHAT = ClientApi("chat", "/chat/completions", anthropic_errors=False, reader=StreamedAnswer)
RESPONSES = ClientApi(
    "responses",
    "/responses",
    anthropic_errors=False,
    reader=CompletedResponse,
    translation=Translation(
        chat_request=responses_api.chat_request,
        new_id=responses_api.new_response_id,
        answer=responses_api.response_object,
        choice_fields=responses_api.choice_fields,
        answer_marker=("object", "response"),
        events=ResponseEvents,
        thread_after=responses_api.thread_after,
    ),
)
MESSAGES = ClientApi(
    "messages",
    "/messages",
    anthropic_errors=True,
    reader=messages_api.MessageStream,
    translation=Translation(
        chat_request=lambda body, _thread_of: (messages_api.chat_request(body), []),
        new_id=messages_api.new_message_id,
        answer=lambda _body, answer_id, chat_answer: messages_api.message_object(answer_id, chat_answer),
        choice_fields=messages_api.choice_fields,
        answer_marker=("type", "message"),
        events=lambda _body, answer_id: messages_api.MessageEvents(answer_id),
        thread_after=None,
    ),
)
CLIENT_APIS = (CHAT, RESPONSES, MESSAGES)


def api_for_path(path: str) -> ClientApi | None:
    """The client API whose route `path` is (by how it ends), or None for any other route."""
    return next((api for api in CLIENT_APIS if path.endswith(api.path)), None)
