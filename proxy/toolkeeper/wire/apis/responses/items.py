"""Responses API items, to and from the engine's neutral (Chat Completions) form, losing nothing.

The engine and its history work on chat messages. An agent's `input` becomes
such messages, each carrying the items it came from (`_items`), so that the
model server always gets back the agent's items verbatim:

    user/system/developer message        -> {"role": role, "content": ...}
    assistant items in a row: reasoning,
      message, the calls the agent runs,
      item_reference, server tool calls   -> one {"role": "assistant", "content": text, "tool_calls": [...]}
    a call's output item                  -> {"role": "tool", "tool_call_id": call_id, "content": output}

The calls the agent runs (`AGENT_CALLS`) are its function and custom tools and
the built-ins: `shell_call`, `local_shell_call`, `apply_patch_call`,
`computer_call`. Each reaches the rules as a call named for its tool
(`shell`, ...), with the fields the rules read (`action`, `operation`); a
result toolkeeper gives the model goes back as the output item its type
expects (`shell_call_output`, an `apply_patch_call_output` that failed, ...).

Grouping a response's items into one assistant message is what lets the
history recognise what the agent received, whether it resends the items with
their ids, as references, or with ids stripped: the key reads the role, the
text and the calls (by `call_id`), never an item id.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from typing import Any

from toolkeeper.engine import Round, ToolCall
from toolkeeper.wire.apis.base import Field, field_problem, first_problem
from toolkeeper.wire.apis.relay import shown_entries

ITEMS = "_items"  # the original items of a neutral message
CALL_ITEM = "_item"  # the original item of a call


@dataclass(frozen=True)
class AgentCall:
    """One type of call item the agent runs: the tool name the rules see, the item's field they read as the
    arguments (None: its own `arguments` or `input`), and the output item that answers it."""

    tool: str | None  # None: the item's own `name`
    reads: str | None
    output: str


AGENT_CALLS = {
    "function_call": AgentCall(None, None, "function_call_output"),
    "custom_tool_call": AgentCall(None, None, "custom_tool_call_output"),
    "shell_call": AgentCall("shell", "action", "shell_call_output"),
    "local_shell_call": AgentCall("local_shell", "action", "local_shell_call_output"),
    "apply_patch_call": AgentCall("apply_patch", "operation", "apply_patch_call_output"),
    "computer_call": AgentCall("computer", "action", "computer_call_output"),
}
CALL_TYPES = tuple(AGENT_CALLS)
# The tool entries the agent runs itself (its functions and the built-ins it executes), and a hosted MCP server
# (each of its calls asks first: model.py). Any other type is a tool the model server runs (web_search,
# file_search, code_interpreter, image_generation, and types to come): governed on the offer, never passed unseen.
NOT_HOSTED = frozenset({"function", "custom", "namespace", "shell", "local_shell", "apply_patch", "computer",
                        "computer_use_preview", "mcp"})
# A hosted tool's name for the rules: its type without a preview or a date (web_search_preview_2025_03_11 and
# web_search_2025_08_26 are web_search).
VERSIONED = re.compile(r"(_preview)?(_\d{4}_\d{2}_\d{2})?$")
# Their calls in an answer: item type -> (the tool's name, the fields the rules read, the field holding the output).
HOSTED_CALLS = {"web_search_call": ("web_search", ("action",), None),
                "file_search_call": ("file_search", ("queries",), "results"),
                "code_interpreter_call": ("code_interpreter", ("code", "container_id"), "outputs"),
                "image_generation_call": ("image_generation", (), "result"),
                "mcp_call": (None, ("server_label", "name", "arguments"), "output")}
OUTPUT_TYPES = tuple(call.output for call in AGENT_CALLS.values())
INPUT_ROLES = ("user", "system", "developer")
ROLES = (*INPUT_ROLES, "assistant")  # a message item's, in an agent's input
# Input items the API defines, and the shape each must have (checked before anything is sent).
REQUIRED = {"function_call": ("call_id", "name"), "custom_tool_call": ("call_id", "name"),
            **{kind: ("call_id",) for kind in CALL_TYPES if AGENT_CALLS[kind].tool},
            **{output: ("call_id",) for output in OUTPUT_TYPES}, "item_reference": ("id",), "reasoning": ()}
BLANK_SCREEN = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8"
                "AAAAASUVORK5CYII=")  # 1x1: a computer call that did not run has no screen to show


def messages_from_input(value: Any, known: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The agent's `input` (a string, or items) as neutral messages; `known`: the items an `item_reference`
    may stand for (the ones toolkeeper handed out), read for what they say while the reference is kept."""
    if isinstance(value, str):
        return [{"role": "user", "content": value, ITEMS: [{"role": "user", "content": value}]}]
    messages: list[dict[str, Any]] = []
    for item in value:
        kind = item.get("type", "message")
        role = item.get("role")
        if kind == "message" and role in INPUT_ROLES:
            messages.append({"role": role, "content": item.get("content"), ITEMS: [item]})
        elif kind in OUTPUT_TYPES:
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": item.get("output"),
                             ITEMS: [item]})
        elif kind == "mcp_approval_response":  # the agent's own answer to a hosted MCP call it was asked about
            messages.append({"role": "tool", "tool_call_id": item.get("approval_request_id"), ITEMS: [item],
                             "content": "approved" if item.get("approve") else f"denied: {item.get('reason') or ''}"})
        else:  # what a response produced: grouped while they follow each other
            if not messages or messages[-1]["role"] != "assistant":
                messages.append({"role": "assistant", "content": None, ITEMS: []})
            said = (known or {}).get(item.get("id")) if kind == "item_reference" else item
            _join(messages[-1], item, said or item)
    return messages


