"""The `toolkeeper` command: one module per command, each adding its parser and running it.

    serve       run the proxy in front of the agent file's upstream
    intercept   the same for an agent that cannot change its base URL, through mitmproxy
    mcp         the declared tools and the agent's MCP servers, as an MCP server over stdio; their pins
    demo        the example agent file against a built-in offline model
    approvals | approve | deny   answer the calls waiting for a person
    hook        an agent's own tool hook (Claude Code, Gemini CLI, Codex CLI), decided by a running serve
    tokens      named tokens for approvers and auditors
    limits      what the policy's limits have counted; `limits reset`: clear a count
    audit       read the audit trail
    policy      test the security team's rules before they ship
    schema | check | model | eval   write good tools: what the model sees, a lint, the scripted model, success rates
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import os
import sys
from collections.abc import Iterator
from types import ModuleType

# Each command module, by the commands it adds. A command imports its own module only: `toolkeeper hook` runs
# before and after every tool call of an agent, and the proxy's modules take a second to import.
MODULES = {"serve": ("serve",), "intercept": ("intercept",), "mcp": ("mcp",), "demo": ("demo",),
           "approvals": ("approvals", "approve", "deny", "revoke"), "hooks": ("hook",), "tokens": ("tokens",),
           "audit": ("audit",), "limits": ("limits",), "policy": ("policy",),
           "authoring": ("schema", "check", "model"), "evaluation": ("eval",)}


def command_modules(wanted: str | None = None) -> list[ModuleType]:
    """The module adding the command `wanted`; every command module when it names none of them."""
    known = [module for module, names in MODULES.items() if wanted in names] or list(MODULES)
    return [importlib.import_module(f"toolkeeper.cli.{module}") for module in known]


def main(argv: list[str] | None = None) -> int:
    with no_collection():
        args = _arguments(sys.argv[1:] if argv is None else list(argv))
    try:
        return args.run(args)
    except BrokenPipeError:  # `toolkeeper audit list | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="toolkeeper",
                                     description="A policy-and-proxy layer between an agent and its tools.")
    parser.add_argument("--version", action=_Version)
    commands = parser.add_subparsers(dest="command", required=True)
    for command in command_modules(argv[0] if argv else None):  # no command, --help or a typo: all of them
        command.add_parser(commands)
    # after `--`: options for the toolkeeper `intercept` starts, passed on as they are
    argv, after = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # said by the command's own parser, with its usage, and what was likely meant
        _unknown_options(commands.choices[args.command], unknown)
    if after and not hasattr(args, "serve_options"):
        parser.error(f"{args.command} takes no options after --")
    args.serve_options = after
    return args


@contextlib.contextmanager
def no_collection() -> Iterator[None]:
    """A start's imports and the objects it builds, kept from the cyclic garbage collector: its passes over the
    growing heap of modules and classes cost `toolkeeper mcp` a tenth of a second before `initialize`. What was
    made is frozen at the end (gc.freeze: never scanned again, as serve freezes its heap before it forks)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


class _Version(argparse.Action):
    """argparse's `version` action, the version read only when asked for: importlib.metadata costs every command
    (a hook, run before every tool call of an agent) 20 ms."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: object):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="show program's version number and exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: object, values: object,
                 option_string: str | None = None) -> None:
        parser._print_message(f"toolkeeper {version()}\n", sys.stdout)
        parser.exit()


def _unknown_options(command: argparse.ArgumentParser, unknown: list[str]) -> None:
    import difflib

    known = [option for action in command._actions for option in action.option_strings]
    hints = [f"{given} (did you mean {close[0]}?)" if (close := difflib.get_close_matches(given.split("=")[0], known,
                                                                                       n=1)) else given
             for given in unknown]
    command.error(f"unrecognized arguments: {' '.join(hints)}")


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("toolkeeper")
    except PackageNotFoundError:
        return "unknown (not installed)"


if __name__ == "__main__":
    sys.exit(main())
