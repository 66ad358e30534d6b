"""What an ask says to a channel: a signed Standard Webhooks message, or a Slack incoming-webhook message.

Both are made from the waiting call as a person may see it (its arguments and
argv were redacted before the approval was written) and the link to it in the
console. Nothing here sends anything: sender.py does.

A webhook (https://www.standardwebhooks.com):

    webhook-id: msg_...              the same on every attempt at one message
    webhook-timestamp: 1767225600    this attempt's, in Unix seconds
    webhook-signature: v1,<base64 of HMAC-SHA256(key, "{id}.{timestamp}.{body}")>

where the key is a `whsec_<base64>` secret's decoded bytes, any other secret's
UTF-8 bytes. The body is `{"type": "approval.requested", "timestamp": ...,
"data": {...}}`, the same bytes on every attempt.

A Slack message is Block Kit within Slack's documented limits (each text cut
with a marker), every value escaped for mrkdwn (&, <, > as entities, so a
value can neither mention a channel nor make a link) and for a person's eyes
(control and bidirectional characters written as escapes), and the arguments
in a code block no value can close.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from datetime import UTC, datetime
from typing import Any

from toolkeeper.common import dumps, printable

EVENT = "approval.requested"
SECRET_PREFIX = "whsec_"  # noqa: S105 - the prefix of a Standard Webhooks secret, not one
CUT = "… (cut)"
# Slack's limits (api.slack.com/reference/block-kit): characters of each text, items of each list
HEADER_TEXT = 150
SECTION_TEXT = 3000
FIELD_TEXT = 2000
FIELDS = 10
BLOCKS = 50
BUTTON_TEXT = 75
BUTTON_URL = 3000
MESSAGE_TEXT = 40_000
# Slack refuses a message whose blocks hold more than some 13,000 characters in all (msg_blocks_too_long; not
# documented, seen by slackapi/bolt-js#2509): what each part may take here keeps the whole under 7,000
SHOWN_FIELD = 300
SHOWN_COMMAND = 1500
SHOWN_REASON = 1000


class SecretError(ValueError):
    """A signing secret that cannot be used: `whsec_` followed by what is not base64."""


def signing_key(secret: str) -> bytes:
    """The HMAC key: a `whsec_` secret's base64 decoded (as Standard Webhooks' libraries read it), else the
    secret's own bytes."""
    if not secret.startswith(SECRET_PREFIX):
        return secret.encode()
    try:
        key = base64.b64decode(secret[len(SECRET_PREFIX):], validate=True)
    except binascii.Error:
        raise SecretError("the signing secret starts with whsec_ but what follows is not base64") from None
    if not key:
        raise SecretError("the signing secret is whsec_ and nothing else")
    return key


def signature(key: bytes, message_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` header's value for one attempt."""
    mac = hmac.new(key, f"{message_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def signed_headers(key: bytes, message_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    return {"Content-Type": "application/json", "webhook-id": message_id, "webhook-timestamp": str(timestamp),
            "webhook-signature": signature(key, message_id, timestamp, body)}


def iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def webhook_body(approval: dict[str, Any], link: str) -> bytes:
    """The webhook's JSON: the event, when it happened, and the call."""
    created = approval.get("created") or 0.0
    data = {"id": approval["id"], "tool": approval["tool"], "arguments": approval.get("arguments"),
            "argv": approval.get("argv") or [], "agent": approval.get("agent"),
            "user": approval.get("principal_user"), "rule": approval.get("rule"), "reason": approval.get("why"),
            "source": approval.get("source"), "created": created, "expires": approval.get("expires"), "url": link}
    return dumps({"type": EVENT, "timestamp": iso(created), "data": data})


def shown_arguments(arguments: Any) -> str:
    """The arguments as the console shows them: JSON, indented, as written (not \\u-escaped)."""
    try:
        return json.dumps(arguments, indent=2, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return "(the arguments cannot be shown as JSON)"


def mrkdwn(text: Any, *, lines: bool = True) -> str:
    """A value for Slack's mrkdwn: control characters escaped for a person, then &, < and > as entities.
    `lines=False` (a field's one value): newlines escaped too, and the marks of emphasis (*, _, ~, `) kept from
    acting, so a value cannot write a line of its own that looks like one of the message's labels."""
    shown = printable(str(text), keep_newlines=lines)
    shown = shown.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    if not lines:
        for mark in "*_~`":
            shown = shown.replace(mark, mark + "\u200b")
    return shown


def cut(text: str, most: int) -> str:
    """At most `most` characters; a longer text ends with the marker, never inside an entity (&amp;)."""
    if len(text) <= most:
        return text
    kept = text[:most - len(CUT)]
    entity = kept.rfind("&")
    if entity != -1 and ";" not in kept[entity:]:
        kept = kept[:entity]
    return kept + CUT


def code_block(label: str, text: str, most: int) -> str:
    """`*label*` and a code block of `text`, within `most` characters. No two backticks stand together in it
    (a zero-width space between them), so a value cannot close the block and write outside it."""
    safe = mrkdwn(text)
    while "``" in safe:
        safe = safe.replace("``", "`\u200b`")
    head, tail = f"*{label}*\n```\n", "\n```"
    return head + cut(safe, most - len(head) - len(tail)) + tail


def slack_message(approval: dict[str, Any], link: str) -> dict[str, Any]:
    """An incoming webhook's message: a fallback `text` (what a notification shows) and the blocks."""
    tool, approval_id = str(approval["tool"]), str(approval["id"])
    user = approval.get("principal_user")
    fields = [("Tool", tool), ("Agent", approval.get("agent") or "?"), ("For whom", user or "the agent alone"),
              ("Rule", approval.get("rule") or approval.get("source") or "?")]
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": cut(printable(f"Approve {tool}?"), HEADER_TEXT),
                                    "emoji": False}},
        {"type": "section", "fields": [{"type": "mrkdwn", "text": cut(f"*{name}*\n{mrkdwn(value, lines=False)}",
                                                                       SHOWN_FIELD)}
                                       for name, value in fields[:FIELDS]]},
        {"type": "section", "text": {"type": "mrkdwn", "text": code_block(
            "Arguments", shown_arguments(approval.get("arguments")), SECTION_TEXT)}},
    ]
    if approval.get("argv"):
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": code_block(
            "Command", shown_arguments(approval["argv"]), SHOWN_COMMAND)}})
    if approval.get("why"):
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": cut(
            f"*Why it asks*\n{mrkdwn(approval['why'])}", SHOWN_REASON)}})
    expires = approval.get("expires")
    if expires:  # Slack writes the time in the reader's own zone; the text after | where it cannot
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": (
            f"{mrkdwn(approval_id)}: denied unless someone approves it by "
            f"<!date^{int(expires)}^{{date_short_pretty}} at {{time_secs}}|{iso(expires)}>")}]})
    if len(link) <= BUTTON_URL:
        blocks.append({"type": "actions", "elements": [{
            "type": "button", "action_id": "open", "style": "primary", "url": link,
            "text": {"type": "plain_text", "text": cut("Open in toolkeeper", BUTTON_TEXT)}}]})
    text = cut(f"toolkeeper: {mrkdwn(tool)} waits for approval ({mrkdwn(approval_id)}), asked by "
               f"{mrkdwn(approval.get('agent') or '?')}: {mrkdwn(link)}", MESSAGE_TEXT)
    return {"text": text, "blocks": blocks[:BLOCKS]}