def _join(message: dict[str, Any], item: dict[str, Any], said: dict[str, Any]) -> None:
    message[ITEMS].append(item)
    text = item_text(said)
    if text:
        message["content"] = (message["content"] or "") + text
    if said.get("type") in CALL_TYPES:
        message.setdefault("tool_calls", []).append(call_entry(said))


def item_text(item: dict[str, Any]) -> str:
    """The text an assistant message item says (its output_text parts, or an easy message's string)."""
    if item.get("type", "message") != "message" or item.get("role", "assistant") != "assistant":
        return ""
    content = item.get("content")
    if isinstance(content, str):
        return content
    texts = []
    for part in content or ():
        if isinstance(part, dict) and part.get("type") == "output_text":
            texts.append(part.get("text", ""))
    return "".join(texts)


def answer_texts(items: Any) -> tuple[Any, ...]:
    """The texts of output items' parts (of a response, or one item: `[item]`)."""
    texts = []
    for item in items if type(items) is list else ():
        for part in (item.get("content") if type(item) is dict else None) or ():
            if type(part) is dict:
                texts.append(part.get("text"))
    return tuple(texts)


def call_name(item: dict[str, Any]) -> str:
    """The tool a call item calls, as the rules name it: a function's own name (`namespace.name` for a call with a
    namespace, as the Agents SDK names it: never a declared tool's), or the built-in's
    (`shell`), a hosted MCP server's tool as `mcp__<server_label>__<tool>`; a call of a kind toolkeeper does not
    know goes by its name, or its type."""
    if item["type"] == APPROVAL:
        return f"mcp__{item.get('server_label')}__{item.get('name')}"
    known = AGENT_CALLS.get(item["type"])
    if known is not None and known.tool is not None:
        return known.tool
    name, namespace = str(item.get("name") or item["type"]), item.get("namespace")
    return f"{namespace}.{name}" if isinstance(namespace, str) and namespace else name


def call_kind(item: dict[str, Any]) -> str:
    """A call's `tool.kind` for the rules: `function` for a function or custom tool's, as on every API; a built-in's
    own item type (`shell_call`, ...)."""
    return "function" if item["type"] in ("function_call", "custom_tool_call") else item["type"]


APPROVAL = "mcp_approval_request"  # a hosted MCP server's call, asking before the model server runs it
CALL_KINDS = frozenset((*CALL_TYPES, APPROVAL))
APPROVED = "Approved by toolkeeper: the rules allow this call."  # the answer that approves one


def is_call(item: dict[str, Any]) -> bool:
    """A call to decide on: one the agent runs, a hosted MCP server's approval request, or one of a kind
    toolkeeper does not know (a newer built-in, `..._call` and not a hosted tool's: it is denied, never
    relayed)."""
    kind = item.get("type")
    return type(kind) is str and (kind in CALL_KINDS or (kind.endswith("_call") and kind not in HOSTED_CALLS))


def wants_approval(tool: dict[str, Any], name: str) -> bool:
    """Whether the agent asked to approve a hosted MCP server's call of `name` itself (`require_approval`, whose
    default is "always")."""
    asked = tool.get("require_approval", "always")
    if isinstance(asked, dict):
        never = (asked.get("never") or {}).get("tool_names") or []
        always = (asked.get("always") or {}).get("tool_names")
        return name not in never and (always is None or name in always)
    return asked != "never"


