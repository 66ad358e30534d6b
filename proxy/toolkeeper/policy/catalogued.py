"""What a program of the catalogue (programs.yaml) runs: its options read as it reads them, the command lines
and code in them, and the command it is given.

commands.py hands each simple command whose program the catalogue names to `read`; what that program runs is
handed back to commands.py to be read in turn (each Found carries commands.py's readers: found.Reader).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, replace

from toolkeeper.policy import sed
from toolkeeper.policy.found import DESCRIPTOR_FILES, STDIN_FILES, Command, Found, special_file
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
    args = list(command.argv[1:])
    if entry.bundled_first and args and args[0] and args[0].isalpha():
        args = _unbundled(entry, args)  # `tar cIf CMD x.tar`: old-style options, their values after them
    read = _through_subcommand(entry, args, out, depth)
    if read is None:
        return
    # a wrapper that runs a command is looked through by allow rules, unless it changes who or where
    out.commands[at] = replace(out.commands[at], transparent=entry.transparent and entry.runs != "")
    _operands(entry, command, read, simple, out, depth)
    sub = catalogue().programs.get(f"{entry.name} {read.operands[0]}") if read.operands and read.operands[0] \
        else None
    if sub is not None:  # `git rebase -x CMD`: what the subcommand runs, read by its own entry
        _subcommand(sub, command, read.operands[1:], simple, out, depth)
    elif entry.name == "git" and read.operands[:1] == ["config"]:
        _git_config_command(read.operands[1:], out)


def _unbundled(entry: Program, args: list[str | None]) -> list[str | None]:
    first, rest, words = args[0] or "", args[1:], []
    for letter in first:
        words.append(f"-{letter}")
        if (f"-{letter}" in entry.command_options or values_taken(f"-{letter}", entry)) and rest:
            words.append(rest.pop(0))
    return [*words, *rest]


def _xargs_replacement(argv: tuple[str | None, ...]) -> str:
    """xargs's replacement string: -I R (or -IR), -i or --replace (`{}`), --replace=R; "" when none."""
    for index, word in enumerate(argv[1:], start=1):
        if word in ("-i", "--replace"):
            return "{}"
        if word is not None and word.startswith(("-i", "--replace=")):
            return word.split("=", 1)[1] if word.startswith("--") else word[2:]
        if word is not None and word.startswith("-I"):
            return word[2:] or (argv[index + 1] or "{}" if index + 1 < len(argv) else "{}")
    return ""


def _subcommand(entry: Program, command: Command, args: list[str | None], simple: SimpleCommand, out: Found,
                depth: int) -> None:
    read = _through_subcommand(entry, args, out, depth)
    if read is not None:
        _operands(entry, command, read, simple, out, depth)


def _through_subcommand(entry: Program, args: list[str | None], out: Found, depth: int) -> _Options | None:
    """A program's options, and for one that runs a command only after a subcommand (`poetry run CMD`), the
    options after it; None when it runs nothing more (`poetry install`, `command -v`)."""
    read = _options(entry, args, out, depth)
    if read is None or not entry.subcommands:
        return read
    if not read.operands or read.operands[0] not in entry.subcommands:
        return None
    return _options(entry, read.operands[1:], out, depth)


def _git_config_command(args: list[str | None], out: Found) -> None:
    """`git config [--global] KEY VALUE`: setting a key whose value git runs, for a later git to run."""
    for word in args:
        if word is None:
            out.unresolved.append("git config of a key known only at run time")
        elif not word.startswith("-"):
            if _git_key(word.lower()):
                out.unresolved.append(f"git config {word.lower()} sets what a later git runs")
            return


def _git_key(key: str) -> bool:
    known = catalogue()
    return any(fnmatch.fnmatchcase(key, glob) for glob in (*known.git_commands, *known.git_unread))


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
        read.code_file = True  # the code is given: no operand is code, nothing is read from the input
        code = given[1] if given[1] is not None else (args.pop(0) if args else None)
        _code(entry, code, f"{entry.name} {given[0]} runs code toolkeeper does not read", out)
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
        if _git_key(key):
            out.unresolved.append(f"git --config-env {key} takes its value from the environment")
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
    if any(fnmatch.fnmatchcase(key, glob) for glob in catalogue().git_unread):
        out.unresolved.append(f"git -c {key} changes what git runs or pushes in a way toolkeeper does not read")
    elif not any(fnmatch.fnmatchcase(key, glob) for glob in catalogue().git_commands):
        return
    elif key.startswith("alias."):
        if value.startswith("!"):
            out.reader.script(value[1:], out, depth + 1, f"git alias {key[6:]}")
        else:  # `git -c alias.p=push p -f`: the git command it stands for is not what the rules read
            out.unresolved.append(f"git -c {key} defines a git command toolkeeper does not read as such")
    elif key.startswith("credential") and not value.startswith(("!", "/")):
        return  # a helper's name: git runs git-credential-NAME
    else:
        out.reader.script(value.removeprefix("!"), out, depth + 1, f"git -c {key}")


def _operands(entry: Program, command: Command, read: _Options, simple: SimpleCommand, out: Found,
              depth: int) -> None:
    """What a catalogued program does with its operands: runs them as a command, as a command line, as code."""
    operands, name = read.operands, entry.name
    _code_in_operands(entry, read, simple, out)
    for operand in operands:
        prefix = next((p for p in entry.command_prefixes if (operand or "").upper().startswith(p)), None)
        if prefix is not None:
            out.reader.script(operand[len(prefix):].split(",")[0], out, depth + 1, f"{name} {prefix}")  # type: ignore[index]
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


def _code_in_operands(entry: Program, read: _Options, simple: SimpleCommand, out: Found) -> None:
    """Code in another language among a program's operands or on its input: unresolved, unless the entry's own
    small reader reads it (sed's common scripts)."""
    operands, name = read.operands, entry.name
    if entry.code_subcommands and operands and operands[0] in entry.code_subcommands:
        out.unresolved.append(f"{name} {operands[0]} runs code toolkeeper does not read")
    if entry.code_operand and not read.code_file and len(operands) >= entry.code_operand:
        _code(entry, operands[entry.code_operand - 1],
              f"{name} runs a program in another language, which toolkeeper does not read", out)
    first = special_file(operands[0]) if operands and operands[0] is not None else (operands[0] if operands else "")
    fed = simple.fed or simple.stdin is not None
    if entry.reads_code and not read.code_file and (first is None or first.startswith(DESCRIPTOR_FILES)
                                                    or ((not operands or first in STDIN_FILES) and fed)):
        out.unresolved.append(f"{name} reads code from its input or a substitution, which toolkeeper does not read")
    if entry.code_on_input and fed:
        out.unresolved.append(f"{name} reads commands from its input, which toolkeeper does not read")
    if "+" in entry.code_options and any(len(o or "") > 1 and (o or "").startswith("+") for o in operands):
        out.unresolved.append(f"{name} +COMMAND runs code toolkeeper does not read")
    if entry.code_in_operands and any(o is None or "$(" in o or "${" in o for o in operands):
        out.unresolved.append(f"{name} expands code in an operand, which toolkeeper does not read")


def _code(entry: Program, code: str | None, unread: str, out: Found) -> None:
    """Code given to a program: read by the entry's small reader when it has one, else unresolved (`unread`)."""
    if entry.code_reader == "sed" and code is not None and sed.reads(code):
        return
    out.unresolved.append(unread)


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
    if name == "xargs":  # `xargs -I{} sh -c {}`: a word holding the replacement string is each line read
        token = _xargs_replacement(command.argv)
        inner = [None if token and word is not None and token in word else word for word in inner]
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
