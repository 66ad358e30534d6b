"""What a program of the catalogue (programs.yaml) runs: its options read as it reads them, the command lines
and code in them, and the command it is given.

commands.py hands each simple command whose program the catalogue names to `read`; what that program runs is
handed back to commands.py to be read in turn (each Found carries commands.py's readers: found.Reader).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, replace

from toolkeeper.policy.found import DESCRIPTOR_FILES, STDIN_FILES, Command, Found
from toolkeeper.policy.programs import (
    Program,
    catalogue,
    known_flags,
    option_in,
    split_string,
    splits,
    stops,
    values_taken,
)
from toolkeeper.policy.shell import SimpleCommand


@dataclass
class _Options:
    """A program's own options as read: its operands after them, and whether its code came in a file."""

    operands: list[str | None]
    code_file: bool = False
    unsure: str = ""  # the last option before the operands, which the catalogue does not say takes no value


def read(command: Command, simple: SimpleCommand, out: Found, depth: int) -> None:
    """A program as programs.yaml knows it (a program it does not name is a program like any other)."""
    entry = catalogue().program(command.program or "")
    if entry is None:
        out.commands.append(command)
        return
    at = len(out.commands)
    out.commands.append(replace(command, read_by=entry.describe()))
    read = _options(entry, list(command.argv[1:]), out, depth)
    if read is not None and entry.subcommands:
        if not read.operands or read.operands[0] not in entry.subcommands:
            return  # `poetry install`: no command to run
        read = _options(entry, read.operands[1:], out, depth)
    if read is not None:
        # a wrapper that runs a command is looked through by allow rules, unless it changes who or where
        out.commands[at] = replace(out.commands[at], transparent=entry.transparent and entry.runs != "")
        _operands(entry, command, read, simple, out, depth)


def _options(entry: Program, args: list[str | None], out: Found, depth: int) -> _Options | None:
    """Read a program's own options (the command lines and code in them); None when it runs nothing more
    (`command -v`, an option of a wrapper known only at run time)."""
    operands: list[str | None] = []
    read = _Options(operands)
    while args:
        arg = args[0]
        if arg is None:
            if entry.runs and entry.operands == 0:
                break  # the program itself: _simple says it is unknown
            if entry.runs:
                out.unresolved.append(f"an option of {entry.name} known only at run time")
                return None
            if not entry.options_anywhere:
                break  # an operand known only at run time (`python3 <(curl ...)`)
            operands.append(args.pop(0))
            continue
        if arg == "--":
            args.pop(0)
            break
        if not arg.startswith("-") or arg == "-":
            if entry.name == "env" and "=" in arg:  # env NAME=value COMMAND
                name, _, value = arg.partition("=")
                out.reader.assigned(name, value, out, depth)
                args.pop(0)
                continue
            if not entry.options_anywhere:
                break  # its options end at its first operand (a wrapper's command, a script's own options)
            operands.append(args.pop(0))  # GNU programs read options after operands too (tar -cf x --to-command=)
            continue
        args.pop(0)
        if entry.name == "env" and splits(arg):
            rest = split_string(arg, args, out.unresolved)
            return None if rest is None else _Options([*operands, *rest])
        if stops(arg, entry):
            return None
        read.unsure = ""
        if not _option(entry, arg, args, read, out, depth):
            break
    operands.extend(args)
    return read


def _option(entry: Program, arg: str, args: list[str | None], read: _Options, out: Found, depth: int) -> bool:
    """One option, its value taken from `args`; False: what follows is another program's (`python3 -m`)."""
    given = option_in(arg, entry.command_options, entry)
    if given is not None:
        value = given[1] if given[1] is not None else (args.pop(0) if args else None)
        _command_line(entry, given[0], value, out, depth)
        return True
    given = option_in(arg, entry.code_options, entry)
    if given is not None:
        out.unresolved.append(f"{entry.name} {given[0]} runs code toolkeeper does not read")
        read.code_file = True  # the code is given: no operand is code, nothing is read from the input
        if given[1] is None and args:
            args.pop(0)
        return True
    given = option_in(arg, entry.code_files, entry)
    if given is not None:
        read.code_file = True
        path = given[1] if given[1] is not None else (args.pop(0) if args else None)
        if path is None or path in STDIN_FILES or path.startswith(DESCRIPTOR_FILES):
            out.unresolved.append(f"{entry.name} {given[0]} reads code toolkeeper cannot see")
        return True
    given = option_in(arg, entry.command_after | entry.program_options, entry, exact=True)
    if given is not None:
        _command_given(entry, given, args, out, depth)
        args.clear()
        return False
    if option_in(arg, entry.last_options, entry) is not None:
        read.code_file = True  # the code is a module's: a file
        return False
    taken = values_taken(arg, entry)
    for _ in range(taken):
        if args:
            args.pop(0)
    read.unsure = arg if entry.runs and not taken and not known_flags(arg, entry) else ""
    return True


