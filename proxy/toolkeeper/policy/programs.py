"""The catalogue of programs that run what they are given (programs.yaml), and how each reads its options.

commands.py applies it: a wrapper's command is read as a command (`sudo rm`),
a command line given to an option is parsed (`rsync -e 'ssh ...'`), and code
in another language given inline (`python3 -c`) makes the command unresolved.
Each entry's options that take a value are listed, so that `sudo -u root rm`
is rm run as root, never a program called `root`; GNU long options are taken
by any unambiguous start (`--us` is `--user`), as getopt_long takes them.
"""

from __future__ import annotations

import fnmatch
import shlex
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

CATALOGUE = Path(__file__).with_name("programs.yaml")


@dataclass(frozen=True)
class Program:
    """One catalogue entry (programs.yaml says what each field means)."""

    name: str
    runs: str = ""  # command | words | "" (runs nothing it is given as a command)
    valued: dict[str, int] | None = None  # option -> how many values it takes
    flags: frozenset[str] = frozenset()  # options that take none
    operands: int = 0
    changes_user: bool = False
    stops: frozenset[str] = frozenset()
    last_options: frozenset[str] = frozenset()
    subcommands: frozenset[str] = frozenset()
    command_options: frozenset[str] = frozenset()
    code_options: frozenset[str] = frozenset()
    code_operand: int = 0
    code_files: frozenset[str] = frozenset()
    command_after: frozenset[str] = frozenset()
    program_options: frozenset[str] = frozenset()
    code_subcommands: frozenset[str] = frozenset()
    reads_code: bool = False
    command_prefixes: tuple[str, ...] = ()
    options_anywhere: bool = False
    code_on_input: bool = False
    code_reader: str = ""
    code_in_operands: bool = False
    bundled_first: bool = False

    @property
    def transparent(self) -> bool:
        """An allow rule looks through it to the command it runs (sudo, ssh, chroot change who or where: not)."""
        return not self.changes_user

    def describe(self) -> str:
        """What the entry knows of the program, for `policy explain`: `sudo: runs the command it is given`."""
        runs = {"command": "runs the command it is given", "words": "runs its words as a command line",
                "input": "runs the commands on its input", "bash": "hands its arguments to bash"}
        parts = [runs[self.runs]] if self.runs in runs else []
        if self.command_after or self.program_options:
            parts.append("runs a command given in " + " ".join(sorted(self.command_after | self.program_options)))
        if self.command_options:
            parts.append("command lines in " + " ".join(sorted(self.command_options)))
        if self.code_options or self.code_subcommands:
            parts.append("code in another language in " + " ".join(sorted(self.code_options | self.code_subcommands)))
        if self.code_operand:
            parts.append(f"code in another language as operand {self.code_operand}")
        if self.reads_code:
            parts.append("code in another language on its input")
        return f"catalogue entry {self.name}: " + ("; ".join(parts) or "known")


@dataclass(frozen=True)
class Catalogue:
    programs: dict[str, Program]
    patterns: dict[str, Program]  # entries named with a glob (python3.*)
    shells: frozenset[str]
    git_commands: tuple[str, ...]  # git -c keys whose value a shell runs (globs, lower case)
    git_unread: tuple[str, ...]  # git -c keys that change what git runs in a way not read
    command_variables: frozenset[str]
    startup_variables: frozenset[str]
    prompt_variables: frozenset[str]
    unread_variables: tuple[str, ...]  # globs

    def program(self, name: str) -> Program | None:
        found = self.programs.get(name)
        if found is None:
            found = next((entry for glob, entry in self.patterns.items() if fnmatch.fnmatchcase(name, glob)), None)
        return found

    def variable(self, name: str) -> str:
        """What a program does with this variable's value: command, startup, prompt, unread, or "" (nothing
        toolkeeper needs to read)."""
        if name in self.command_variables:
            return "command"
        if name in self.startup_variables:
            return "startup"
        if name in self.prompt_variables:
            return "prompt"
        if any(fnmatch.fnmatchcase(name, glob) for glob in self.unread_variables):
            return "unread"
        return ""


def _options(text: str | None) -> dict[str, int]:
    """`-u --user --bind:2` -> {"-u": 1, "--user": 1, "--bind": 2}."""
    found = {}
    for word in (text or "").split():
        name, _, count = word.partition(":")
        found[name] = int(count) if count else 1
    return found


def _entry(name: str, data: dict[str, Any]) -> Program:
    words = lambda key: frozenset((data.get(key) or "").split())  # noqa: E731 - one line per field below
    operand = data.get("code_operand", 0)
    return Program(
        name=name, runs=data.get("runs", ""), valued=_options(data.get("valued")), flags=words("flags"),
        operands=data.get("operands", 0),
        changes_user=bool(data.get("changes_user")), stops=words("stops"), last_options=words("last_options"),
        subcommands=words("subcommands"), command_options=words("command_options"),
        code_options=words("code_options"), code_operand=1 if operand is True else int(operand),
        code_files=words("code_files"), code_subcommands=words("code_subcommands"),
        command_after=words("command_after"), program_options=words("program_options"),
        reads_code=bool(data.get("reads_code")), command_prefixes=tuple((data.get("command_prefixes") or "").split()),
        options_anywhere=bool(data.get("options_anywhere")), code_on_input=bool(data.get("code_on_input")),
        code_reader=data.get("code_reader", ""), code_in_operands=bool(data.get("code_in_operands")),
        bundled_first=bool(data.get("bundled_first")))


