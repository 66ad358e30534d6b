"""The scripted model server's Responses API (`POST /v1/responses`), strict as OpenAI's.

It answers the same script steps as Chat Completions (`content`, `tool_calls`,
`usage`, `when`, `status`/`body`, `raw`, `hang`, `delay`), plus `items`: output
items as given, after the calls (a built-in's `shell_call`, `apply_patch_call`,
...: each must be answered by its own output type), and `reasoning`:
a summary text, sent as a reasoning item with encrypted content before the
rest, and `streamed_arguments` (a faulty server: its function call's events
carry these arguments, its final output the step's). Responses are kept in memory, so `previous_response_id` chains and
`item_reference` items resolve. It rejects, with the 400 a real server gives,
what a proxy must never send: an unknown `previous_response_id`, a reference
to an unknown item, a `function_call_output` with no call before it, a call
left without its output, a reasoning item not followed by its item, an item
id given twice.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import orjson
from aiohttp import web

# Each call item type the agent runs, and the output item type that must answer it.
ANSWERED_BY = {"function_call": "function_call_output", "custom_tool_call": "custom_tool_call_output",
               "shell_call": "shell_call_output", "local_shell_call": "local_shell_call_output",
               "apply_patch_call": "apply_patch_call_output", "computer_call": "computer_call_output"}
CALLS = tuple(ANSWERED_BY)
OUTPUTS = tuple(ANSWERED_BY.values())

STREAMED = "_streamed_output"  # a step's items as its events show them, when they differ from the output


class Rejected(Exception):
    def __init__(self, message: str, param: str = "input", code: str | None = None):
        super().__init__(message)
        self.body = {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}


class ResponsesScript:
    def __init__(self) -> None:
        self.stored: dict[str, dict[str, Any]] = {}  # response id -> {"context": items, "output": items}
        self.responses: dict[str, dict[str, Any]] = {}  # response id -> the response, for GET /responses/{id}
        self.items: dict[str, dict[str, Any]] = {}  # item id -> item, for item_reference
        self._ids = itertools.count(1)

    def context(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """The whole conversation the request stands for, checked as OpenAI checks it."""
        items: list[dict[str, Any]] = []
        previous = body.get("previous_response_id")
        if previous is not None:
            if previous not in self.stored:
                raise Rejected(f"Previous response with id '{previous}' not found.", "previous_response_id",
                               "previous_response_not_found")
            items += self.stored[previous]["context"] + self.stored[previous]["output"]
        given = body.get("input")
        given = [{"role": "user", "content": given}] if isinstance(given, str) else list(given or [])
        for item in given:
            if item.get("type") == "item_reference":
                if item.get("id") not in self.items:
                    raise Rejected(f"Item with id '{item.get('id')}' not found.")
                item = self.items[item["id"]]
            items.append(item)
        _check(given, items)
        return items

    def answer(self, step: dict[str, Any], body: dict[str, Any], context: list[dict[str, Any]]) -> dict[str, Any]:
        number = next(self._ids)
        response_id = step.get("id", f"resp_scripted{number}")  # a step may fix its ids, for golden transcripts
        tag = response_id.removeprefix("resp_scripted").removeprefix("resp_")
        output: list[dict[str, Any]] = []
        if step.get("reasoning"):
            output.append({"id": f"rs_{tag}", "type": "reasoning",
                           "summary": [{"type": "summary_text", "text": step["reasoning"]}],
                           "encrypted_content": f"gAAAA-scripted-{tag}"})
        content = _fill(step.get("content"), context)
        if content:
            output.append({"id": f"msg_{tag}", "type": "message", "role": "assistant", "status": "completed",
                           "content": [{"type": "output_text", "text": content, "annotations": [], "logprobs": []}]})
        for position, call in enumerate(step.get("tool_calls") or []):
            arguments = call.get("arguments", {})
            output.append({"id": f"fc_{tag}_{position}", "type": "function_call", "status": "completed",
                           "call_id": call.get("id", f"call_{tag}_{position}"), "name": call["name"],
                           "arguments": arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode()})
        for position, item in enumerate(step.get("items") or []):
            output.append({"id": f"it_{tag}_{position}", "status": "completed", **item})
        usage = step.get("usage") or {"input_tokens": 10 * len(context), "output_tokens": 5 + 7 * len(output)}
        usage = {"input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0},
                 **usage, "total_tokens": usage["input_tokens"] + usage["output_tokens"]}
        response = {"id": response_id, "object": "response", "created_at": step.get("created", int(time.time())),
                    "status": step.get("status", "completed"), "error": None, "incomplete_details": None,
                    "model": body.get("model") or "scripted-model", "output": output,
                    "parallel_tool_calls": body.get("parallel_tool_calls", True),
                    "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [],
                    "previous_response_id": body.get("previous_response_id"), "store": body.get("store", True),
                    "usage": usage, "metadata": {}}
        if step.get("streamed_arguments") is not None:  # a faulty server: its events and final output disagree
            response[STREAMED] = [{**item, "arguments": orjson.dumps(step["streamed_arguments"]).decode()}
                                  if item["type"] == "function_call" else item for item in output]
        if body.get("store", True):
            self.stored[response_id] = {"context": context, "output": output}
            self.responses[response_id] = response
            self.items.update({item["id"]: item for item in output})
        return response

    async def reply(self, request: web.Request, response: dict[str, Any], stream: bool) -> web.StreamResponse:
        streamed = response.pop(STREAMED, response["output"])
        if not stream:
            return web.Response(body=orjson.dumps(response), content_type="application/json")
        answer = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await answer.prepare(request)
        await answer.write(b"".join(_sse(number, event) for number, event in enumerate(events(response, streamed))))
        await answer.write_eof()
        return answer


def _check(given: list[dict[str, Any]], items: list[dict[str, Any]]) -> None:
    seen_ids: set[str] = set()
    for item in given:
        if item.get("id") and item.get("type") != "item_reference":
            if item["id"] in seen_ids:
                raise Rejected(f"Duplicate item found with id {item['id']}. Remove duplicate items from your input "
                               "and try again.")
            seen_ids.add(item["id"])
    calls: dict[str, str] = {}  # call id -> its type
    approvals = {item.get("id") for item in items if item.get("type") == "mcp_approval_request"}
    for position, item in enumerate(items):
        kind = item.get("type")
        if kind == "mcp_approval_response" and item.get("approval_request_id") not in approvals:
            raise Rejected(f"No approval request found with id {item.get('approval_request_id')}.")
        if kind in CALLS:
            calls[item.get("call_id")] = kind
        elif kind in OUTPUTS and item.get("call_id") not in calls:
            raise Rejected(f"No tool call found for function call output with call_id {item.get('call_id')}.")
        elif kind in OUTPUTS and ANSWERED_BY[calls[item["call_id"]]] != kind:
            raise Rejected(f"A {kind} item cannot answer the {calls[item['call_id']]} {item['call_id']}.")
        elif kind == "reasoning":
            following = items[position + 1] if position + 1 < len(items) else None
            if following is None or following.get("type") == "reasoning":
                raise Rejected(f"Item '{item.get('id')}' of type 'reasoning' was provided without its required "
                               "following item.")
    answered = {item.get("call_id") for item in items if item.get("type") in OUTPUTS}
    for call_id in calls:
        if call_id not in answered:
            raise Rejected(f"No tool output found for function call {call_id}.")


def _fill(content: str | None, context: list[dict[str, Any]]) -> str | None:
    if content and "{tool_result}" in content:
        outputs = [item for item in context if item.get("type") in OUTPUTS]
        return content.replace("{tool_result}", str(outputs[-1].get("output") if outputs else ""))
    return content


def events(response: dict[str, Any], streamed: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The SSE events of a response, in the order OpenAI sends them (the items as `streamed`, when given)."""
    head = {**response, "status": "in_progress", "output": [], "usage": None}
    out = [{"type": "response.created", "response": head}, {"type": "response.in_progress", "response": head}]
    for index, item in enumerate(response["output"] if streamed is None else streamed):
        out += _item_events(index, item)
    final = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
    return [*out, {"type": final, "response": response}]


