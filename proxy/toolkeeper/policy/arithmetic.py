"""Where bash evaluates text as arithmetic, and so runs the `$(...)` in a subscript of it: `let 'a[$(rm -rf /)]'`,
or `x='a[$(rm -rf /)]'; [[ $x -eq 1 ]]`. The walk (shell.py) reads with this; what it cannot read is a problem."""

from __future__ import annotations

from tree_sitter import Node

from toolkeeper.policy.grammar import IDENTIFIER
from toolkeeper.policy.words import literal, text_of


class ArithmeticReading:
    """The walk's part that follows arithmetic: variables whose text, written in the command, holds a
    substitution are tainted, and an arithmetic context that reads one is a problem."""

    problems: list[str]
    tainted: set[str]

    def _taints(self, value: str | None, node: Node) -> bool:
        """Text written in the command holding a substitution (`'$(rm -rf /)'`, `$'\x24(...)'`), or built from a
        variable that does: arithmetic would run it. Text from a command's output is the output's, like a file's."""
        if value is not None and ("$(" in value or "`" in value):
            return True
        found = [node, *_descendants(node)]
        return any(text_of(part) in self.tainted for part in found if part.type == "variable_name")

    def _taint_targets(self, node: Node, words: list[str | None], stdin: str | None) -> None:
        """`read x <<< TEXT`, `printf -v x FORMAT ARGS`, `mapfile x`: x holds text written in the command."""
        if words[0] not in ("read", "mapfile", "readarray", "printf"):
            return
        given = [literal(child) for child in node.named_children if child.type != "command_name"]
        if not (self._taints(stdin, node) or any(self._taints(text, node) for text in given)):
            return
        if words[0] == "printf":
            names = words[2:3] if words[1:2] == ["-v"] else [w[2:] for w in words[1:2] if w and w.startswith("-v")]
        else:
            names = words[1:]
        self.tainted.update(word for word in names if word and IDENTIFIER.fullmatch(word))

    def _arithmetic_reads(self, node: Node) -> None:
        """An arithmetic context (`(( x ))`, `$((x))`, `[[ $x -eq 1 ]]`, `let x`, a subscript) evaluates a
        variable's text as arithmetic again, running a `$(...)` in a subscript there: one whose text came from
        a substitution, a variable or a read is not read."""
        names = {text_of(found) for found in _descendants(node) if found.type == "variable_name"}
        names |= {word for found in _descendants(node) if found.type == "word"
                  for word in IDENTIFIER.findall(text_of(found))}
        if names & self.tainted:
            self.problems.append(f"arithmetic reads {sorted(names & self.tainted)[0]}, whose text may hold a "
                                 "command substitution")

    def _arithmetic(self, node: Node) -> None:
        """Builtins that evaluate a word as arithmetic run the command substitutions in an array subscript, even
        a single-quoted one (`let 'a[$(rm -rf /)]'`): such a word is not read, it fails closed."""
        stack = [node]
        while stack:
            found = stack.pop()
            if found.type in ("word", "raw_string", "string", "concatenation", "ansi_c_string"):
                text = (literal(found) or "") if found.type == "ansi_c_string" else text_of(found)
                if "[" in text and ("$(" in text or "`" in text):
                    self.problems.append("a word bash may evaluate as arithmetic holds a command substitution")
                    return
                continue
            stack.extend(found.children)


def _descendants(node: Node) -> list[Node]:
    found, stack = [], list(node.children)
    while stack:
        child = stack.pop()
        found.append(child)
        stack.extend(child.children)
    return found
