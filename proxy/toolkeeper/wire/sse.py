"""Server-sent events as they arrive from a model server: complete events out, in linear time; text events
read by their shape.

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
        self._after_return = False  # the last read ended in a CR: a LF beginning the next is the same line end

    def feed(self, data: bytes) -> list[bytes]:
        """The events `data` completes (each without its blank line). A line ends in CR LF, LF or a lone CR, as
        the SSE standard says, and as the agent's own parser reads them: a lone CR read as anything else would
        let bytes toolkeeper took for one line be two to the agent (a field it ignores, and a data line)."""
        if self._after_return:
            self._after_return = False
            if data[:1] == b"\n":
                data = data[1:]
                if not data:
                    return []
        if b"\r" in data:
            self._after_return = data[-1:] == b"\r"
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
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


# What the inside of a JSON string holds only escaped (or as its end): a text without these is its own bytes.
NOT_PLAIN = bytes(range(32)) + b'"\\'


class TextShape:
    """A stream's text events differ in their text only: the bytes around it, learnt from an event parsed and
    found to carry a piece of text and nothing else to check, let the next ones be read without parsing them.
    An event with other bytes around its text, or a text with a quote, a backslash or a control character in
    it, does not fit and is parsed. What fits has the learnt event's structure exactly, its text aside: a text
    without those bytes cannot end its string early or spell anything with an escape.

    (Chat Completions' text chunks, and Messages' text deltas of one shown block; not Responses' events,
    which a server numbers one by one, so their bytes differ in more than their text.)"""

    def __init__(self) -> None:
        self.prefix: bytes | None = None
        self.suffix = b""
        self.start = self.end = self.around = 0  # the prefix's and suffix's lengths, kept: read on every event

    def learn(self, event: bytes, text: str) -> bool:
        """Learn the shape of `event`, whose text is `text`; False (and the shape known before kept) when its
        bytes cannot say where the text is."""
        encoded = text.encode()
        if b"\\" in event or event.count(encoded) != 1:
            return False  # the text's bytes must be found once, as themselves: then they are the text's string
        start = event.index(encoded)
        suffix = event[start + len(encoded):]  # at least the string's closing quote
        self.prefix, self.suffix, self.start, self.end = event[:start], suffix, start, -len(suffix)
        self.around = len(event) - len(encoded)
        return True

    def text_of(self, event: bytes) -> str | None:
        """The event's text if it has the learnt shape (None: parse it)."""
        prefix = self.prefix
        if prefix is None or len(event) < self.around or not event.startswith(prefix) \
                or not event.endswith(self.suffix):
            return None
        inside = event[self.start:self.end]
        if inside.translate(None, NOT_PLAIN) != inside:
            return None
        try:
            return inside.decode()
        except UnicodeDecodeError:
            return None  # parsed, to be refused as the JSON it is not
