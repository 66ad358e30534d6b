"""Chat Completions: `/v1/chat/completions`. The adapter, its model, the stream assembler, the writer."""

from toolkeeper.wire.apis.chat.adapter import ChatCompletions

__all__ = ["ChatCompletions"]
