"""Server-sent events as they arrive from a model server: complete events out, in linear time; text events
read by their shape.

A network read may hold many events, part of one, or the end of one and the
start of the next. Bytes that end no event are kept as pieces and joined only
once the event's blank line arrives, so a server that dribbles one long event
costs linear time; an event larger than `limit` is refused (`EventTooLarge`).
"""

from __future__ import annotations

from typing import Any


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

    (Chat Completions' text chunks, and Messages' text deltas of one shown block; Responses' deltas, which a
    server numbers one by one, so that their bytes differ in more than their text, are `NumberedShape`'s.)"""

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
        self.known(event[:start], event[start + len(encoded):])  # the suffix: at least the string's closing quote
        return True

    def known(self, prefix: bytes, suffix: bytes) -> None:
        """The shape of events `prefix` + a text + `suffix`, whose structure with any plain text is known (learnt
        from one parsed, or one written so that it parses to what its reader expects)."""
        self.prefix, self.suffix, self.start, self.end = prefix, suffix, len(prefix), -len(suffix)
        self.around = len(prefix) + len(suffix)

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


class NumberedShape:
    """A stream whose text events are numbered (Responses' `response.output_text.delta`: `sequence_number`) and
    may carry a padding string (OpenAI's `obfuscation`, random characters that hide each piece's length): the
    bytes around the text, the number and the padding are learnt from one event parsed and found to be a
    piece of text of a shown item, relayable as it came (or from the process's template of such deltas:
    responses/shapes.py). The next event fits when it has those bytes around a plain text (valid UTF-8, with no
    quote, backslash or control character: as `TextShape` reads it; beyond ASCII, printable too), the number
    after the last one read (`expected`), and a padding of plain ASCII (OpenAI's are
    letters and digits): then it has the learnt event's structure exactly, those three values aside. Anything
    else is parsed.

    The learnt bytes are kept as three pieces: before the text (`head`), between the text's closing quote and
    the padding (`middle`; the rest of the event when there is no padding), after the padding (`tail`). The
    number sits inside one of them, kept as the bytes on each side of it."""

    def __init__(self, number_key: bytes = b'"sequence_number":', pad_key: bytes = b'"obfuscation":"') -> None:
        self.number_key = number_key
        self.pad_key = pad_key
        self.head: tuple[bytes, bytes | None] | None = None  # (before the number, after it), or (all, None)
        self.middle: tuple[bytes, bytes | None] = (b"", None)
        self.tail: tuple[bytes, bytes | None] | None = None  # None: no padding
        self.fields: dict[str, Any] = {}  # the learnt event as parsed: the structure of every event that fits
        self.pad = ""  # the padding of the event last read, when the shape has one

    def learn(self, event: bytes, text: str, number: int | None, pad: str | None, fields: dict[str, Any]) -> bool:
        """Learn from `event`, whose text, number and padding are those (None: it has none); False (and the shape
        known before kept) when its bytes cannot say where each is."""
        encoded = text.encode()
        if b"\\" in event or not encoded or event.count(encoded) != 1:
            return False
        start = event.index(encoded)
        end = start + len(encoded)
        cuts = [(start, end)]
        if pad is not None:
            padding = pad.encode()
            at = event.find(self.pad_key) + len(self.pad_key)
            if not _plain_ascii(padding) or event.count(self.pad_key) != 1 or at < end \
                    or event[at + len(padding):at + len(padding) + 1] != b'"':
                return False
            cuts.append((at, at + len(padding)))
        pieces = [event[:start], *(event[cuts[i][1]:cuts[i + 1][0]] for i in range(len(cuts) - 1)),
                  event[cuts[-1][1]:]]
        split: list[tuple[bytes, bytes | None]] = [(piece, None) for piece in pieces]
        if number is not None:
            digits = b"%d" % number
            if event.count(self.number_key) != 1:
                return False
            at = event.index(self.number_key) + len(self.number_key)
            if event[at:at + len(digits)] != digits or event[at + len(digits):at + len(digits) + 1] not in (b",", b"}"):
                return False
            offset = 0
            for position, piece in enumerate(pieces):  # the piece the number is in, cut around it
                inside = at - offset
                if inside >= 0 and inside + len(digits) <= len(piece):
                    split[position] = (piece[:inside], piece[inside + len(digits):])
                    break
                offset += len(piece) + (cuts[position][1] - cuts[position][0] if position < len(cuts) else 0)
            else:
                return False
        self.head = split[0]
        self.middle = split[1]
        self.tail = split[2] if pad is not None else None
        self.fields = fields
        return True

    def read(self, event: bytes, expected: int) -> str | None:
        """The event's text if it has the learnt shape, numbered `expected` (None: parse it); its padding, when
        the shape has one, in `pad`."""
        head = self.head
        if head is None:
            return None
        before = head[0] if head[1] is None else b"%b%d%b" % (head[0], expected, head[1])
        if not event.startswith(before):
            return None
        start = len(before)
        middle = self.middle[0] if self.middle[1] is None else b"%b%d%b" % (self.middle[0], expected, self.middle[1])
        tail = self.tail
        if tail is None:
            end = len(event) - len(middle)
            if end < start or not event.endswith(middle):
                return None
        else:
            end = event.find(b'"', start)
            after = tail[0] if tail[1] is None else b"%b%d%b" % (tail[0], expected, tail[1])
            padded = end + len(middle)
            if end < 0 or not event.startswith(middle, end) or not event.endswith(after) \
                    or padded > len(event) - len(after):
                return None
            padding = event[padded:len(event) - len(after)]
            if not _plain_ascii(padding):
                return None
            self.pad = padding.decode()
        inside = event[start:end]
        if inside.translate(None, NOT_PLAIN) != inside:
            return None  # a quote, a backslash or a control character: parsed
        if inside.isascii():
            return inside.decode()
        try:
            text = inside.decode()
        except UnicodeDecodeError:
            return None  # parsed, to be refused as the JSON it is not
        return text if text.isprintable() else None  # printable: no control character beyond ASCII's either


def _plain_ascii(value: bytes) -> bool:
    return value.isascii() and value.translate(None, NOT_PLAIN) == value
