"""`toolkeeper check`: an agent file read as the model will read it (a tool is a contract written for the model: its
name, description and parameters are all the model knows of it). Each finding has a code, the tool and the key, a
one-line why and the fix.

Errors are what will go wrong (a name that says nothing, two tools the model cannot tell apart, code from the
model run by an interpreter); `serve` refuses them at start, as it refuses a file that does not load (a default
outside its enum, a shell line with placeholders: `check` reports those as E000). Warnings are what makes a
small model fail more often (measured on a 12B model: a typed tool described less carefully failed 5 calls of 30,
each packing every argument into one field, where the declared tool failed none); `serve` logs them once.
docs/how-to/write-a-good-tool.md shows each code before and after.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import asdict, dataclass
from pathlib import PurePath
from typing import Any, Literal

from toolkeeper.tools.agentfile import Agent, DeclaredTool

Severity = Literal["error", "warning"]

VAGUE_NAMES = frozenset({"run", "do", "do_stuff", "do_it", "stuff", "thing", "things", "tool", "tools", "func",
                         "function", "helper", "helpers", "util", "utils", "misc", "main", "process", "handle",
                         "action", "task", "cmd", "command", "script", "x", "y", "z", "foo", "bar", "test"})
NUMBERED = re.compile(r"(tool|func|fn|f|t|cmd|action|task|step)[_-]?\d+", re.IGNORECASE)
VERBS = frozenset(re.findall(r"\w+", """
    add analyse analyze apply approve archive ask build bump calculate call cancel check clean clear close commit
    compare compile compute convert copy count create decode delete deploy describe diff disable download draft
    edit enable encode estimate evaluate explain export extract fetch find format generate get greet grep import install
    launch lint list load lock log look lookup merge migrate move notify open parse patch pause ping plan play
    post preview print publish pull push put query read rebuild reboot receive record refresh register release
    reload remove rename render reply report request reset resize restart restore resume retry review revoke rollback
    rotate run save scale scan schedule search send set show sign sort split start stat stop submit summarize
    summarise sync tag test translate trigger unlock update upgrade upload validate verify view watch write
"""))
INTERPRETERS = frozenset({"python", "python3", "python2", "node", "nodejs", "deno", "bun", "ruby", "perl", "php",
                          "lua", "pwsh", "powershell", "osascript", "Rscript", "julia"})
CODE_FLAGS = frozenset({"-c", "-e", "--eval", "-p", "--print", "-r", "-command", "-Command", "--command"})
FORMAT_WORDS = re.compile(r"\b(version|date|time|timestamp|path|file|filename|dir|directory|folder|url|uri|email|"
                          r"ip|host|hostname|port|semver|sha|hash|uuid)\b", re.IGNORECASE)
WHEN_TO_USE = re.compile(r"\b(use (it|this|me)?\s*(when|for|to|if)|when (the|a|an|you|someone)|call (it|this) "
                         r"(when|for|to)|for (questions|requests) )", re.IGNORECASE)
RETURNS = re.compile(r"\b(returns?|outputs?|prints?|answers? with|gives? back|responds? with|reports?)\b",
                     re.IGNORECASE)
LONG_DESCRIPTION = 600  # characters: past this a model reads less, not more
MANY_PARAMETERS = 6
INLINE_WARN, INLINE_ERROR = 20, 50
LARGE_OUTPUT = 256 * 1024  # bytes a result may carry into the model's context


@dataclass(frozen=True)
class Finding:
    code: str
    severity: Severity
    tool: str | None
    key: str | None
    why: str
    fix: str

    def line(self) -> str:
        where = " ".join(part for part in (f"tool {self.tool!r}" if self.tool else "",
                                            f"key {self.key!r}" if self.key else "") if part)
        return f"{self.severity} {self.code}{' ' + where if where else ''}: {self.why}. Fix: {self.fix}"

    def as_dict(self) -> dict[str, str | None]:
        return asdict(self)


def words(name: str) -> list[str]:
    """`get_user-name` and `getUserName` -> get, user, name."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return [word.lower() for word in re.split(r"[\s_\-]+", spaced) if word]


def lint_agent(agent: Agent) -> list[Finding]:
    tools = list(agent.tools.values())
    found: list[Finding] = []
    for tool in tools:
        found += check_name(tool) + check_description(tool) + check_parameters(tool) + check_command(tool)
    found += check_the_set(tools)
    return found


def check_name(tool: DeclaredTool) -> list[Finding]:
    name, parts = tool.name, words(tool.name)
    if name.lower() in VAGUE_NAMES or NUMBERED.fullmatch(name) or len(name) <= 2:
        return [Finding("N001", "error", name, "name", "the name says nothing of what the tool does, so the model "
                        "cannot choose it for the right request", "name it verb_object, like release_version "
                        "or check_service")]
    if not any(part in VERBS for part in parts):
        return [Finding("N002", "warning", name, "name", "the name has no verb: a model picks tools by the "
                        "action it must take", "start it with what it does: check_service, not service_status")]
    return []


