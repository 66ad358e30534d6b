"""Anthropic Messages: `/v1/messages`. The adapter, its model, reader and writer, and the blocks' translation."""

from toolkeeper.wire.apis.messages.adapter import MessagesAPI, count_tokens_body
from toolkeeper.wire.apis.messages.items import anthropic_tool

__all__ = ["MessagesAPI", "anthropic_tool", "count_tokens_body"]
