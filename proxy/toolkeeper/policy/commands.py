"""What a command line or an argv really runs: each program, with the programs around it looked through.

`sudo -u root env A=1 timeout 5 rm -rf /` runs four programs: sudo, env,
timeout and rm, and a rule about rm must see the last. What toolkeeper knows
about programs that run what they are given is data, in programs.yaml: a
wrapper's options are read as the wrapper reads them, so its own option values
are never taken for the program; a command line given to a program (`bash -c`,
`ssh host CMD`, `rsync -e CMD`, `git -c alias.x=!CMD`, a heredoc fed to a
shell, `GIT_SSH_COMMAND=CMD`) is parsed in turn; `find -exec` runs the command
it names and `find -delete` counts as `rm -r -f` on the paths it searches.

What toolkeeper cannot know is said in `unresolved`, and the rules fail closed
on it: a program from a variable or a substitution, `eval`, a shell reading
its commands from a pipe, a parse error, code in another language
(`python3 -c`, an awk program), start-up code (`BASH_ENV`, `PS4='$(...)'`).
"""

from __future__ import annotations

import fnmatch
import posixpath
from dataclasses import dataclass, field, replace
from functools import lru_cache

from toolkeeper.policy.programs import (
    Program,
    catalogue,
    command_option,
    known_flags,
    option_in,
    split_string,
    splits,
    stops,
    values_taken,
)
from toolkeeper.policy.shell import SimpleCommand, parse_script

STDIN_FILES = frozenset({"/dev/stdin", "/dev/fd/0", "/proc/self/fd/0", "-"})  # a script file that is the input
DESCRIPTOR_FILES = ("/dev/fd/", "/proc/self/fd/")
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
    read_by: str = ""  # the catalogue entry it was read by (programs.yaml), for `policy explain`

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
    """A resolution being built, with what the line has set so far for the commands after."""

    commands: list[Command] = field(default_factory=list)
    unresolved: list[str] = field(default_factory=list)
    moved: tuple[str | None, ...] = ()  # the `cd`s seen so far
    cdpath: bool = False  # CDPATH was set: where a `cd` goes is not known
    hashed: dict[str, str | None] = field(default_factory=dict)  # `hash -p PATH NAME`: NAME runs PATH
    input: tuple[str | None, bool] | None = None  # `exec 0<<< SCRIPT`: (the script, or None with fed) from then

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
        simple = _with_line_state(simple, out)
        before = len(out.commands)
        _simple(simple, out, depth, via)
        if out.moved:
            out.commands[before:] = [replace(c, moved=(*c.moved, *out.moved)) for c in out.commands[before:]]
        _after(simple, out)


def _with_line_state(simple: SimpleCommand, out: _Found) -> SimpleCommand:
    """What earlier commands of the line changed for this one: `exec`'s input, `hash -p`'s programs."""
    if out.input is not None and simple.stdin is None and not simple.fed:
        simple = replace(simple, stdin=out.input[0], fed=out.input[1])
    words = simple.words
    if words and words[0] in out.hashed:
        simple = replace(simple, words=(out.hashed[words[0]], *words[1:]))
    return simple


def _after(simple: SimpleCommand, out: _Found) -> None:
    """What a command changes for the commands after it on the line."""
    words = simple.words
    if any(name == "CDPATH" for name, _ in simple.assignments) and not words:
        out.cdpath = True
    if words and words[0] in ("cd", "pushd"):  # where the commands after it run (in a subshell or not)
        target = next((w for w in words[1:] if w is None or not w.startswith("-")), "~")
        relative = target is not None and not target.startswith(("/", "~", "."))
        if relative and (out.cdpath or any(name == "CDPATH" for name, _ in simple.assignments)):
            target = None  # `CDPATH=~ cd .aws`: searched for in CDPATH's folders
        out.moved = (*out.moved, target)
    elif words == ("exec",) and (simple.stdin is not None or simple.fed):
        out.input = (simple.stdin, simple.stdin is None)
    elif words and words[0] == "hash":
        _hash(words, out)


def _hash(words: tuple[str | None, ...], out: _Found) -> None:
    """`hash -p PATH NAME`: NAME runs the program at PATH from then on."""
    if "-p" in words:
        at = words.index("-p")
        path = words[at + 1] if at + 1 < len(words) else None
        for name in words[at + 2:]:
            if name is None:
                out.unresolved.append("hash -p names a program known only at run time")
            else:
                out.hashed[name] = path