def _item_events(index: int, item: dict[str, Any]) -> list[dict[str, Any]]:
    at = {"item_id": item["id"], "output_index": index}
    if item["type"] == "message":
        text = item["content"][0]["text"]
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        middle = [{"type": "response.content_part.added", **at, "content_index": 0, "part": part}]
        middle += [{"type": "response.output_text.delta", **at, "content_index": 0, "delta": text[i:i + 6],
                    "logprobs": []} for i in range(0, len(text), 6)]
        middle += [{"type": "response.output_text.done", **at, "content_index": 0, "text": text, "logprobs": []},
                   {"type": "response.content_part.done", **at, "content_index": 0, "part": {**part, "text": text}}]
        started = {**item, "status": "in_progress", "content": []}
    elif item["type"] == "function_call":
        arguments = item["arguments"]
        middle = [{"type": "response.function_call_arguments.delta", **at, "delta": arguments[i:i + 7]}
                  for i in range(0, len(arguments), 7)]
        middle.append({"type": "response.function_call_arguments.done", **at, "arguments": arguments})
        started = {**item, "status": "in_progress", "arguments": ""}
    elif item["type"] != "reasoning":  # another item (a built-in call): announced, then done
        middle, started = [], {**item, "status": "in_progress"}
    else:
        text = item["summary"][0]["text"]
        summary = {**at, "summary_index": 0}
        middle = [{"type": "response.reasoning_summary_part.added", **summary,
                   "part": {"type": "summary_text", "text": ""}},
                  {"type": "response.reasoning_summary_text.delta", **summary, "delta": text},
                  {"type": "response.reasoning_summary_text.done", **summary, "text": text},
                  {"type": "response.reasoning_summary_part.done", **summary,
                   "part": {"type": "summary_text", "text": text}}]
        started = {"id": item["id"], "type": "reasoning", "summary": []}
    return [{"type": "response.output_item.added", "output_index": index, "item": started}, *middle,
            {"type": "response.output_item.done", "output_index": index, "item": item}]


def _sse(number: int, event: dict[str, Any]) -> bytes:
    event = {**event, "sequence_number": number}
    return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"
