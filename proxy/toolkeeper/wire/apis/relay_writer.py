"""The agent's side of a relayed stream (relay.py): the server's own bytes where nothing is renumbered.

One writer a turn: it numbers the items of every round into one answer (the
agent's index of a round's item), opens the answer once (`opening`, once the
turn's first response or message is known), relays each event (`relayed`:
the API's writer says how), sends at the end the agent's held calls that went
through, and closes (`closing`). A `Run` of events (runs.py) goes on as it
came when the writer's numbering agrees with the server's for all of them.
"""

from __future__ import annotations

from typing import Any

from toolkeeper.engine import TurnResult, Visible
from toolkeeper.wire.ambiguity import read_alike
from toolkeeper.wire.apis.base import TurnWriter
from toolkeeper.wire.apis.relay import FIRST
from toolkeeper.wire.apis.runs import RAW, ROUND, Run


class RelayWriter(TurnWriter):
    """A streamed turn of relayed events: the server's own bytes where nothing is renumbered."""

    def __init__(self, request: Any, keepalive: float):
        super().__init__(request, keepalive)
        self.first: dict[str, Any] | None = None  # the turn's first response or message: the agent's
        self.indexes: dict[tuple[object, int], int] = {}  # (round, the server's index) -> the agent's

    def opening(self) -> list[bytes]:
        """The events that open the answer, once `first` is known (and only once)."""
        raise NotImplementedError

    def relayed(self, event: dict[str, Any]) -> bytes:
        raise NotImplementedError

    async def closing(self, result: TurnResult) -> list[bytes]:
        """The events that end the answer (toolkeeper's closing words, the totals)."""
        raise NotImplementedError

    @staticmethod
    def unpacked(event: dict[str, Any]) -> tuple[bytes | None, object]:
        """An event's own bytes (None: re-encode it) and its round, taken off it: what is left is the event as the
        API has it. Bytes that were parsed go on only when every parser reads them so (wire/ambiguity.py); those
        of a text read by its shape have the structure of such bytes."""
        raw, round_key = event.pop(RAW, None), event.pop(ROUND, None)
        return RelayWriter.as_came(raw, event), round_key

    @staticmethod
    def as_came(raw: bytes | tuple[bytes, int] | None, event: dict[str, Any]) -> bytes | None:
        """An event's own bytes if they may go on as they came (`raw` as `unpacked` takes it off the event)."""
        if type(raw) is tuple:
            data, at = raw
            return data if read_alike(data[at:], event) else None
        return raw  # type: ignore[return-value]

    def number(self, round_key: object, index: int) -> int:
        """The agent's index of a round's item: one sequence over every round."""
        return self.indexes.setdefault((round_key, index), len(self.indexes))

    def unchanged(self, run: Run) -> bool:
        """Whether the agent's index of each item of `run` is the server's (numbering them as their events
        would, in the order they come)."""
        number, round_key = self.number, run.round_key
        return all(number(round_key, index) == index for index in run.indexes)

    def own_index(self) -> int:
        """An index for an item of toolkeeper's own (its closing words), after every relayed one."""
        index = len(self.indexes)
        self.indexes[(None, -1 - index)] = index
        return index

    async def working(self, head: dict[str, Any] | None) -> None:
        await self._send(head, ())  # what the round showed goes out before the tool runs

    async def visible(self, event: Visible) -> None:
        await self._send(event.head, event.relay, event.last)

    async def _send(self, head: dict[str, Any] | None, events: tuple[Any, ...] | list[Any],
                    hold: bool = False) -> None:
        self.first = self.first or (head or {}).get(FIRST)
        parts, relayed = self.opening(), self.relayed
        for event in events:
            parts.append(relayed(event))
        if parts:
            await self.write(b"".join(parts), hold=hold)

    async def finish(self, result: TurnResult) -> None:
        self.first = self.first or result.last.head.get(FIRST)
        parts = self.opening()
        if result.last.held:  # the agent's calls of the last round, held for the rules: those that went through
            allowed = {call.id for call in result.tool_calls}
            parts += [self.relayed(event) for call_id, events in result.last.held if call_id in allowed
                      for event in events]
        parts += await self.closing(result)
        await self.end(b"".join(parts))