@cache
def catalogue() -> Catalogue:
    data = yaml.safe_load(CATALOGUE.read_text())
    entries = {name: _entry(name, entry or {}) for name, entry in data["programs"].items()}
    variables = data["variables"]
    return Catalogue(
        programs={name: entry for name, entry in entries.items() if not any(ch in name for ch in "*?[")},
        patterns={name: entry for name, entry in entries.items() if any(ch in name for ch in "*?[")},
        shells=frozenset(data["shells"]),
        git_commands=tuple(data["git_config"]["commands"].lower().split()),
        git_unread=tuple(data["git_config"]["unread"].lower().split()),
        command_variables=frozenset(variables["commands"].split()),
        startup_variables=frozenset(variables["startup"].split()),
        prompt_variables=frozenset(variables["prompts"].split()),
        unread_variables=tuple(variables["unread"].split()))


def _option_name(option: str) -> str:
    return option.split("=", 1)[0]


def long_match(option: str, known: frozenset[str] | dict[str, int]) -> str | None:
    """The known option `option` names: itself, or the one long option it is an unambiguous start of."""
    name = _option_name(option) if option.startswith("--") else option
    if name in known:
        return name
    if not name.startswith("--") or len(name) < 3:
        return None
    starting = [known_name for known_name in known if known_name.startswith("--") and known_name.startswith(name)]
    return starting[0] if len(starting) == 1 else None


def values_taken(option: str, entry: Program) -> int:
    """How many of the next words are this option's values: `-u` or `--user` (or `--us`), or a group of short
    options whose last takes one (`sudo -iu root`); `-uroot` and `--user=root` carry theirs."""
    valued = entry.valued or {}
    if option.startswith("--"):
        if "=" in option:
            return 0
        match = long_match(option, valued)
        return valued[match] if match else 0
    if option in valued:
        return valued[option]
    for index, letter in enumerate(option[1:]):
        if f"-{letter}" in valued:
            return valued[f"-{letter}"] if index == len(option) - 2 else 0
    return 0


def option_in(word: str, options: frozenset[str], entry: Program, *,
              exact: bool = False) -> tuple[str, str | None] | None:
    """(which of `options` the word is, its value when attached: `--eval=CODE`, `-cCODE`), or None. A group of
    short options ending with one is it (`-qc`); a letter that takes a value of its own ends the group. `exact`:
    a long option only by its whole name (the entry does not list the options it could be the start of)."""
    if not word.startswith("-") or word in ("-", "--"):
        return None
    name, equals, attached = word.partition("=")
    if name in options:
        return name, attached if equals else None
    if word.startswith("--"):
        match = None if exact else long_match(name, options)  # a start of one is it, when all are listed
        return (match, attached if equals else None) if match else None
    for index, letter in enumerate(word[1:], start=2):
        if f"-{letter}" in options:
            return f"-{letter}", word[index:] or None
        if f"-{letter}" in (entry.valued or {}):
            return None
    return None


def known_flags(option: str, entry: Program) -> bool:
    """Every option in the word is one the entry lists as taking no value (`-iE`, `--login`, `--log`)."""
    if option.startswith("--"):
        return "=" in option or long_match(option, entry.flags) is not None
    return all(f"-{letter}" in entry.flags for letter in option[1:])


def stops(option: str, entry: Program) -> bool:
    """An option after which the program runs nothing (`command -v`); in a group, up to the first letter that
    takes a value (`sudo -uvagrant` is the user `vagrant`, not `-v`)."""
    if option in entry.stops or option.startswith("--"):
        return long_match(option, entry.stops) is not None
    for letter in option[1:]:
        if f"-{letter}" in entry.stops:
            return True
        if f"-{letter}" in (entry.valued or {}):
            return False
    return False


def splits(option: str) -> bool:
    """env's -S (alone, last of a group, with its value attached) or --split-string (or a start of it)."""
    if option.startswith("--"):
        return len(option.split("=")[0]) >= 3 and "--split-string".startswith(option.split("=")[0])
    return option.startswith("-") and "S" in option[1:]


def split_string(option: str, rest: list[str | None], unresolved: list[str]) -> list[str | None] | None:
    """The command `env -S STRING` runs: the string split into words, then the words after it."""
    if option.startswith("--"):
        value = option.partition("=")[2] if "=" in option else (rest.pop(0) if rest else None)
    else:
        attached = option[option.index("S") + 1:]
        value = attached or (rest.pop(0) if rest else None)
    if value is None:
        unresolved.append("env -S splits a string known only at run time")
        return None
    if "\\" in value or "$" in value:
        unresolved.append("env -S splits a string with escapes or variables of its own (\\_, ${NAME})")
        return None
    try:
        return [*shlex.split(value), *rest]
    except ValueError:
        unresolved.append("env -S splits a string that does not split")
        return None


def command_option(given: str | None) -> bool:
    """-c (or a group ending with it: -qc), --command, --session-command, or a start of either (--comm)."""
    if not given or not given.startswith("-"):
        return False
    if not given.startswith("--"):
        return given.endswith("c")
    option = given.split("=")[0]
    return len(option) > 3 and ("--command".startswith(option) or "--session-command".startswith(option))
