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

from dataclasses import replace
from functools import lru_cache

from toolkeeper.policy import catalogued
from toolkeeper.policy.found import DESCRIPTOR_FILES, STDIN_FILES, Command, Found, Reader, Resolution, special_file
from toolkeeper.policy.programs import catalogue, command_option
from toolkeeper.policy.shell import SimpleCommand, parse_script

__all__ = ["Command", "Resolution", "commands_of_argv", "commands_of_script"]

MAX_DEPTH = 8


@lru_cache(maxsize=4096)
def commands_of_script(text: str) -> Resolution:
    """The commands a shell command line runs (cached: agents send the same lines again and again)."""
    found = Found(reader=READER)
    read_script(text, found, 0, "")
    return found.done()


@lru_cache(maxsize=1024)
def commands_of_argv(argv: tuple[str, ...]) -> Resolution:
    """The commands an argv runs (a `local_shell` action, a declared tool's argv): no shell reads it, but a
    program in it may be a shell or a wrapper."""
    found = Found(reader=READER)
    if argv:
        read_simple(SimpleCommand(tuple(argv)), found, 0, "")
    return found.done()


def read_script(text: str, out: Found, depth: int, via: str) -> None:
    """The commands of a script, each read in turn (and what each changes for those after it)."""
    if depth > MAX_DEPTH:
        out.unresolved.append("shells nested deeper than toolkeeper reads")
        return
    parsed = parse_script(text)
    out.unresolved.extend(parsed.problems)
    for simple in parsed.commands:
        simple = _with_line_state(simple, out)
        before = len(out.commands)
        read_simple(simple, out, depth, via)
        if out.moved:
            out.commands[before:] = [replace(c, moved=(*c.moved, *out.moved)) for c in out.commands[before:]]
        _after(simple, out)


def _with_line_state(simple: SimpleCommand, out: Found) -> SimpleCommand:
    """What earlier commands of the line changed for this one: `exec`'s input, `hash -p`'s programs."""
    if out.input is not None and simple.stdin is None and not simple.fed:
        simple = replace(simple, stdin=out.input[0], fed=out.input[1])
    words = simple.words
    if words and words[0] in out.hashed:
        simple = replace(simple, words=(out.hashed[words[0]], *words[1:]))
    return simple


def _after(simple: SimpleCommand, out: Found) -> None:
    """What a command changes for the commands after it on the line."""
    words = simple.words
    if any(name == "CDPATH" for name, _ in simple.assignments) and not words:
        out.cdpath = True
    if words and words[0] in ("cd", "pushd"):  # where the commands after it run (in a subshell or not)
        target = next((w for w in words[1:] if w is None or not w.startswith("-")), "~")
        # CDPATH is searched for a relative folder, unless its first part is . or .. (POSIX cd, step 5)
        relative = target is not None and not target.startswith(("/", "~", "./", "../")) and target not in (".", "..")
        if relative and (out.cdpath or any(name == "CDPATH" for name, _ in simple.assignments)):
            target = None  # `CDPATH=~ cd .aws`: searched for in CDPATH's folders
        out.moved = (*out.moved, target)
    elif words == ("exec",) and (simple.stdin is not None or simple.fed):
        out.input = (simple.stdin, simple.stdin is None)
    elif words and words[0] == "hash":
        _hash(words, out)


def _hash(words: tuple[str | None, ...], out: Found) -> None:
    """`hash -p PATH NAME`: NAME runs the program at PATH from then on."""
    if "-p" in words:
        at = words.index("-p")
        path = words[at + 1] if at + 1 < len(words) else None
        for name in words[at + 2:]:
            if name is None:
                out.unresolved.append("hash -p names a program known only at run time")
            else:
                out.hashed[name] = path


