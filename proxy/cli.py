"""The `toolkeeper` command."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sqlite3
import sys
from datetime import datetime

from aiohttp import web

from proxy.agentfile import AgentFileError, load_agent_file
from proxy.approvals import TOKEN_VARIABLE, answer_command, list_command
from proxy.audit import AuditError
from proxy.opa import OpaPolicy
from proxy.rules import RulesError, default_rules_path, load_rules

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8787


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="toolkeeper", description="A policy-and-proxy layer between an agent "
                                     "and its tools.")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the proxy in front of the agent file's upstream")
    serve.add_argument("agent_file", help="the agent file (YAML) declaring the tools")
    serve.add_argument("--host", default=DEFAULT_HOST)
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help="0 picks a free port")
    serve.add_argument("--upstream", help="the model server's base URL, instead of the file's `upstream:`")
    serve.add_argument("--read-timeout", type=float, default=300,
                       help="seconds to wait for the model server's next byte (default 300)")
    serve.add_argument("--keepalive", type=float, default=5.0,
                       help="seconds between SSE keep-alive comments while a tool runs (default 5)")
    serve.add_argument("--store", help="the SQLite file for hidden history and retries "
                       "(default: toolkeeper.sqlite3 next to the agent file)")
    serve.add_argument("--audit", help="the audit trail: an SQLite file (default: toolkeeper-audit.sqlite3 next "
                       "to the agent file) or a postgresql:// URL, shared by several replicas")
    serve.add_argument("--redact", action="append", metavar="PATTERN",
                       help="redact argument values whose names contain PATTERN before they reach the audit trail "
                       "(repeatable; default: key, token, secret, password, authorization)")
    serve.add_argument("--history-ttl", type=float, default=24 * 3600,
                       help="seconds a hidden exchange is kept for the agent's next request (default 86400)")
    serve.add_argument("--policy", help="the security team's rules (YAML); default: the shipped "
                       "policies/default.yaml; `none` for no rules")
    serve.add_argument("--opa-url", help="the security team's OPA server (http://host:8181); its Rego decides "
                       "beside the YAML rules (which then apply only when --policy is given)")
    serve.add_argument("--opa-path", default="toolkeeper/decision", help="the rule OPA evaluates (default "
                       "toolkeeper/decision)")
    serve.add_argument("--opa-timeout", type=float, default=1.0, help="seconds OPA has to answer; past "
                       "them the call is denied (default 1)")
    serve.add_argument("--identity-header", help="a request header the deployment sets to name the agent; "
                       "policies read it as agent.header")
    serve.add_argument("--consent", choices=["auto", "terminal", "approvals", "none"], default="auto",
                       help="who is asked before a gated call: the terminal, the approvals API "
                       f"(needs ${TOKEN_VARIABLE}), or no one (every ask is a deny); auto: the terminal when "
                       "there is one, else approvals when the token is set")
    serve.add_argument("--consent-timeout", type=float, default=300,
                       help="seconds a call waits for an answer before it is denied (default 300)")
    serve.add_argument("--log-level", default="INFO")

    commands.add_parser("demo", help="run the example agent file against a built-in offline model")

    admin = argparse.ArgumentParser(add_help=False)
    admin.add_argument("--url", default=f"http://{DEFAULT_HOST}:{DEFAULT_PORT}",
                       help=f"toolkeeper's address (default http://{DEFAULT_HOST}:{DEFAULT_PORT}); the token "
                       f"comes from ${TOKEN_VARIABLE}")
    commands.add_parser("approvals", parents=[admin], help="list the calls waiting for approval")
    approve = commands.add_parser("approve", parents=[admin], help="approve a waiting call")
    approve.add_argument("id")
    approve.add_argument("--always", action="store_true", help="and always allow this tool from now on")
    approve.add_argument("--as", dest="approver", help="who approves (default: your user name)")
    deny = commands.add_parser("deny", parents=[admin], help="deny a waiting call")
    deny.add_argument("id")
    deny.add_argument("--reason", help="what the model is told")
    deny.add_argument("--as", dest="approver", help="who denies (default: your user name)")

    trail = argparse.ArgumentParser(add_help=False)
    trail.add_argument("--db", default=argparse.SUPPRESS,
                       help="the audit trail: serve's --audit (an SQLite file, or a postgresql:// URL); default "
                       "$TOOLKEEPER_AUDIT, else ./toolkeeper-audit.sqlite3")
    audit = commands.add_parser("audit", parents=[trail],
                                help="read the audit trail: list, show, tail, export, verify")
    audit_commands = audit.add_subparsers(dest="audit_command", required=True)
    listing = audit_commands.add_parser("list", parents=[trail], help="recent executions, one line each")
    for sub in (listing, audit_commands.add_parser("export", parents=[trail],
                                                   help="every record, as JSON lines or CSV")):
        sub.add_argument("--since", help="like 7d, 12h, 30m")
        sub.add_argument("--tool")
        sub.add_argument("--status", choices=["ok", "failed", "invalid", "denied", "timeout", "running"])
        sub.add_argument("--agent")
    audit_commands.choices["export"].add_argument("--format", choices=["jsonl", "csv"], default="jsonl")
    audit_commands.add_parser("show", parents=[trail], help="one execution in full").add_argument("id")
    audit_commands.add_parser("tail", parents=[trail], help="follow new records as they are written")
    audit_commands.add_parser("verify", parents=[trail],
                              help="walk the hash chain; name the first record that does not match")

    policy = commands.add_parser("policy", help="test the security team's rules before they ship")
    policy_commands = policy.add_subparsers(dest="policy_command", required=True)
    test = policy_commands.add_parser("test", help="run a scenario file: each call and the decision it expects")
    test.add_argument("scenarios")
    test.add_argument("--opa-url", help="run the scenarios against this OPA server too")
    test.add_argument("--opa-path", default="toolkeeper/decision")
    explain = policy_commands.add_parser("explain", help="show one call's policy input and the rule that decides")
    explain.add_argument("agent_file")
    explain.add_argument("tool")
    explain.add_argument("arguments", nargs="*", help="key=value, as the model would send them")
    explain.add_argument("--policy", help="the rules file (default: the shipped default; `none`: no rules)")
    explain.add_argument("--yolo", action=argparse.BooleanOptionalAction, default=None)
    explain.add_argument("--at", type=datetime.fromisoformat, help="the time of the call (ISO 8601)")
    explain.add_argument("--agent-id", default="")
    explain.add_argument("--agent-header")
    explain.add_argument("--opa-url", help="ask this OPA server (instead of the YAML rules)")
    explain.add_argument("--opa-path", default="toolkeeper/decision")

    args = parser.parse_args(argv)
    if args.command == "demo":
        from proxy.demo import run_demo

        return asyncio.run(run_demo())
    if args.command == "policy":
        return _policy(args)
    if args.command == "audit":
        from proxy.auditcli import run

        return run(args)
    if args.command == "approvals":
        return list_command(args.url)
    if args.command in ("approve", "deny"):
        return answer_command(args.url, args.id, args.command, always=getattr(args, "always", False),
                              reason=getattr(args, "reason", None), approver=args.approver)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        agent = load_agent_file(args.agent_file, upstream=args.upstream)
        if args.policy == "none" or (args.opa_url and not args.policy):
            rules = None
        else:
            rules = load_rules(args.policy or default_rules_path())
        opa = OpaPolicy(args.opa_url, args.opa_path, args.opa_timeout) if args.opa_url else None
    except (AgentFileError, RulesError, ValueError) as exc:
        print(f"toolkeeper: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(_serve(agent, rules, opa, args))


def _policy(args: argparse.Namespace) -> int:
    from proxy.policycheck import explain, run_tests

    try:
        if args.policy_command == "test":
            return run_tests(args.scenarios, opa_url=args.opa_url, opa_path=args.opa_path)
        return explain(args.agent_file, args.tool, args.arguments, policy=args.policy, yolo=args.yolo, at=args.at,
                       agent_id=args.agent_id, agent_header=args.agent_header, opa_url=args.opa_url,
                       opa_path=args.opa_path)
    except (AgentFileError, RulesError, ValueError) as exc:
        print(f"toolkeeper: {exc}", file=sys.stderr)
        return 2


async def _serve(agent, rules, opa, args) -> int:
    from proxy.server import build_app

    try:
        app = build_app(agent, read_timeout=args.read_timeout, keepalive=args.keepalive, store_path=args.store,
                        history_ttl=args.history_ttl, rules=rules, opa=opa, identity_header=args.identity_header,
                        admin_token=os.environ.get(TOKEN_VARIABLE) or None, consent_mode=args.consent,
                        consent_timeout=args.consent_timeout, audit_path=args.audit, redact=args.redact)
    except (ValueError, AuditError) as exc:
        print(f"toolkeeper: {exc}", file=sys.stderr)
        return 2
    except sqlite3.Error as exc:
        print(f"toolkeeper: cannot open a database: {exc} (the store and the audit trail live next to the "
              "agent file unless --store and --audit say where)", file=sys.stderr)
        return 2
    # handler_cancellation: an agent that disconnects cancels its turn, and with
    # it the running tool (its process group is killed).
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    try:
        await site.start()
    except OSError as exc:
        print(f"toolkeeper: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        await runner.cleanup()
        return 1
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    policy = f"rules {rules.path.name} @{rules.revision}" if rules else "no YAML rules"
    if opa:
        policy += f", OPA {opa.url}/v1/data/{opa.path}"
    print(f"toolkeeper listening on http://{args.host}:{port}/v1 "
          f"({len(agent.tools)} declared tools from {agent.path}, upstream {agent.config.upstream}, {policy})",
          flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
