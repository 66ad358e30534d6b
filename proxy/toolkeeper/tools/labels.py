"""What a tool is to a session: its labels, and what becomes of a secret in its result, as the agent file says.

    tools:
      - name: fetch_page
        labels: [untrusted]          # its output may hold text someone outside wrote
        secrets: redact              # redact (the default) | block | allow
    mcp_servers:
      - name: github
        labels: [untrusted]          # every tool of the server
        tools:
          create_gist: {labels: [egress], secrets: block}   # and this one's own, added to the server's

Three labels mean something toolkeeper knows (`KNOWN_LABELS`); a team may add
its own. A label is a lowercase word (`LABEL`), so that a rule, a record and a
metric read the same name however it was written.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator

from toolkeeper.common import Strict

LABEL = re.compile(r"[a-z][a-z0-9_-]{0,63}")
KNOWN_LABELS = ("egress", "private", "untrusted")
SecretsMode = Literal["redact", "block", "allow"]


def checked_labels(value: tuple[str, ...]) -> tuple[str, ...]:
    """Each label a lowercase word; kept sorted and once, as every reader compares them."""
    for label in value:
        if not LABEL.fullmatch(label):
            raise ValueError(f"{label!r}: a label is a lowercase letter, then up to 63 lowercase letters, digits, "
                             "'_' or '-' (untrusted, private, egress, or a team's own)")
    return tuple(sorted(set(value)))


Labels = Annotated[tuple[str, ...], AfterValidator(checked_labels)]


class McpToolSettings(Strict):
    """One tool of an MCP server, under the server's `tools:`: its own labels (added to the server's) and what
    becomes of a secret in its result (the server's `secrets:` when it says nothing)."""

    labels: Labels = ()
    secrets: SecretsMode | None = None