def read_simple(simple: SimpleCommand, out: Found, depth: int, via: str) -> None:
    words = list(simple.words)
    assignments = list(simple.assignments)
    while words and words[0] is not None and "=" in words[0] and not words[0].startswith("="):
        name, _, value = words.pop(0).partition("=")  # `A=1 rm`: an assignment left among the words (after a wrapper)
        assignments.append((name, value))
    for name, value in assignments:
        assigned(name, value, out, depth)
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
        read_simple(replace(simple, words=tuple(words[1:]), assignments=()), out, depth, via)
    elif not _builtin(command, simple, out, depth):
        catalogued.read(command, simple, out, depth)


def _builtin(command: Command, simple: SimpleCommand, out: Found, depth: int) -> bool:
    """The shell's own ways of running code (eval, source, trap, alias) and the programs read by code here:
    shells, su, find. False: the command is for the catalogue."""
    name, words = command.program or "", command.argv
    if name == "eval":
        out.commands.append(command)
        out.unresolved.append("eval runs a string built at run time")
    elif name in catalogue().shells:
        read_shell(command, simple, out, depth)
    elif name in ("su", "script") or (name == "runuser" and any(command_option(w) for w in words[1:])):
        _su(command, simple, out, depth)  # su -c CMD, script -c CMD, runuser USER -c CMD: run by a shell
    elif name == "find":
        _find(command, out, depth)
    elif name in ("source", "."):
        out.commands.append(command)
        read_script_file(words[1] if len(words) > 1 else None, name, simple, out, depth)
    elif name in ("trap", "mapfile", "readarray"):  # trap ACTION SIGNALS, mapfile -C CALLBACK: shell code
        out.commands.append(replace(command, transparent=True))
        if name == "trap":
            action = next((w for w in words[1:] if w is None or not w.startswith("-")), "")
        else:
            action = _mapfile_callback(words)
        if action is None:
            out.unresolved.append(f"{name} runs shell code known only at run time")
        elif action:
            read_script(action, out, depth + 1, name)
    elif name == "alias":
        out.commands.append(replace(command, transparent=True))
        for word in words[1:]:
            if word is None or "=" in word:
                # with expand_aliases, a later word runs it, its flags split between there and here
                out.unresolved.append("an alias defines what a later word runs")
                if word is not None:
                    read_script(word.partition("=")[2], out, depth + 1, "alias")
    else:
        return False
    return True


def _mapfile_callback(words: tuple[str | None, ...]) -> str | None:
    """mapfile's -C CALLBACK, however written (`-C cb`, `-tC cb`, `-Ccb`); "" when none, None when unknown."""
    for index, word in enumerate(words[1:], start=1):
        if word is None:
            return None
        if word.startswith("-") and "C" in word[1:]:
            attached = word[word.index("C", 1) + 1:]
            return attached or (words[index + 1] if index + 1 < len(words) else None)
    return ""


def assigned(name: str, value: str | None, out: Found, depth: int) -> None:
    """A variable set for a command or for the rest of the line: some are commands a program runs
    (`GIT_SSH_COMMAND`), start-up code of a shell (`BASH_ENV`), or code toolkeeper does not read."""
    kind = catalogue().variable(name)
    if not kind:
        return
    if kind == "command":
        if value is None:
            out.unresolved.append(f"{name} holds a command known only at run time")
        else:
            read_script(value.lstrip("|-"), out, depth + 1, name)  # LESSOPEN='|cmd %s'
    elif kind == "startup":
        if value is None or value in STDIN_FILES or value.startswith(DESCRIPTOR_FILES):
            out.unresolved.append(f"{name} makes a shell run start-up code toolkeeper cannot see")
    elif kind == "prompt":
        if value is None or any(expansion in value for expansion in ("$(", "${", "$[", "`")):
            out.unresolved.append(f"{name} holds a substitution a shell may run")
    else:
        out.unresolved.append(f"{name} holds code toolkeeper does not read")


