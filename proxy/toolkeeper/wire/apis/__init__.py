"""One room per agent API, each the same design: an adapter (the request in, the answer out), the engine's
`Model` for its upstream endpoint, and a writer that relays what the engine yields, reading its events only.

    chat/        Chat Completions: the neutral form itself; the writer makes each chunk
    responses/   the Responses API: items <-> neutral messages; the server's events relayed (relay.py)
    messages/    Anthropic Messages: blocks <-> neutral messages; the server's events relayed (relay.py)
"""

from toolkeeper.wire.apis.base import AgentAPI, credentials_hash
from toolkeeper.wire.apis.chat import ChatCompletions
from toolkeeper.wire.apis.messages import MessagesAPI, anthropic_tool, count_tokens_body
from toolkeeper.wire.apis.responses import ResponsesAPI, flat_tool, response_not_found

__all__ = [
    "AgentAPI",
    "ChatCompletions",
    "MessagesAPI",
    "ResponsesAPI",
    "anthropic_tool",
    "count_tokens_body",
    "credentials_hash",
    "flat_tool",
    "response_not_found",
]
