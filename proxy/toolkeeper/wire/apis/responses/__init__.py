"""The Responses API: `/v1/responses`. The adapter, its model, reader and writer, and the items' translation."""

from toolkeeper.wire.apis.responses.adapter import ResponsesAPI
from toolkeeper.wire.apis.responses.items import flat_tool
from toolkeeper.wire.apis.responses.owners import response_not_found

__all__ = ["ResponsesAPI", "flat_tool", "response_not_found"]