def call_arguments(item: dict[str, Any]) -> Any:
    """What the rules read of a call item: a function's JSON arguments (text), a custom tool's input as
    {"input": ...}, a built-in's action or operation as {"action": ...}; an unknown kind's fields as they came."""
    if item["type"] == APPROVAL:
        return item.get("arguments")
    if item["type"] not in AGENT_CALLS:
        return {key: value for key, value in item.items() if key not in ("id", "type", "status", "call_id")}
    reads = AGENT_CALLS[item["type"]].reads
    if reads is not None:
        return {reads: item.get(reads)}
    return item.get("arguments") if item["type"] == "function_call" else {"input": item.get("input")}


def call_entry(item: dict[str, Any]) -> dict[str, Any]:
    """A call item as the neutral message's call: its text as `ToolCall.arguments_text` writes it."""
    return ToolCall(item.get("call_id"), call_name(item), call_arguments(item) or "").as_message_entry()


def input_from_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Neutral messages back to `input` items: the originals where there are, made ones for what toolkeeper
    added (the results of declared calls, the refusals of the agent's, its own closing words)."""
    items: list[dict[str, Any]] = []
    answering: dict[Any, str] = {}  # call id -> the type of the call a result answers
    for message in messages:
        if ITEMS in message:
            items.extend(message[ITEMS])
            for item in message[ITEMS]:
                if is_call(item):
                    answering[call_id_of(item)] = item["type"]
        elif message.get("role") == "tool":
            items += output_items(answering.get(message.get("tool_call_id"), "function_call"),
                                  message.get("tool_call_id"), str(message.get("content") or ""))
        else:
            items.append({"role": message.get("role"), "content": message.get("content") or ""})
    return items


def output_items(kind: str, call_id: Any, text: str) -> list[dict[str, Any]]:
    """toolkeeper's answer to a call of type `kind` (a declared call's result, a refusal), as the output item
    that type expects; a computer call, whose output is a screen, gets the words in a developer message."""
    if kind == APPROVAL:  # toolkeeper's answer to a hosted MCP call's approval request
        approved = text == APPROVED
        return [{"type": "mcp_approval_response", "approval_request_id": call_id, "approve": approved,
                 **({} if approved else {"reason": text})}]
    if kind not in AGENT_CALLS:  # a kind toolkeeper does not know: its output type by the API's naming, and words
        return [{"type": f"{kind}_output", "call_id": call_id, "output": text}, {"role": "developer", "content": text}]
    output = AGENT_CALLS[kind].output
    if kind == "shell_call":
        return [{"type": output, "call_id": call_id,
                 "output": [{"stdout": "", "stderr": text, "outcome": {"type": "exit", "exit_code": 1}}]}]
    if kind == "apply_patch_call":
        return [{"type": output, "call_id": call_id, "status": "failed", "output": text}]
    if kind == "computer_call":
        return [{"type": output, "call_id": call_id, "output": {"type": "computer_screenshot",
                                                                "image_url": BLANK_SCREEN}},
                {"role": "developer", "content": text}]
    return [{"type": output, "call_id": call_id, "output": text}]


def call_id_of(item: dict[str, Any]) -> str:
    """A call item's id, as the engine, the relay and the filters all read it."""
    return str(item.get("call_id") or item.get("id") or "")


def hosted_tool(entry: Any) -> tuple[str, str] | None:
    """A tool entry the model server runs itself and that cannot be asked per call, as (its name for the rules,
    its kind); None for the agent's, and for a hosted MCP server (each of its calls asks first: model.py)."""
    kind = entry.get("type") if isinstance(entry, dict) else None
    if not isinstance(kind, str) or kind in NOT_HOSTED:
        return None
    return VERSIONED.sub("", kind) or kind, kind


def observed_call(item: dict[str, Any]) -> ToolCall:
    """A call the model server ran within its answer, for the record."""
    name, reads, output = HOSTED_CALLS[item["type"]]
    if name is None:  # a hosted MCP server's tool, named as Claude Code names MCP tools
        name = f"mcp__{item.get('server_label')}__{item.get('name')}"
    return ToolCall(str(item.get("id") or ""), name, {key: item.get(key) for key in reads},
                    {"output": item.get(output) if output else None}, item["type"])


def round_from_response(response: dict[str, Any], raw: bytes | None = None) -> Round:
    """One upstream response as the engine's Round (in one loop over its items: a message says text, a call is
    to decide on, a hosted tool's call is recorded)."""
    items: list[dict[str, Any]] = []
    calls: list[ToolCall] = []
    texts: list[str] = []
    observed: list[ToolCall] = []
    for item in response.get("output") or ():
        if not isinstance(item, dict):
            continue
        items.append(item)
        kind = item.get("type")
        if kind is None or kind == "message":
            texts.append(item_text(item))
        elif is_call(item):
            calls.append(ToolCall(call_id_of(item), call_name(item), call_arguments(item), {CALL_ITEM: item},
                                  call_kind(item), known=kind in CALL_TYPES or kind == APPROVAL,
                                  source="hosted" if kind == APPROVAL else "agent"))
        elif kind in HOSTED_CALLS:
            observed.append(observed_call(item))
    text = "".join(texts)
    status = response.get("status")
    finish = "tool_calls" if calls else ("length" if status == "incomplete" else "stop")
    fields = dict(response)  # the response but its items and usage
    fields.pop("output", None)
    fields.pop("usage", None)
    head = {"id": response.get("id"), "created_at": response.get("created_at"), "model": response.get("model"),
            "response": fields}
    found = Round(head, {"content": text or None, ITEMS: items}, calls, finish, response.get("usage"), raw=raw)
    found.observed = observed
    return found


def visible_items(items: list[dict[str, Any]], hidden: set[str], allowed: set[str] | None = None,
                  ) -> list[dict[str, Any]]:
    """The items the agent may see (`relay.shown_entries`): a reasoning item travels with the item it precedes."""
    return shown_entries(items, hidden, allowed, held=("reasoning",), is_call=is_call, id_of=call_id_of,
                         name_of=call_name)


def said_item(text: str) -> dict[str, Any]:
    """toolkeeper's own closing words (a turn it ended), as a message item."""
    return {"id": "msg_" + secrets.token_hex(16), "type": "message", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def flat_tool(entry: dict[str, Any]) -> dict[str, Any]:
    """A tool entry for the Responses API: a declared tool's chat-shaped schema flattened; others as they are."""
    function = entry.get("function")
    if entry.get("type") == "function" and isinstance(function, dict):
        return {"type": "function", **function}
    return entry


def check_request(body: dict[str, Any]) -> str | None:
    """What is wrong with a Responses request, in the words a 400 gives; None when it can be served."""
    value = body.get("input")
    if not isinstance(value, (str, list)):
        return "'input' must be a string or a list of items"
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or any(not isinstance(t, dict) or
                                                                  not isinstance(t.get("type"), str) for t in tools)):
        return "'tools' must be a list of tool objects, each with a 'type'"
    return ((None if isinstance(value, str) or _plain_input(value)
             else first_problem(value, _check_item, "input", "item"))
            or (first_problem(tools, _function_tool_problem, "tools", "tool") if tools else None)
            or field_problem(body, REQUEST_FIELDS))


def _plain_input(items: list[Any]) -> bool:
    """The usual input, read in one loop: messages of a role and a content that `_check_item` takes (the others
    it reads one by one, to say what is wrong)."""
    for item in items:
        if type(item) is not dict or item.get("type", "message") != "message" or item.get("role") not in ROLES \
                or type(item.get("content")) not in (str, list):
            return False
    return True


REQUEST_FIELDS: tuple[Field, ...] = (
    ("tool_choice", (str, dict), "'tool_choice' must be a string or an object"),
    *((key, (bool,), f"'{key}' must be true or false") for key in ("stream", "store", "parallel_tool_calls")),
    *((key, (str,), f"'{key}' must be a string") for key in ("previous_response_id", "instructions", "model")),
)


def _function_tool_problem(tool: dict[str, Any]) -> str | None:
    if tool.get("type") == "function" and not isinstance(tool.get("name"), str):
        return "a function tool needs a 'name' string"
    if tool.get("type") == "mcp" and not isinstance(tool.get("server_label"), str):
        return "an mcp tool needs a 'server_label' string"  # its calls are named and decided by it
    return None


def _check_item(item: dict[str, Any]) -> str | None:
    kind = item.get("type", "message")
    if not isinstance(kind, str):
        return "an item's 'type' must be a string"
    if kind == "message":
        if item.get("role") not in ROLES:
            return "a message needs a 'role': user, system, developer or assistant"
        if not isinstance(item.get("content"), (str, list)):
            return "a message's 'content' must be a string or a list of parts"
        return None
    for key in REQUIRED.get(kind, ()):
        if not isinstance(item.get(key), str):
            return f"a {kind} item needs a '{key}' string"
    if kind == "function_call" and not isinstance(item.get("arguments", ""), str):
        return "a function_call's 'arguments' must be a JSON string"
    return None