def _command_given(entry: Program, given: tuple[str, str | None], args: list[str | None], out: Found,
                   depth: int) -> None:
    """`nix develop -c CMD ARGS`: the words after the option are a command; `start-stop-daemon --exec PROGRAM
    ... -- ARGS`: the option's value is the program, and its arguments follow `--`."""
    option, value = given
    if option in entry.command_after:
        words = ([value] if value is not None else []) + args
    else:
        program = value if value is not None else (args.pop(0) if args else None)
        words = [program, *(args[args.index("--") + 1:] if "--" in args else [])]
    if words:
        out.reader.simple(SimpleCommand(tuple(words)), out, depth + 1, f"{entry.name} {option}")


def _command_line(entry: Program, option: str, value: str | None, out: Found, depth: int) -> None:
    """A command line given to an option (`rsync -e CMD`, `ssh -o ProxyCommand=CMD`, `git -c alias.x=!CMD`)."""
    via = f"{entry.name} {option}"
    if value is None:
        out.unresolved.append(f"{via} gives a command known only at run time")
    elif entry.name == "git" and option == "--config-env":  # KEY=VARIABLE: the value is in the environment
        key = value.partition("=")[0].lower()
        if any(fnmatch.fnmatchcase(key, glob) for glob in catalogue().git_commands):
            out.unresolved.append(f"git --config-env {key} takes a command from the environment")
    elif entry.name == "git":
        _git_config(value, out, depth)
    elif entry.name in ("ssh", "scp", "sftp"):
        key, _, setting = value.replace("=", " ", 1).partition(" ")
        if key.lower() in ("proxycommand", "localcommand", "remotecommand", "knownhostscommand"):
            out.reader.script(setting.strip(), out, depth + 1, f"{entry.name} -o {key}")
        elif option == "-S":
            out.reader.script(value, out, depth + 1, via)
    elif entry.name == "tar" and option == "--checkpoint-action":
        if value.startswith("exec="):
            out.reader.script(value[5:], out, depth + 1, via)
    else:
        out.reader.script(value, out, depth + 1, via)


def _git_config(setting: str, out: Found, depth: int) -> None:
    """`git -c KEY=VALUE`: a key whose value git hands to a shell is read as a command line (an alias only when
    it starts with `!`; any other alias is a git command)."""
    key, _, value = setting.partition("=")
    key = key.lower()
    if not any(fnmatch.fnmatchcase(key, glob) for glob in catalogue().git_commands):
        return
    if key.startswith("alias."):
        if value.startswith("!"):
            out.reader.script(value[1:], out, depth + 1, f"git alias {key[6:]}")
    elif key.startswith("credential") and not value.startswith(("!", "/")):
        return  # a helper's name: git runs git-credential-NAME
    elif key.startswith(("include", "protocol", "core.hookspath")):
        out.unresolved.append(f"git -c {key} changes what git runs in a way toolkeeper does not read")
    else:
        out.reader.script(value.removeprefix("!"), out, depth + 1, f"git -c {key}")