def _simple(simple: SimpleCommand, out: _Found, depth: int, via: str) -> None:
    words = list(simple.words)
    assignments = list(simple.assignments)
    while words and words[0] is not None and "=" in words[0] and not words[0].startswith("="):
        name, _, value = words.pop(0).partition("=")  # `A=1 rm`: an assignment left among the words (after a wrapper)
        assignments.append((name, value))
    for name, value in assignments:
        _assigned(name, value, out, depth)
    if not words:
        if simple.writes:
            out.commands.append(Command((), simple.writes, transparent=True, via=via))
        return
    program = words[0]
    if program is None:
        out.unresolved.append("the program comes from a variable or a substitution")
        return
    if program not in ("[", "[[") and any(ch in program for ch in "*?["):
        out.unresolved.append(f"the program {program!r} is a pattern the shell expands")
        return
    command = Command(tuple(words), simple.writes, via=via, reads=simple.reads)
    if program in ("{", "(", "}", ")"):  # `time { ...; }`: tree-sitter leaves the group's braces among the words
        _simple(replace(simple, words=tuple(words[1:]), assignments=()), out, depth, via)
    elif not _builtin(command, simple, out, depth):
        _catalogued(command, simple, out, depth)


def _builtin(command: Command, simple: SimpleCommand, out: _Found, depth: int) -> bool:
    """The shell's own ways of running code (eval, source, trap, alias) and the programs read by code here:
    shells, su, find. False: the command is for the catalogue."""
    name, words = command.program or "", command.argv
    if name == "eval":
        out.commands.append(command)
        out.unresolved.append("eval runs a string built at run time")
    elif name in catalogue().shells:
        _shell(command, simple, out, depth)
    elif name in ("su", "script") or (name == "runuser" and any(command_option(w) for w in words[1:])):
        _su(command, simple, out, depth)  # su -c CMD, script -c CMD, runuser USER -c CMD: run by a shell
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
        return False
    return True


def _assigned(name: str, value: str | None, out: _Found, depth: int) -> None:
    """A variable set for a command or for the rest of the line: some are commands a program runs
    (`GIT_SSH_COMMAND`), start-up code of a shell (`BASH_ENV`), or code toolkeeper does not read."""
    kind = catalogue().variable(name)
    if not kind:
        return
    if kind == "command":
        if value is None:
            out.unresolved.append(f"{name} holds a command known only at run time")
        else:
            _script(value.lstrip("|-"), out, depth + 1, name)  # LESSOPEN='|cmd %s'
    elif kind == "startup":
        if value is None or value in STDIN_FILES or value.startswith(DESCRIPTOR_FILES):
            out.unresolved.append(f"{name} makes a shell run start-up code toolkeeper cannot see")
    elif kind == "prompt":
        if value is None or any(expansion in value for expansion in ("$(", "${", "$[", "`")):
            out.unresolved.append(f"{name} holds a substitution a shell may run")
    else:
        out.unresolved.append(f"{name} holds code toolkeeper does not read")


def _shell(command: Command, simple: SimpleCommand, out: _Found, depth: int) -> None:
    """`bash -c SCRIPT`, `bash FILE`, or a shell reading its commands from its input."""
    args, script_next, reads_input = list(command.argv[1:]), False, False
    name = command.program or ""
    while args:
        arg = args.pop(0)
        if arg is None:
            out.unresolved.append("a shell option known only at run time")
            return
        if arg in ("-o", "+o", "-O", "+O"):
            args = args[1:]
        elif arg in ("--rcfile", "--init-file"):
            _assigned("BASH_ENV", args.pop(0) if args else None, out, depth)  # start-up code, as BASH_ENV is
        elif arg == "--":
            break
        elif arg.startswith(("--command", "--init-command", "--comm")):  # fish's (and its abbreviations)
            script = arg.partition("=")[2] if "=" in arg else (args.pop(0) if args else None)
            if script is None:
                out.unresolved.append("a shell's --command known only at run time")
            else:
                _script(script, out, depth + 1, f"{name} --command")
        elif arg.startswith("--"):
            continue
        elif arg[:1] in "-+" and len(arg) > 1:
            script_next = script_next or "c" in arg[1:] or (name == "fish" and "C" in arg[1:])
            reads_input = reads_input or "s" in arg[1:]
        else:
            args.insert(0, arg)
            break
    runs_a_file = bool(args) and not script_next and not reads_input and args[0] not in STDIN_FILES \
        and not (args[0] or "").startswith(DESCRIPTOR_FILES)
    # the shell is looked through when it runs a script toolkeeper reads; running a file, it is the program
    out.commands.append(replace(command, transparent=not runs_a_file))
    if script_next:
        script = args[0] if args else None
        if script is None:
            out.unresolved.append(f"{name} -c runs a script known only at run time")
        else:
            _script(script, out, depth + 1, f"{name} -c")
    elif not runs_a_file:
        _script_file(args[0] if args and not reads_input else "/dev/stdin", name, simple, out, depth)


