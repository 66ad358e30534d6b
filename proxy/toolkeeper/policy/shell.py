"""A shell command string read as bash would: the simple commands in it, each as the words it would run.

The grammar is tree-sitter-bash's (the one Codex CLI reads `bash -lc` with).
Every `command` node anywhere in the tree is a simple command toolkeeper
reports: after `&&`, `||`, `;`, `&`, in pipes, `( )`, `{ }`, `if`/`while`/
`for`/`case` bodies, function bodies, `$(...)`, backticks, `<(...)`, and in
the values of assignments and `export`. A word is taken as bash would make
it: quotes and backslashes removed, `$'...'` decoded, braces expanded
(`{rm,-rf,/}` is three words); a word that comes from a variable, a
substitution or arithmetic cannot be known and is None. What the parser
cannot read (an ERROR node, a missing token) is a problem: the caller fails
closed. Wrappers (`sudo`, `bash -c`, `xargs`...) are unwrapped in commands.py.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from functools import lru_cache

import tree_sitter_bash
from tree_sitter import Language, Node, Parser

from toolkeeper.policy.arithmetic import ArithmeticReading
from toolkeeper.policy.grammar import ARITHMETIC, ARITHMETIC_NODES, EXPANSIONS, NODE_KINDS, TOKENS, WRITING
from toolkeeper.policy.words import literal, text_of, words_of

_BASH = Language(tree_sitter_bash.language())
_PARSERS = threading.local()  # a parser is not for two threads at once (the console replays in a thread)



@dataclass(frozen=True)
class SimpleCommand:
    words: tuple[str | None, ...]  # None: a word known only at run time (a variable, a substitution)
    writes: tuple[str | None, ...] = ()  # where its output is redirected to (None: a target known at run time)
    stdin: str | None = None  # the script text a heredoc or herestring feeds it (None: none, or not known)
    fed: bool = False  # its input comes from a pipe, or a heredoc/herestring toolkeeper cannot read
    reads: tuple[str | None, ...] = ()  # files redirected to its input (`cat < ~/.ssh/id_rsa`)
    assignments: tuple[tuple[str, str | None], ...] = ()  # `NAME=value` before it, or alone (no words)
    descriptors: tuple[tuple[str, str | None], ...] = ()  # a heredoc on another descriptor: (3, its text)


@dataclass(frozen=True)
class ParsedScript:
    commands: tuple[SimpleCommand, ...]
    problems: tuple[str, ...]  # what the parser could not read: the caller fails closed


@lru_cache(maxsize=4096)
def parse_script(text: str) -> ParsedScript:
    """The simple commands a bash script runs, in the order they are written."""
    source = text.encode("utf-8", "surrogatepass")
    tree = _parser().parse(source)
    walk = _Walk(source)
    if any(blank in text for blank in "\r\v\f"):
        # tree-sitter takes them for blanks, bash for a word's characters (`echo a\r#; rm -rf ~` runs rm)
        walk.problems.append("a carriage return, vertical tab or form feed, which bash and its grammar read apart")
    walk.visit(tree.root_node, _Context())
    return ParsedScript(tuple(walk.commands), tuple(walk.problems))


def _parser() -> Parser:
    parser = getattr(_PARSERS, "parser", None)
    if parser is None:
        parser = _PARSERS.parser = Parser(_BASH)
    return parser


@dataclass(frozen=True)
class _Context:
    writes: tuple[str | None, ...] = ()
    stdin: str | None = None
    fed: bool = False
    reads: tuple[str | None, ...] = ()


class _Walk(ArithmeticReading):
    def __init__(self, source: bytes) -> None:
        self.source = source
        self.commands: list[SimpleCommand] = []
        self.problems: list[str] = []
        self.tainted: set[str] = set()  # variables whose text may hold a substitution (see _arithmetic_reads)

    def visit(self, node: Node, context: _Context) -> None:
        if not self._readable(node) or not node.is_named:
            return  # not read (the problem is said), or punctuation
        kind = node.type
        if kind == "command":
            self._command(node, context)
        elif kind == "redirected_statement":
            self._redirected(node, context)
        elif kind == "pipeline":
            self._pipeline(node, context)
        elif kind == "command_substitution" and text_of(node).startswith("`") and "\\`" in text_of(node):
            inner = parse_script(re.sub(r"\\([`$\\])", r"\1", text_of(node)[1:-1]))  # nested backticks: bash
            self.commands.extend(inner.commands)                                    # unescapes, then runs them
            self.problems.extend(inner.problems)
        elif kind in ("command_substitution", "process_substitution"):
            # a command of its own: the outer one's redirections are not its; `>(sh)` reads what is written to it
            fed = kind == "process_substitution" and text_of(node).startswith(">(")
            for child in node.children:
                self.visit(child, _Context(fed=fed))
        elif kind == "variable_assignment":
            self.commands.append(SimpleCommand((), assignments=(self._assignment(node),)))
        elif kind in ("declaration_command", "unset_command"):
            self._declaration(node)
        else:
            if kind == "test_command":
                self._arithmetic(node)
            if kind in ARITHMETIC_NODES or (kind == "compound_statement" and text_of(node).startswith("((")):
                self._arithmetic_reads(node)
            for child in node.children:
                self.visit(child, context)

    def _readable(self, node: Node) -> bool:
        """Whether the walk reads this node; if not, the problem is said (the caller fails closed): a parse
        error, a missing token, a kind of node or a token it does not know."""
        line, column = node.start_point[0] + 1, node.start_point[1] + 1
        if node.type == "ERROR" or node.is_missing:
            self.problems.append(f"bash cannot parse it (line {line}, column {column})")
        elif node.is_named and node.type not in NODE_KINDS:
            self.problems.append(f"toolkeeper does not read bash's {node.type} (line {line}, column {column})")
        elif not node.is_named and (node.type not in TOKENS or text_of(node) != node.type):
            self.problems.append(f"toolkeeper does not read the token {text_of(node)!r} (line {line}, column {column})")
        else:
            return True
        return False

    def _pipeline(self, node: Node, context: _Context) -> None:
        index = 0
        for child in node.children:
            if not child.is_named:
                self._readable(child)
                continue
            fed = context.fed if index == 0 else True
            self.visit(child, _Context(context.writes, context.stdin if index == 0 else None, fed,
                                       context.reads if index == 0 else ()))
            index += 1

    def _redirected(self, node: Node, context: _Context) -> None:
        writes, stdin, fed, reads = list(context.writes), context.stdin, context.fed, list(context.reads)
        body = node.child_by_field_name("body")
        extra: list[str | None] = []
        descriptors: list[tuple[str, str | None]] = []
        for child in node.children:
            if child == body or not self._readable(child) or not child.is_named:
                continue
            target, kind, words = self._redirect(child, descriptors)
            extra.extend(words)
            stdin, fed = _redirected(kind, target, writes, reads, stdin, fed)
        if descriptors:
            self.problems.append("a compound command reads a heredoc on another descriptor")
        if body is not None:
            self._redirect_into(body, context, _Context(tuple(writes), stdin, fed, tuple(reads)), extra)

    def _redirect_into(self, body: Node, outer: _Context, inner: _Context, extra: list[str | None]) -> None:
        """tree-sitter hangs `a && b > f` and `a | b > f` on the whole list; bash gives the redirection to the last
        command only. A group (`{ a; b; } > f`) passes it to all of its commands."""
        if body.type == "command":
            self._command(body, inner, extra)
        elif body.type in ("list", "pipeline") and body.named_children:
            *first, last = body.named_children
            piped = body.type == "pipeline"
            for index, child in enumerate(first):
                fed = outer.fed if index == 0 or not piped else True
                self.visit(child, _Context(outer.writes, outer.stdin if index == 0 else None, fed,
                                           outer.reads if index == 0 else ()))
            if piped and inner.stdin is None:  # its input is the pipe unless the redirection gives it another
                inner = _Context(inner.writes, None, True, inner.reads)
            self._redirect_into(last, outer, inner, extra)
        else:
            if extra:
                self.problems.append("words after a redirection of a compound command")
            self.visit(body, inner)

    def _redirect(self, node: Node, descriptors: list[tuple[str, str | None]],
                  descriptor: str | None = None) -> tuple[str | None, str, list[str | None]]:
        """(target, kind, words): a file written to (write), or the script text fed to stdin (script); and the
        command's words that follow the target (`rm 2>/dev/null -rf /`: tree-sitter puts -rf and / here). A
        heredoc or herestring on another descriptor than the input (`3<<EOF`) joins `descriptors`."""
        for child in node.children:
            if not self._readable(child):
                return None, "", []
            if child.type in EXPANSIONS or child.type in ("string", "concatenation", "heredoc_body"):
                self._nested(child)
            if child.type == "file_descriptor":
                descriptor = text_of(child)
        if node.type == "file_redirect":
            operator = next((c.type for c in node.children if not c.is_named), "")
            destinations = node.children_by_field_name("destination")
            words = [word for extra in destinations[1:] for word in words_of(extra)]
            if operator in WRITING and destinations and destinations[0].type != "number":
                return literal(destinations[0]), "write", words
            if operator == "<" and destinations:
                read = literal(destinations[0])
                if read is None:
                    return None, "script", words  # input from a substitution or a variable: a shell's script unseen
                return read, "read", words
            return None, "", words
        text: str | None = ""
        if node.type == "herestring_redirect":
            target = node.named_children[-1] if node.named_children else None
            text = literal(target) if target is not None else None
        elif node.type == "heredoc_redirect":
            self._after_heredoc(node)
            body = next((c for c in node.named_children if c.type == "heredoc_body"), None)
            known = body is None or not any(c.type in EXPANSIONS for c in body.named_children)
            text = (text_of(body) if body is not None else "") if known else None
            start = next((text_of(c) for c in node.named_children if c.type == "heredoc_start"), "")
            if body is not None and "`" in text_of(body) and not any(q in start for q in "'\"\\"):
                # the shell runs an unquoted heredoc's backticks; its grammar gives them no node to read
                self.problems.append("backticks in a heredoc, which toolkeeper does not read")
        if descriptor not in (None, "0"):
            descriptors.append((descriptor, text))  # type: ignore[arg-type]
            return None, "", []
        return text, "script", []

    def _after_heredoc(self, node: Node) -> None:
        """tree-sitter puts what follows `<<EOF` on its line (`| sh`, `&& rm ...`) inside the heredoc's node."""
        for child in node.named_children:
            if child.type in ("heredoc_start", "heredoc_body", "heredoc_end", "heredoc_content"):
                continue
            if child.type == "pipeline":  # `| sh`: each command after the pipe reads the one before
                for piped in child.named_children:
                    self.visit(piped, _Context(fed=True))
            else:
                self.visit(child, _Context())

    def _nested(self, node: Node) -> None:
        """The commands inside a word (its substitutions), each a command of its own."""
        if not self._readable(node):
            return
        if node.type in ("command_substitution", "process_substitution"):
            self.visit(node, _Context())
            return
        if node.type in ARITHMETIC_NODES:
            self._arithmetic_reads(node)
        if node.type == "expansion" and "@P" in text_of(node):  # `${x@P}` expands x as a prompt: runs its $(...)
            self.problems.append("a prompt expansion (@P) runs what the variable holds")
        if node.is_named and (node.type == "command" or NODE_KINDS[node.type] == "statement"):
            # a command where bash reads a word (`echo (rm -rf /x)`: fish's substitution, a syntax error to bash)
            self.problems.append(f"a {node.type} where bash expects a word")
            self.visit(node, _Context())
            return
        for child in node.children:
            self._nested(child)

    def _command(self, node: Node, context: _Context, extra: list[str | None] | None = None) -> None:
        words: list[str | None] = []
        last_end: int | None = None
        writes, stdin, fed, reads = list(context.writes), context.stdin, context.fed, list(context.reads)
        assignments: list[tuple[str, str | None]] = []
        descriptors: list[tuple[str, str | None]] = []
        children = node.children
        for index, child in enumerate(children):
            following = children[index + 1] if index + 1 < len(children) else None
            if child.type == "$" and text_of(child) == "$" and following is not None \
                    and following.type == "string" and following.start_byte == child.end_byte:
                continue  # `$"..."`: a string bash translates; the string is the word
            if not self._readable(child):
                continue
            if child.type == "variable_assignment":
                assignments.append(self._assignment(child))
            elif child.type in ("file_redirect", "herestring_redirect", "heredoc_redirect"):
                descriptor = _descriptor_before(children, index)
                target, kind, more = self._redirect(child, descriptors, descriptor)
                words.extend(more)
                stdin, fed = _redirected(kind, target, writes, reads, stdin, fed)
            elif child.type == "number" and _descriptor_before(children, index + 1) is not None:
                continue  # `exec 0<<< ...`: tree-sitter reads the descriptor as a word of its own
            elif child.is_named:
                self._nested(child)
                word = child.named_children[0] if child.type == "command_name" else child
                found = words_of(word)
                if words and last_end is not None and self.source[last_end:word.start_byte] == b"\\\n":
                    # `r\<newline>m`: bash removes the backslash-newline and reads one word, rm; tree-sitter
                    # reads two. Joined as bash joins them (across quotes, a heredoc: its own nodes say where)
                    joined = words.pop()
                    found[0] = None if joined is None or found[0] is None else joined + found[0]
                words.extend(found)
                last_end = word.end_byte
        words.extend(extra or ())
        if words and words[0] in ARITHMETIC:
            self._arithmetic(node)
            self._taint_targets(node, words, stdin)
            if words[0] == "let":
                self._arithmetic_reads(node)
        self.commands.append(SimpleCommand(tuple(words), tuple(writes), stdin, fed, tuple(reads),
                                           tuple(assignments), tuple(descriptors)))

    def _assignment(self, node: Node) -> tuple[str, str | None]:
        """`NAME=value` (or `NAME+=value`, `NAME[i]=value`): its name and value (None: known only at run time).
        A value bash may later evaluate as arithmetic (`x='a[$(rm -rf /)]'; [[ $x -eq 1 ]]`) runs the command
        substitution in its subscript: such a value is not read."""
        self._nested(node)
        name_node, value_node = node.child_by_field_name("name"), node.child_by_field_name("value")
        name = text_of(name_node) if name_node is not None else ""
        value = literal(value_node) if value_node is not None else ""
        if value_node is not None and self._taints(value, value_node):
            self.tainted.add(name.split("[", 1)[0])
        if value is None or (value_node is not None and value_node.type == "array"):
            self._arithmetic(node)
            return name, None
        if "[" in value and ("$(" in value or "`" in value):
            self.problems.append(f"the value of {name} holds a command substitution bash may run as arithmetic")
        return name, value

    def _declaration(self, node: Node) -> None:
        """`export`, `declare`, `local`, `readonly`, `typeset`, `unset`: the variables they set. A quoted
        argument holding a substitution may be evaluated again (`declare -a 'a=( $(rm -rf /) )'`): not read."""
        self._arithmetic(node)
        assignments = []
        for child in node.children:
            if not self._readable(child) or not child.is_named:
                continue
            if child.type == "variable_assignment":
                assignments.append(self._assignment(child))
                continue
            self._nested(child)
            text = text_of(child)
            if child.type in ("string", "raw_string", "concatenation", "ansi_c_string") and (
                    "$(" in text or "`" in text or "=(" in text):
                self.problems.append(f"{text_of(node).split()[0]} may evaluate a quoted argument again")
        self.commands.append(SimpleCommand((), assignments=tuple(assignments)))


def _redirected(kind: str, target: str | None, writes: list[str | None], reads: list[str | None],
                stdin: str | None, fed: bool) -> tuple[str | None, bool]:
    """One redirection's effect: a file written to joins `writes`, one read joins `reads`; a script fed to the
    input replaces it (a script toolkeeper cannot read leaves the command fed what it cannot see)."""
    if kind == "write":
        writes.append(target)
    elif kind == "read":
        reads.append(target)
    elif kind == "script":
        return target, target is None or fed
    return stdin, fed


def _descriptor_before(children: list[Node], index: int) -> str | None:
    """The descriptor a number right before a redirection names, with no space between (`0<<<`, `3<<EOF`)."""
    if not 0 < index < len(children):
        return None
    number, redirect = children[index - 1], children[index]
    if number.type == "number" and redirect.type.endswith("redirect") and number.end_byte == redirect.start_byte:
        return text_of(number)
    return None