def _operands(entry: Program, command: Command, read: _Options, simple: SimpleCommand, out: Found,
              depth: int) -> None:
    """What a catalogued program does with its operands: runs them as a command, as a command line, as code."""
    operands, name = read.operands, entry.name
    if entry.code_subcommands and operands and operands[0] in entry.code_subcommands:
        out.unresolved.append(f"{name} {operands[0]} runs code toolkeeper does not read")
    if entry.code_operand and not read.code_file and len(operands) >= entry.code_operand:
        out.unresolved.append(f"{name} runs a program in another language, which toolkeeper does not read")
    first = operands[0] if operands else ""
    if entry.reads_code and not read.code_file and (
            first is None or first.startswith(DESCRIPTOR_FILES)
            or ((not operands or first in STDIN_FILES) and (simple.fed or simple.stdin is not None))):
        out.unresolved.append(f"{name} reads code from its input or a substitution, which toolkeeper does not read")
    for operand in operands:
        prefix = next((p for p in entry.command_prefixes if (operand or "").upper().startswith(p)), None)
        if prefix is not None:
            out.reader.script(operand[len(prefix):].split(",")[0], out, depth + 1, f"{name} {prefix}")  # type: ignore[index]
    if "+" in entry.code_options and any(len(o or "") > 1 and (o or "").startswith("+") for o in operands):
        out.unresolved.append(f"{name} +COMMAND runs code toolkeeper does not read")
    inner = operands[entry.operands:]
    if entry.runs and entry.operands and inner and (inner[0] or "").startswith("-") and inner[0] != "--":
        reread = _options(entry, inner, out, depth)  # `setarch x86_64 -R CMD`: options after its operands
        if reread is None:
            return
        inner = reread.operands
    given = option_in(inner[0] or "", entry.command_options, entry) if inner and entry.runs else None
    if given is not None:  # `flock FILE -c CMD`, `sg GROUP -c CMD`: the option after the operands
        _command_line(entry, given[0], given[1] if given[1] is not None else (inner[1] if len(inner) > 1 else None),
                      out, depth)
    elif entry.runs == "command":
        _wrapped(entry, command, inner, simple, out, depth)
        if read.unsure and len(inner) > 1:  # `sudo -a TYPE rm`: if the option took a value, the command is later
            _wrapped(entry, command, inner[1:], simple, out, depth, f"{name} {read.unsure} VALUE")
    elif entry.runs == "words":
        _words_run(entry, inner, out, depth)
        if read.unsure and len(inner) > 1:
            _words_run(entry, inner[1:], out, depth)
    elif entry.runs == "input" and not read.code_file:
        out.reader.script_file("/dev/stdin", name, simple, out, depth)
    elif entry.runs == "bash":  # capsh -- -c CMD: what follows is bash's
        out.reader.shell(Command(("bash", *operands), via=name), simple, out, depth)


def _wrapped(entry: Program, command: Command, inner: list[str | None], simple: SimpleCommand, out: Found,
             depth: int, how: str = "") -> None:
    """The command a wrapper runs, read as a command of its own."""
    name = entry.name
    if name == "parallel":
        _parallel(inner, out, depth)
        return
    if name == "coproc" and len(inner) > 1 and inner[1] in ("{", "("):
        inner = inner[1:]  # coproc NAME { ...; }: the name is the coprocess's, not a program
    if name == "xargs" and not inner:
        inner = ["echo"]
    if inner[:1] == ["--"]:  # `aws-vault exec PROFILE -- CMD`
        inner = inner[1:]
    if not inner:
        return
    via = f"{command.via} {how or name}".strip()
    before = len(out.commands)
    out.reader.simple(replace(simple, words=tuple(inner), assignments=()), out, depth + 1, via)
    if name == "xargs":  # xargs appends what it reads: the command's arguments are not all known
        out.commands[before:] = [replace(found, open_arguments=True) for found in out.commands[before:]]


def _words_run(entry: Program, words: list[str | None], out: Found, depth: int) -> None:
    """`watch CMD ARGS`, `ssh HOST CMD ARGS`, `sg GROUP CMD`: the words joined and run by a shell."""
    if any(word is None for word in words):
        out.unresolved.append(f"{entry.name} runs a command known only at run time")
    elif words:
        out.reader.script(" ".join(word for word in words if word is not None), out, depth + 1, entry.name)


def _parallel(words: list[str | None], out: Found, depth: int) -> None:
    """`parallel CMD ::: ARGS` runs CMD with each argument; `parallel ::: CMD...` runs each argument as a command
    line; arguments from files (`::::`) or from the input are known only at run time."""
    separators = [i for i, word in enumerate(words) if word in (":::", "::::", ":::+", "::::+")]
    template = words[:separators[0]] if separators else words
    if any(words[i] in ("::::", "::::+") for i in separators) or (not separators and not template):
        out.unresolved.append("parallel runs commands read at run time")
        return
    if template:
        _words_run(catalogue().program("parallel"), template, out, depth)  # type: ignore[arg-type]
        out.commands[:] = [replace(c, open_arguments=True) if c.via.endswith("parallel") else c
                           for c in out.commands]
        return
    for line in words[separators[0] + 1:]:
        if line is None:
            out.unresolved.append("parallel runs a command known only at run time")
        elif line not in (":::", ":::+"):
            out.reader.script(line, out, depth + 1, "parallel")