def read_shell(command: Command, simple: SimpleCommand, out: Found, depth: int) -> None:
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
            assigned("BASH_ENV", args.pop(0) if args else None, out, depth)  # start-up code, as BASH_ENV is
        elif arg == "--":
            break
        elif arg.startswith(("--command", "--init-command", "--comm")):  # fish's (and its abbreviations)
            script = arg.partition("=")[2] if "=" in arg else (args.pop(0) if args else None)
            if script is None:
                out.unresolved.append("a shell's --command known only at run time")
            else:
                read_script(script, out, depth + 1, f"{name} --command")
        elif arg.startswith("--"):
            continue
        elif arg[:1] in "-+" and len(arg) > 1:
            script_next = script_next or "c" in arg[1:] or (name == "fish" and "C" in arg[1:])
            reads_input = reads_input or "s" in arg[1:]
        else:
            args.insert(0, arg)
            break
    if args and args[0] is not None:
        args[0] = special_file(args[0])
    runs_a_file = bool(args) and not script_next and not reads_input and args[0] not in STDIN_FILES \
        and not (args[0] or "").startswith(DESCRIPTOR_FILES)
    # the shell is looked through when it runs a script toolkeeper reads; running a file, it is the program
    out.commands.append(replace(command, transparent=not runs_a_file))
    if script_next:
        script = args[0] if args else None
        if script is None:
            out.unresolved.append(f"{name} -c runs a script known only at run time")
        else:
            read_script(script, out, depth + 1, f"{name} -c")
    elif not runs_a_file:
        read_script_file(args[0] if args and not reads_input else "/dev/stdin", name, simple, out, depth)


def read_script_file(path: str | None, name: str, simple: SimpleCommand, out: Found, depth: int) -> None:
    """A script read from a file: its input's (a heredoc toolkeeper reads, or a pipe it cannot), a heredoc on
    another descriptor (`bash /dev/fd/3 3<<EOF`), or another file."""
    if path is not None:
        path = special_file(path)
    if path is None:
        out.unresolved.append(f"{name} runs a script known only at run time")
    elif path.startswith(DESCRIPTOR_FILES) and path not in STDIN_FILES:
        descriptor = path.rsplit("/", 1)[1]
        text = dict(simple.descriptors).get(descriptor)
        if text is None:
            out.unresolved.append(f"{name} reads its commands from descriptor {descriptor}, which toolkeeper "
                                  "cannot see")
        else:
            read_script(text, out, depth + 1, f"{name} reading a heredoc")
    elif path not in STDIN_FILES:
        return  # a script file: what the file holds is not in the call
    elif simple.stdin is not None:
        read_script(simple.stdin, out, depth + 1, f"{name} reading a heredoc")
    elif simple.fed:
        out.unresolved.append(f"{name} reads its commands from its input (a pipe or a heredoc), which toolkeeper "
                              "cannot see")


def _su(command: Command, simple: SimpleCommand, out: Found, depth: int) -> None:
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
                read_script(script, out, depth + 1, f"{name} -c")
            return
    if simple.fed and name == "su":
        out.unresolved.append("su reads its commands from its input, which toolkeeper cannot see")


def _find(command: Command, out: Found, depth: int) -> None:
    """find itself, each `-exec`/`-execdir`/`-ok` command, and `-delete` as `rm -r -f` on its start paths."""
    out.commands.append(command)
    args = list(command.argv[1:])
    while args and (args[0] in ("-H", "-L", "-P", "-D") or (args[0] or "").startswith("-O")):
        option = args.pop(0)  # find's own options before its start paths (`find -L / -delete`)
        if option == "-D" and args:
            args.pop(0)
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
            if args[index + 1:index + 2] == ["{}"]:
                words[0] = None  # the program is each file found (`find /usr/bin -name rm -exec {} -rf /x`)
            words = [None if word is not None and "{}" in word and word != "{}" else word for word in words]
            read_simple(SimpleCommand(tuple(words)), out, depth + 1, f"find {arg}")
            index = end
        elif arg == "-delete":
            out.commands.append(Command(("rm", "-r", "-f", *(starts or ["."])), via="find -delete"))
        index += 1


READER = Reader(script=read_script, simple=read_simple, shell=read_shell, script_file=read_script_file,
                assigned=assigned)