def _script_file(path: str | None, name: str, simple: SimpleCommand, out: _Found, depth: int) -> None:
    """A script read from a file: its input's (a heredoc toolkeeper reads, or a pipe it cannot), a heredoc on
    another descriptor (`bash /dev/fd/3 3<<EOF`), or another file."""
    if path is None:
        out.unresolved.append(f"{name} runs a script known only at run time")
    elif path.startswith(DESCRIPTOR_FILES) and path not in STDIN_FILES:
        descriptor = path.rsplit("/", 1)[1]
        text = dict(simple.descriptors).get(descriptor)
        if text is None:
            out.unresolved.append(f"{name} reads its commands from descriptor {descriptor}, which toolkeeper "
                                  "cannot see")
        else:
            _script(text, out, depth + 1, f"{name} reading a heredoc")
    elif path not in STDIN_FILES:
        return  # a script file: what the file holds is not in the call
    elif simple.stdin is not None:
        _script(simple.stdin, out, depth + 1, f"{name} reading a heredoc")
    elif simple.fed:
        out.unresolved.append(f"{name} reads its commands from its input (a pipe or a heredoc), which toolkeeper "
                              "cannot see")


@dataclass
class _Options:
    """A program's own options as read: its operands after them, and whether its code came in a file."""

    operands: list[str | None]
    code_file: bool = False
    unsure: str = ""  # the last option before the operands, which the catalogue does not say takes no value


def _catalogued(command: Command, simple: SimpleCommand, out: _Found, depth: int) -> None:
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


def _options(entry: Program, args: list[str | None], out: _Found, depth: int) -> _Options | None:
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
                _assigned(name, value, out, depth)
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


def _option(entry: Program, arg: str, args: list[str | None], read: _Options, out: _Found, depth: int) -> bool:
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


def _command_given(entry: Program, given: tuple[str, str | None], args: list[str | None], out: _Found,
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
        _simple(SimpleCommand(tuple(words)), out, depth + 1, f"{entry.name} {option}")


def _command_line(entry: Program, option: str, value: str | None, out: _Found, depth: int) -> None:
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
            _script(setting.strip(), out, depth + 1, f"{entry.name} -o {key}")
        elif option == "-S":
            _script(value, out, depth + 1, via)
    elif entry.name == "tar" and option == "--checkpoint-action":
        if value.startswith("exec="):
            _script(value[5:], out, depth + 1, via)
    else:
        _script(value, out, depth + 1, via)


def _git_config(setting: str, out: _Found, depth: int) -> None:
    """`git -c KEY=VALUE`: a key whose value git hands to a shell is read as a command line (an alias only when
    it starts with `!`; any other alias is a git command)."""
    key, _, value = setting.partition("=")
    key = key.lower()
    if not any(fnmatch.fnmatchcase(key, glob) for glob in catalogue().git_commands):
        return
    if key.startswith("alias."):
        if value.startswith("!"):
            _script(value[1:], out, depth + 1, f"git alias {key[6:]}")
    elif key.startswith("credential") and not value.startswith(("!", "/")):
        return  # a helper's name: git runs git-credential-NAME
    elif key.startswith(("include", "protocol", "core.hookspath")):
        out.unresolved.append(f"git -c {key} changes what git runs in a way toolkeeper does not read")
    else:
        _script(value.removeprefix("!"), out, depth + 1, f"git -c {key}")


def _operands(entry: Program, command: Command, read: _Options, simple: SimpleCommand, out: _Found,
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
            _script(operand[len(prefix):].split(",")[0], out, depth + 1, f"{name} {prefix}")  # type: ignore[index]
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
        _script_file("/dev/stdin", name, simple, out, depth)
    elif entry.runs == "bash":  # capsh -- -c CMD: what follows is bash's
        _shell(Command(("bash", *operands), via=name), simple, out, depth)


def _wrapped(entry: Program, command: Command, inner: list[str | None], simple: SimpleCommand, out: _Found,
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
    _simple(replace(simple, words=tuple(inner), assignments=()), out, depth + 1, via)
    if name == "xargs":  # xargs appends what it reads: the command's arguments are not all known
        out.commands[before:] = [replace(found, open_arguments=True) for found in out.commands[before:]]


def _words_run(entry: Program, words: list[str | None], out: _Found, depth: int) -> None:
    """`watch CMD ARGS`, `ssh HOST CMD ARGS`, `sg GROUP CMD`: the words joined and run by a shell."""
    if any(word is None for word in words):
        out.unresolved.append(f"{entry.name} runs a command known only at run time")
    elif words:
        _script(" ".join(word for word in words if word is not None), out, depth + 1, entry.name)


def _parallel(words: list[str | None], out: _Found, depth: int) -> None:
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
            _script(line, out, depth + 1, "parallel")


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