def check_description(tool: DeclaredTool) -> list[Finding]:
    text, name, found = tool.spec.description, tool.name, []
    first = re.split(r"(?<=[.!?])\s", text, maxsplit=1)[0]
    if len(first.split()) < 3:
        found.append(Finding("D001", "warning", name, "description", "the description does not say what the tool "
                             "does in a sentence", "open with one sentence: 'Publish a release of the product to "
                             "a channel.'"))
    if not WHEN_TO_USE.search(text):
        found.append(Finding("D002", "warning", name, "description", "the description does not say when to use "
                             "the tool, which is how a model tells it from the others", "add 'Use it when the "
                             "user asks to ...'"))
    if not RETURNS.search(text):
        found.append(Finding("D003", "warning", name, "description", "the description does not say what comes "
                             "back, so the model cannot plan on the result", "end with 'Returns ...': one line, "
                             "a JSON object, the log"))
    if len(text) > LONG_DESCRIPTION:
        found.append(Finding("D004", "warning", name, "description", f"the description is {len(text)} characters "
                             f"(over {LONG_DESCRIPTION}): longer than the model needs, and it dilutes the rest",
                             "keep what it does, when to use it and what it returns; move the rest to the "
                             "parameters' descriptions"))
    return found


def _numbers_unexplained(parameter: Any) -> bool:
    """An enum of numbers says nothing by itself (1, 2, 3): the description must name what each value means."""
    numbers = [value for value in parameter.enum if isinstance(value, (int, float)) and not isinstance(value, bool)]
    said = set(re.findall(r"-?\d+(?:\.\d+)?", parameter.description))
    return bool(numbers) and not all(str(value) in said for value in numbers)


def check_parameters(tool: DeclaredTool) -> list[Finding]:
    spec, found = tool.spec, []
    for key, parameter in spec.parameters.items():
        at = f"parameters.{key}"
        if not parameter.description.strip():
            found.append(Finding("P001", "warning", tool.name, at, "the parameter has no description: the model "
                                 "guesses what to put in it", "say what it is and show an example value"))
        if parameter.type == "string" and not (parameter.pattern or parameter.enum) and \
                FORMAT_WORDS.search(f"{key} {parameter.description}"):
            found.append(Finding("P002", "warning", tool.name, at, "a string that has a format (a version, a date, "
                                 "a path...) is accepted in any form, and a small model varies it",
                                 "add a pattern, like '^\\d+\\.\\d+\\.\\d+$', and an example in the description"))
        if parameter.enum and (len(parameter.description.split()) < 2 or _numbers_unexplained(parameter)):
            found.append(Finding("P003", "warning", tool.name, at, "the enum's values are not explained: the model "
                                 "picks among names it does not understand", "say in the description what each "
                                 "value means"))
        if parameter.type == "object":
            found.append(Finding("P004", "warning", tool.name, at, "a nested object: flat parameters succeed more "
                                 "often on small models", "spread its fields into parameters of their own"))
    if len(spec.parameters) > MANY_PARAMETERS:
        found.append(Finding("P004", "warning", tool.name, "parameters", f"{len(spec.parameters)} parameters (over "
                             f"{MANY_PARAMETERS}): small models fill fewer fields correctly", "split the tool, or "
                             "give the rare parameters defaults and leave them out of the common case"))
    return found


def check_command(tool: DeclaredTool) -> list[Finding]:
    spec, found = tool.spec, []
    if spec.max_output > LARGE_OUTPUT:
        found.append(Finding("C001", "warning", tool.name, "max_output", f"up to {spec.max_output} bytes of output "
                             "reach the model's context, which it cannot use", f"keep max_output at or under "
                             f"{LARGE_OUTPUT}, and have the tool summarise"))
    command = list(spec.command or ())
    if command and not spec.wasm and PurePath(command[0]).name.rstrip("0123456789.") in INTERPRETERS:
        for flag, following in itertools.pairwise(command):
            if flag in CODE_FLAGS and "{{" in following:
                found.append(Finding("C002", "error", tool.name, "command", f"{command[0]} {flag} runs code built "
                                     "from the model's values: the model can run anything", "put the code in a "
                                     "script file and pass the values as arguments"))
    return found


def check_the_set(tools: list[DeclaredTool]) -> list[Finding]:
    found: list[Finding] = []
    inline = [tool for tool in tools if tool.spec.visibility == "inline"]
    if len(inline) > INLINE_WARN:
        severity: Severity = "error" if len(inline) > INLINE_ERROR else "warning"
        found.append(Finding("S001", severity, None, "tools", f"{len(inline)} inline tools: past {INLINE_WARN} "
                             "models choose among them less well", "mark the rarely used ones `visibility: "
                             "discoverable`, with keywords"))
    for tool in tools:
        if tool.spec.visibility == "discoverable" and not tool.spec.keywords:
            found.append(Finding("S002", "warning", tool.name, "keywords", "a discoverable tool is found by search, "
                                 "and has no keywords to be found by", "add the words a user would say: "
                                 "keywords: [ship, publish]"))
    seen: dict[str, str] = {}
    for tool in tools:
        other = seen.setdefault(tool.spec.description.strip().lower(), tool.name)
        if other != tool.name:
            found.append(Finding("D005", "error", tool.name, "description", f"the same description as {other!r}: "
                                 "the model cannot tell them apart", "say what each does differently"))
    for position, tool in enumerate(tools):
        for other in tools[position + 1:]:
            if similar(tool.name, other.name):
                found.append(Finding("N003", "warning", other.name, "name", f"close to {tool.name!r}: the model "
                                     "confuses names that differ by a letter or share their words",
                                     "name each by what sets it apart"))
    return found


def similar(first: str, second: str) -> bool:
    a, b = first.lower(), second.lower()
    if sorted(words(a)) == sorted(words(b)):
        return True
    return min(len(a), len(b)) >= 4 and distance(a, b) <= 2


def distance(a: str, b: str) -> int:
    """Levenshtein: insertions, deletions and substitutions."""
    previous = list(range(len(b) + 1))
    for i, left in enumerate(a, 1):
        current = [i]
        for j, right in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (left != right)))
        previous = current
    return previous[-1]
