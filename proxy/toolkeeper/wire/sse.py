"""Server-sent events as they arrive from a model server: complete events out, in linear time.

A network read may hold many events, part of one, or the end of one and the
start of the next. Bytes that end no event are kept as pieces and joined only
once the event's blank line arrives, so a server that dribbles one long event
costs linear time; an event larger than `limit` is refused (`EventTooLarge`).
"""

from __future__ import annotations


class EventTooLarge(ValueError):
    pass


class EventSplitter:
    def __init__(self, limit: int):
        self.limit = limit
        self._pieces: list[bytes] = []
        self._size = 0

    def feed(self, data: bytes) -> list[bytes]:
        """The events `data` completes (each without its blank line)."""
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n")
        ends = b"\n\n" in data or (self._pieces and self._pieces[-1][-1:] == b"\n" and data[:1] == b"\n")
        if not ends:
            self._pieces.append(data)
            self._size += len(data)
            if self._size > self.limit:
                raise EventTooLarge(f"a stream event larger than {self.limit // 2**20} MiB")
            return []
        pending = b"".join(self._pieces) + data if self._pieces else data
        *events, rest = pending.split(b"\n\n")
        self._pieces, self._size = ([rest], len(rest)) if rest else ([], 0)
        if self._size > self.limit:
            raise EventTooLarge(f"a stream event larger than {self.limit // 2**20} MiB")
        return events

    def rest(self) -> bytes:
        """What is left when the stream ends: a last event with no blank line after it, or nothing."""
        return b"".join(self._pieces).strip()
