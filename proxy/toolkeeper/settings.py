"""Every `serve` option, declared once: its default, its help, and the flag derived from it.

`toolkeeper serve` builds its command line from these fields, and
`app.build_app(agent, settings)` reads nothing else. Adding an option is one
field here and the code that reads it.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

TOKEN_VARIABLE = "TOOLKEEPER_ADMIN_TOKEN"  # noqa: S105 - the variable's name, not a token


def option(default: Any, help: str, *, choices: tuple[str, ...] | None = None, metavar: str | None = None,
           flag: bool = True) -> Any:
    """A setting: `flag=False` for one that never comes from the command line (a secret, read from the environment)."""
    return field(default=default, metadata={"help": help, "choices": choices, "metavar": metavar, "flag": flag})


@dataclass(frozen=True)
class Settings:
    host: str = option("127.0.0.1", "the address to listen on")
    port: int = option(8787, "the port to listen on; 0 picks a free one")
    upstream: str | None = option(None, "the model server's base URL, instead of the agent file's `upstream:`")
    read_timeout: float = option(300.0, "seconds to wait for the model server's next byte")
    keepalive: float = option(5.0, "seconds between SSE keep-alive comments while a tool runs")
    store: str | None = option(None, "the SQLite file for hidden history, retries and approvals "
                                     "(default: toolkeeper.sqlite3 next to the agent file)")
    audit: str | None = option(None, "the audit trail: an SQLite file (default: toolkeeper-audit.sqlite3 next to "
                                     "the agent file) or a postgresql:// URL, shared by several replicas")
    redact: tuple[str, ...] = option((), "also redact argument values whose names contain PATTERN, beside the "
                                         "defaults (key, token, secret, password, authorization); repeatable",
                                     metavar="PATTERN")
    redact_only: tuple[str, ...] = option((), "redact only values whose names contain PATTERN, replacing the "
                                              "defaults; repeatable", metavar="PATTERN")
    history_ttl: float = option(24 * 3600.0, "seconds a hidden exchange is kept for the agent's next request")
    policy: str | None = option(None, "the security team's rules (YAML); default: the shipped "
                                      "policies/default.yaml; `none` for no rules")
    opa_url: str | None = option(None, "the security team's OPA server (http://host:8181); its Rego decides beside "
                                       "the YAML rules (which then apply only when --policy is given)")
    opa_path: str = option("toolkeeper/decision", "the rule OPA evaluates")
    opa_timeout: float = option(1.0, "seconds OPA has to answer; past them the call is denied")
    identity_header: str | None = option(None, "a request header the deployment sets to name the agent; policies "
                                               "read it as agent.header")
    consent: str = option("auto", "who is asked before a gated call: the terminal, the approvals API (needs "
                                  f"${TOKEN_VARIABLE}), or no one (every ask is a deny); auto: the terminal when "
                                  "there is one, else approvals when the token is set",
                          choices=("auto", "terminal", "approvals", "none"))
    consent_timeout: float = option(300.0, "seconds a call waits for an answer before it is denied")
    allow_origin: tuple[str, ...] = option((), "a web origin (https://app.example) whose pages may call toolkeeper "
                                                "(repeatable; default: none, every request with a browser Origin "
                                                "is refused)", metavar="ORIGIN")
    agent_keys: str | None = option(None, "a YAML file listing agents and the SHA-256 of their keys (`agents:`, "
                                          "as in the agent file); a request must then present a known key")
    idle_timeout: float = option(15.0, "seconds a connection may stay without a complete request (before its "
                                       "headers, or between requests) before it is closed")
    log_level: str = option("INFO", "DEBUG, INFO, WARNING or ERROR")
    admin_token: str | None = option(None, f"the admin API's token, from ${TOKEN_VARIABLE}", flag=False)

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """One flag per setting (`read_timeout` -> `--read-timeout`), typed by its default."""
        for setting in fields(cls):
            meta = setting.metadata
            if not meta["flag"]:
                continue
            default = setting.default if setting.default is not MISSING else None
            shown = f" (default {default})" if default not in (None, ()) else ""
            kwargs: dict[str, Any] = {"help": meta["help"] + shown, "default": default, "dest": setting.name}
            if meta["choices"]:
                kwargs["choices"] = meta["choices"]
            if meta["metavar"]:
                kwargs["metavar"] = meta["metavar"]
            if isinstance(default, tuple):
                kwargs.update(action="append", default=None)
            elif isinstance(default, (int, float)) and not isinstance(default, bool):
                kwargs["type"] = type(default)
            parser.add_argument("--" + setting.name.replace("_", "-"), **kwargs)

    @classmethod
    def from_arguments(cls, arguments: argparse.Namespace, environ: dict[str, str] | None = None) -> Settings:
        environ = dict(os.environ) if environ is None else environ
        values = {s.name: getattr(arguments, s.name) for s in fields(cls) if s.metadata["flag"]}
        for name, value in values.items():
            if isinstance(value, list):  # repeatable flags
                values[name] = tuple(value)
            elif value is None and isinstance(getattr(cls, name, None), tuple):
                values[name] = ()
        return cls(**values, admin_token=environ.get(TOKEN_VARIABLE) or None)
