"""What a command line or an argv really runs: each program, with the wrappers around it looked through.

`sudo -u root env A=1 timeout 5 rm -rf /` runs four programs: sudo, env,
timeout and rm, and a rule about rm must see the last. Each wrapper's
options are read as the wrapper reads them, so its own option values are
never taken for the program. Shells given a script (`bash -c`, `su -c`,
`watch`, a heredoc, an `alias` value) have it parsed in turn; `xargs` and
`find -exec` run the command they name (xargs with arguments known only at
run time), and `find -delete` counts as `rm -r -f` on the paths it searches.

What toolkeeper cannot know (a program from a variable or a substitution,
`eval`, a shell reading its commands from a pipe, a parse error) is said in
`unresolved`: the rules fail closed on it.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field, replace
from functools import lru_cache

from toolkeeper.policy.shell import SimpleCommand, parse_script
from toolkeeper.policy.wrappers import (
    WRAPPERS,
    Wrapper,
    command_option,
    split_string,
    splits,
    stops,
    takes_value,
)

SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "yash", "posh", "rbash", "fish", "csh", "tcsh"})
STDIN_FILES = frozenset({"/dev/stdin", "/dev/fd/0", "/proc/self/fd/0"})  # a script file that is the input
MAX_DEPTH = 8


@dataclass(frozen=True)
class Command:
    argv: tuple[str | None, ...]  # as it would run: argv[0] the program as written
    writes: tuple[str | None, ...] = ()  # files its output is redirected to
    transparent: bool = False  # a wrapper whose command is listed too: allow rules look through it
    open_arguments: bool = False  # more arguments come at run time (xargs): its flags are not all known
    via: str = ""  # how it was found, for reasons: "sudo", "bash -c", "find -exec"
    moved: tuple[str | None, ...] = ()  # where `cd` went earlier in the line (None: somewhere known at run time):
    #                                     its relative paths may be from there as well as from the working directory
    reads: tuple[str | None, ...] = ()  # files redirected to its input

    @property
    def program(self) -> str | None:
        """The base name: `/bin/rm`, `\\rm`, `"rm"` are all rm."""
        return posixpath.basename(self.argv[0]) if self.argv and self.argv[0] is not None else None


@dataclass(frozen=True)
class Resolution:
    commands: tuple[Command, ...] = ()
    unresolved: tuple[str, ...] = ()  # why some of it cannot be known: rules fail closed


@dataclass
class _Found:
    """A resolution being built."""

    commands: list[Command] = field(default_factory=list)
    unresolved: list[str] = field(default_factory=list)
    moved: tuple[str | None, ...] = ()  # the `cd`s seen so far

    def done(self) -> Resolution:
        return Resolution(tuple(self.commands), tuple(dict.fromkeys(self.unresolved)))


@lru_cache(maxsize=4096)
def commands_of_script(text: str) -> Resolution:
    """The commands a shell command line runs (cached: agents send the same lines again and again)."""
    found = _Found()
    _script(text, found, 0, "")
    return found.done()


@lru_cache(maxsize=1024)
def commands_of_argv(argv: tuple[str, ...]) -> Resolution:
    """The commands an argv runs (a `local_shell` action, a declared tool's argv): no shell reads it, but a
    program in it may be a shell or a wrapper."""
    found = _Found()
    if argv:
        _simple(SimpleCommand(tuple(argv)), found, 0, "")
    return found.done()


def _script(text: str, out: _Found, depth: int, via: str) -> None:
    if depth > MAX_DEPTH:
        out.unresolved.append("shells nested deeper than toolkeeper reads")
        return
    parsed = parse_script(text)
    out.unresolved.extend(parsed.problems)
    for simple in parsed.commands:
        before = len(out.commands)
        _simple(simple, out, depth, via)
        if out.moved:
            out.commands[before:] = [replace(c, moved=(*c.moved, *out.moved)) for c in out.commands[before:]]
        words = simple.words
        if words and words[0] in ("cd", "pushd"):  # where the commands after it run (in a subshell or not)
            target = next((w for w in words[1:] if w is None or not w.startswith("-")), "~")
            out.moved = (*out.moved, target)


def _simple(simple: SimpleCommand, out: _Found, depth: int, via: str) -> None:
    words = list(simple.words)
    while words and words[0] is not None and "=" in words[0] and not words[0].startswith("="):
        words.pop(0)  # `A=1 rm`: an assignment tree-sitter left among the words (after a wrapper)
    if not words:
        if simple.writes:
            out.commands.append(Command((), simple.writes, transparent=True, via=via))
        return
    program = words[0]
    if program is None:
        out.unresolved.append("the program comes from a variable or a substitution")
        return
    name = posixpath.basename(program)
    if program not in ("[", "[[") and any(ch in program for ch in "*?["):
        out.unresolved.append(f"the program {program!r} is a pattern the shell expands")
        return
    command = Command(tuple(words), simple.writes, via=via, reads=simple.reads)
    if program in ("{", "(", "}", ")"):  # `time { ...; }`: tree-sitter leaves the group's braces among the words
        _simple(replace(simple, words=tuple(words[1:])), out, depth, via)
    elif name == "eval":
        out.commands.append(command)
        out.unresolved.append("eval runs a string built at run time")
    elif name in SHELLS:
        _shell(command, simple, out, depth)
    elif name in ("su", "script") or (name == "runuser" and any(command_option(w) for w in words[1:])):
        _su(command, simple, out, depth)  # su -c CMD, script -c CMD, runuser USER -c CMD: run by a shell
    elif name in WRAPPERS:
        _wrapper(name, command, simple, out, depth)
    elif name == "find":
        _find(command, out, depth)
    elif name in ("source", "."):
        out.commands.append(command)
        _script_file(words[1] if len(words) > 1 else None, name, simple, out, depth)
    elif name in ("trap", "mapfile", "readarray"):  # trap ACTION SIGNALS, mapfile -C CALLBACK: shell code
        out.commands.append(replace(command, transparent=True))
        if name == "trap":
            action = next((w for w in words[1:] if w is None or not w.startswith("-")), "")
        else:
            action = words[words.index("-C") + 1] if "-C" in words[:-1] else ""
        if action is None:
            out.unresolved.append(f"{name} runs shell code known only at run time")
        elif action:
            _script(action, out, depth + 1, name)
    elif name == "alias":
        out.commands.append(replace(command, transparent=True))
        for word in words[1:]:
            if word is None:
                out.unresolved.append("an alias whose value is known only at run time")
            elif "=" in word:
                _script(word.partition("=")[2], out, depth + 1, "alias")
    else:
        out.commands.append(command)


def _shell(command: Command, simple: SimpleCommand, out: _Found, depth: int) -> None:
    """`bash -c SCRIPT`, `bash FILE`, or a shell reading its commands from its input."""
    args, script_next, reads_input = list(command.argv[1:]), False, False
    while args:
        arg = args.pop(0)
        if arg is None:
            out.unresolved.append("a shell option known only at run time")
            return
        if arg in ("-o", "+o", "-O", "+O", "--rcfile", "--init-file"):
            args = args[1:]
        elif arg == "--":
            break
        elif arg.startswith(("--command", "--init-command", "--comm")):  # fish's (and its abbreviations)
            script = arg.partition("=")[2] if "=" in arg else (args.pop(0) if args else None)
            if script is None:
                out.unresolved.append("a shell's --command known only at run time")
            else:
                _script(script, out, depth + 1, f"{command.program} --command")
        elif arg.startswith("--"):
            continue
        elif arg[:1] in "-+" and len(arg) > 1:
            script_next = script_next or "c" in arg[1:] or (command.program == "fish" and "C" in arg[1:])
            reads_input = reads_input or "s" in arg[1:]
        else:
            args.insert(0, arg)
            break
    name = command.program
    runs_a_file = bool(args) and not script_next and not reads_input and args[0] not in STDIN_FILES
    # the shell is looked through when it runs a script toolkeeper reads; running a file, it is the program
    out.commands.append(replace(command, transparent=not runs_a_file))
    if script_next:
        script = args[0] if args else None
        if script is None:
            out.unresolved.append(f"{name} -c runs a script known only at run time")
        else:
            _script(script, out, depth + 1, f"{name} -c")
    elif not runs_a_file:
        _script_file("/dev/stdin", name or "", simple, out, depth)


def _script_file(path: str | None, name: str, simple: SimpleCommand, out: _Found, depth: int) -> None:
    """A script read from a file: its input's (a heredoc toolkeeper reads, or a pipe it cannot), or another."""
    if path is None:
        out.unresolved.append(f"{name} runs a script known only at run time")
    elif path not in STDIN_FILES:
        return  # a script file: what the file holds is not in the call
    elif simple.stdin is not None:
        _script(simple.stdin, out, depth + 1, f"{name} reading a heredoc")
    elif simple.fed:
        out.unresolved.append(f"{name} reads its commands from its input (a pipe or a heredoc), which toolkeeper "
                              "cannot see")


def _wrapper(name: str, command: Command, simple: SimpleCommand, out: _Found, depth: int) -> None:
    wrapper = WRAPPERS[name]
    out.commands.append(replace(command, transparent=wrapper.transparent))
    args = list(command.argv[1:])
    if name == "watch":
        _script_of_words(name, args, wrapper, out, depth)
        return
    inner = _after_options(name, args, wrapper, out)
    if inner is None:
        return
    if name == "flock" and inner[:1] in (["-c"], ["--command"]):  # flock FILE -c COMMAND: run by sh -c
        _script_of_words(name, inner, wrapper, out, depth)
        return
    if name == "coproc" and len(inner) > 1 and inner[1] in ("{", "("):
        inner = inner[1:]  # coproc NAME { ...; }: the name is the coprocess's, not a program
    if name == "xargs" and not inner:
        inner = ["echo"]
    via = f"{command.via} {name}".strip()
    nested = replace(simple, words=tuple(inner))
    before = len(out.commands)
    _simple(nested, out, depth + 1, via)
    if name == "xargs":  # xargs appends what it reads: the command's arguments are not all known
        for index in range(before, len(out.commands)):
            found = out.commands[index]
            out.commands[index] = replace(found, open_arguments=True)


def _after_options(name: str, args: list[str | None], wrapper: Wrapper, out: _Found) -> list[str | None] | None:
    """The command a wrapper runs: its arguments after its own options and operands; None: it runs none."""
    operands = wrapper.operands
    while args:
        arg = args[0]
        if arg is None:
            if operands == 0:
                break  # the program itself: _simple says it is unknown
            out.unresolved.append(f"an option of {name} known only at run time")
            return None
        if arg == "--":
            args.pop(0)
            break
        if name == "env" and "=" in arg and not arg.startswith("-"):
            args.pop(0)
        elif name == "env" and splits(arg):
            args.pop(0)
            return split_string(arg, args, out.unresolved)
        elif arg.startswith("-") and len(arg) > 1 and operands == wrapper.operands:
            if stops(arg, wrapper):
                return None
            args.pop(0)
            if takes_value(arg, wrapper) and args:
                args.pop(0)
        elif operands > 0:
            args.pop(0)
            operands -= 1
        else:
            break
    return args


def _script_of_words(name: str, args: list[str | None], wrapper: Wrapper, out: _Found, depth: int) -> None:
    """`watch CMD ARGS` and `flock FILE -c CMD`: the words joined and run by `sh -c`."""
    # flock: the words after -c; watch: its words after its own options
    words = args[1:2] if name == "flock" else _after_options(name, args, wrapper, out) or []
    if any(word is None for word in words):
        out.unresolved.append(f"{name} runs a command known only at run time")
    elif words:
        _script(" ".join(word for word in words if word is not None), out, depth + 1, name)


def _su(command: Command, simple: SimpleCommand, out: _Found, depth: int) -> None:
    name = command.program
    out.commands.append(replace(command, transparent=name == "script"))
    args = list(command.argv[1:])
    for index, arg in enumerate(args):
        given = arg or ""
        if command_option(given):
            script = args[index + 1] if index + 1 < len(args) and "=" not in given else (
                given.partition("=")[2] or None)
            if script is None:
                out.unresolved.append(f"{name} -c runs a script known only at run time")
            else:
                _script(script, out, depth + 1, f"{name} -c")
            return
    if simple.fed and name == "su":
        out.unresolved.append("su reads its commands from its input, which toolkeeper cannot see")


def _find(command: Command, out: _Found, depth: int) -> None:
    """find itself, each `-exec`/`-execdir`/`-ok` command, and `-delete` as `rm -r -f` on its start paths."""
    out.commands.append(command)
    args = list(command.argv[1:])
    starts = []
    for arg in args:
        if arg is None or arg.startswith("-") or arg in ("(", "!", ")"):
            break
        starts.append(arg)
    index = 0
    while index < len(args):
        arg = args[index]
        if arg in ("-exec", "-execdir", "-ok", "-okdir"):
            end = next((i for i in range(index + 1, len(args))
                        if args[i] == ";" or (args[i] == "+" and args[i - 1] == "{}")), len(args))
            # {} is each file found: under the start paths, so they stand for it
            words = [found for word in args[index + 1:end] for found in ((starts or ["."]) if word == "{}" else [word])]
            _simple(SimpleCommand(tuple(words)), out, depth + 1, f"find {arg}")
            index = end
        elif arg == "-delete":
            out.commands.append(Command(("rm", "-r", "-f", *(starts or ["."])), via="find -delete"))
        index += 1
