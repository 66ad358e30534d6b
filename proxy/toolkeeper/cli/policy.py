"""`toolkeeper policy test` and `toolkeeper policy explain`: rules checked before they ship.

    toolkeeper policy test policies/default_scenarios.yaml [--opa-url URL]
    toolkeeper policy explain agent.yaml release version=1.4.2 channel=stable

A call is described as the model would make it (tool and arguments); the tool's
declaration in the agent file gives its tier, its runner and its argv, and the
call takes the steps `serve` takes (`check_call`, `CallHandler.document`,
`Policy.decide`), so a scenario exercises the real policy input.
A call with `source: agent` is one of the agent's own tools (Claude Code's
Bash, Codex's exec_command): not in the agent file, its arguments as sent.
A scenario's `principal:` (explain's `--user`, `--group`) says whom the call
is for, as an agent's token or a trusted identity header would; its
`labels:`, `session:`, `after:` and `secrets:` say the call's flow
(policy_flows.py), and `expect_labels:` and `flow:` what it must come to;
its `limits:` (explain's `--limit ID=USED`) the limits' counts before the call
(policy_limits.py), each limit that selects it deciding beside the rules.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from toolkeeper.cli import policy_flows, policy_limits
from toolkeeper.cli.policy_flows import Finding, SessionSpec
from toolkeeper.cli.policy_import import add_import_parser, run_import
from toolkeeper.cli.policy_limits import Counts
from toolkeeper.cli.replay import add_replay_parser, run_replay
from toolkeeper.common import Strict, load_yaml_model
from toolkeeper.engine import CallHandler, TurnContext
from toolkeeper.policy import (
    DEFAULT_PATH,
    Decision,
    NoConsent,
    OpaPolicy,
    Policy,
    Rules,
    RulesError,
    commands_in,
    default_rules_path,
    load_rules,
    rules_in_force,
    with_limits,
)
from toolkeeper.tools import Agent, AgentFileError, check_call, load_agent_file


class Call(Strict):
    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    source: Literal["declared", "agent", "hosted", "mcp"] = "declared"  # agent: the agent's own; hosted: the
    #                                                                       server's; mcp: an MCP server's
    kind: str = "function"  # an agent's call: its type as the model sends it (shell_call, apply_patch_call, ...)
    labels: tuple[str, ...] = ()  # what its tool carries, as `labels:` in the agent file or mcp_servers: says

    @field_validator("labels", mode="before")
    @classmethod
    def _one_label(cls, value: Any) -> Any:
        return (value,) if isinstance(value, str) else value


class Principal(Strict):
    """Whom a call is for, as serve would learn it from an agent's token or a trusted identity header: the policy
    input's `principal` (its agent, when not given, is the scenario's `agent.id`)."""

    user: str | None = None
    groups: tuple[str, ...] = ()
    issuer: str | None = None
    agent: str | None = None
    claims: dict[str, Any] = Field(default_factory=dict)

    @field_validator("groups", mode="before")
    @classmethod
    def _one_group(cls, value: Any) -> Any:
        return (value,) if isinstance(value, str) else value

    def document(self) -> dict[str, Any]:
        given = self.model_dump(exclude_none=True)
        return {**given, "groups": list(self.groups)}


class Situation(Strict):
    """When and for whom a call is decided: what a scenario (or `explain`'s options) says of the request."""

    yolo: bool | None = None  # None: the agent file's
    interactive: bool = True
    at: datetime | None = None
    agent: dict[str, str] = Field(default_factory=dict)  # id, header
    workdir: str | None = None  # the agent's working directory, as a hook would say it (null: not known)
    principal: Principal | None = None  # whom the call is for (null: the agent alone)
    session: SessionSpec | None = None  # what its session has seen before it (null: a fresh one)
    secrets: tuple[Finding, ...] | None = None  # found in its arguments (null: an egress call's are scanned)
    limits: Counts = Field(default_factory=dict)  # the limits' counts before the call (not given: 0)


class Scenario(Situation):
    name: str
    call: Call
    expect: str
    rule: str | None = None
    shadow: tuple[str, ...] | None = None  # the shadow rules that must match it (none: not checked)
    after: tuple[Call, ...] = ()  # the calls its session made before it, each decided in turn: after-1, after-2...
    labels: tuple[str, ...] = ()  # what the call's tool carries (as its `call: {labels: ...}`)

    @field_validator("labels", mode="before")
    @classmethod
    def _one_label(cls, value: Any) -> Any:
        return (value,) if isinstance(value, str) else value
    expect_labels: tuple[str, ...] | None = None  # the labels the call must have, exactly (none: not checked)
    flow: tuple[str, ...] | None = None  # the record ids its decision must name (none: not checked)


class ScenarioFile(Strict):
    agent_file: str
    policy: str | None = None
    scenarios: tuple[Scenario, ...]


def add_parser(commands: argparse._SubParsersAction) -> None:
    policy = commands.add_parser("policy", help="test the security team's rules before they ship")
    policy.set_defaults(run=run)
    policy_commands = policy.add_subparsers(dest="policy_command", required=True)
    test = policy_commands.add_parser("test", help="run a scenario file: each call and the decision it expects")
    test.add_argument("scenarios", help="the scenarios file (YAML): calls in, the expected decisions out")
    test.add_argument("--opa-url", help="run the scenarios against this OPA server too")
    test.add_argument("--opa-path", default=DEFAULT_PATH, help=f"the rule OPA evaluates (default {DEFAULT_PATH})")
    add_replay_parser(policy_commands)
    add_import_parser(policy_commands)
    explain = policy_commands.add_parser("explain", help="show one call's policy input and the rule that decides")
    explain.add_argument("agent_file", help="the agent file (YAML) declaring the tool")
    explain.add_argument("tool", help="the tool's name (with --source agent, one of the agent's own)")
    explain.add_argument("arguments", nargs="*", help="key=value, as the model would send them")
    explain.add_argument("--policy", help="the rules file (default: the shipped default; `none`: no rules)")
    explain.add_argument("--yolo", action=argparse.BooleanOptionalAction, default=None,
                         help="decide as with yolo on (or off); default: the agent file's")
    explain.add_argument("--at", type=datetime.fromisoformat, help="the time of the call (ISO 8601)")
    explain.add_argument("--agent-id", default="", help="the agent's name or hash, as policies read it")
    explain.add_argument("--agent-header", help="the identity header's value, as policies read agent.header")
    explain.add_argument("--user", help="the user the call is for, as policies read principal.user")
    explain.add_argument("--group", action="append", default=[], dest="groups", metavar="GROUP",
                         help="a group of that user, as policies read principal.groups (repeatable)")
    explain.add_argument("--workdir", help="the agent's working directory, as its hook would say it: relative "
                                           "paths resolve in it (default: not known)")
    explain.add_argument("--label", action="append", default=[], dest="labels", metavar="LABEL",
                         help="a label the tool carries, as the agent file's labels: would give it (repeatable)")
    explain.add_argument("--session-has", action="append", default=[], metavar="LABEL",
                         help="a label the call's session has already seen, as policies read session.has "
                              "(repeatable)")
    explain.add_argument("--source", choices=["declared", "agent", "hosted", "mcp"], default="declared",
                         help="agent: TOOL is one of the agent's own (Bash, exec_command), not in the agent file")
    explain.add_argument("--kind", default="function",
                         help="with --source agent: the call's type (shell_call, local_shell_call, apply_patch_call, "
                              "computer_call; default function)")
    explain.add_argument("--limit", action="append", default=[], dest="limits", metavar="ID=USED",
                         help="a limit's count before the call, in its unit (run_time: seconds), as a scenario's "
                              "limits: gives it (repeatable; a limit not given counts 0)")
    explain.add_argument("--opa-url", help="ask this OPA server (instead of the YAML rules)")
    explain.add_argument("--opa-path", default=DEFAULT_PATH, help=f"the rule OPA evaluates (default {DEFAULT_PATH})")


def run(args: argparse.Namespace) -> int:
    try:
        if args.policy_command == "replay":
            return run_replay(args)
        if args.policy_command == "import":
            return run_import(args)
        if args.policy_command == "test":
            return run_tests(args.scenarios, opa_url=args.opa_url, opa_path=args.opa_path)
        return explain(args)
    except (AgentFileError, RulesError, ValueError) as exc:
        print(f"toolkeeper: {exc}", file=sys.stderr)
        return 2


async def evaluate(agent: Agent, rules: Rules | None, opa: OpaPolicy | None, call: Call, situation: Situation,
                   *, labeller: Rules | None = None,
                   session: dict[str, Any] | None = None) -> tuple[dict[str, Any], Decision]:
    """The policy input `serve` would build for this call, and the decision, by the steps `serve` takes.
    `labeller`: the rules whose label rules label the call (by default `rules`: OPA decides on labels YAML
    gives); `session`: what its session has seen (by default the situation's)."""
    yolo = agent.config.yolo if situation.yolo is None else situation.yolo
    handler = CallHandler(runners={}, consent=NoConsent(), policy=Policy(yolo, rules, opa))
    turn = TurnContext(agent=situation.agent.get("id", ""), agent_header=situation.agent.get("header"),
                       workdir=situation.workdir,
                       principal=situation.principal.document() if situation.principal is not None else None)
    session = session if session is not None else policy_flows.start(situation.session, situation.at)
    if call.source != "declared":
        document = handler.document(call.tool, call.arguments, None, turn, interactive=situation.interactive,
                                    now=situation.at, kind=call.kind, source=call.source)
        policy_flows.put(document, labeller or rules, call.labels, session, situation.secrets)
        return document, await _decide(handler.policy, document, labeller or rules, situation)
    tool = agent.tools.get(call.tool)
    if tool is None:
        raise RulesError(f"{call.tool!r} is not a tool of {agent.path} (its tools: {', '.join(agent.tools)}); "
                         "one of the agent's own tools is described with `source: agent`")
    checked = check_call(tool, call.arguments)
    if checked.problems:
        raise RulesError(f"the call to {call.tool} is invalid, so no policy would see it: "
                         + "; ".join(checked.problems))
    document = handler.document(tool, checked.values, checked.argv, turn, interactive=situation.interactive,
                                now=situation.at)
    declared = (*call.labels, *getattr(tool.spec, "labels", ()))
    policy_flows.put(document, labeller or rules, declared, session, situation.secrets)
    return document, await _decide(handler.policy, document, labeller or rules, situation)


async def _decide(policy: Policy, document: dict[str, Any], rules: Rules | None, situation: Situation) -> Decision:
    """As `serve` decides: the limits that select the call read their counts into its policy input first (the
    rules read them), and a limit it would take past its maximum decides beside the rules."""
    limited = policy_limits.take(document, rules, situation.limits)
    return with_limits(await policy.decide(document), limited)


async def run_scenario(agent: Agent, rules: Rules | None, opa: OpaPolicy | None, scenario: Scenario,
                       labeller: Rules) -> tuple[dict[str, Any], Decision]:
    """A scenario's call, decided after the calls its session made before it (`after:`): each decided in
    turn, and its labels kept in the session unless it was denied (an ask counts as granted)."""
    session = policy_flows.start(scenario.session, scenario.at)
    # the scenario's findings and counts are its own call's
    earlier = scenario.model_copy(update={"secrets": None, "limits": {}})
    for number, step in enumerate(scenario.after, 1):
        document, decision = await evaluate(agent, rules, opa, step, earlier, labeller=labeller, session=session)
        if decision.effect != "deny":
            policy_flows.add(session, document["labels"], step.tool, number, scenario.at)
        else:
            session["calls"] += 1
    call = scenario.call.model_copy(update={"labels": (*scenario.call.labels, *scenario.labels)})
    return await evaluate(agent, rules, opa, call, scenario, labeller=labeller, session=session)


def _expected(scenario: Scenario) -> str:
    return scenario.expect + (f" by rule {scenario.rule}" if scenario.rule else "") + (
        f" with shadow rules [{', '.join(scenario.shadow)}]" if scenario.shadow is not None else "") + (
        f" with labels [{', '.join(sorted(scenario.expect_labels))}]" if scenario.expect_labels is not None
        else "") + (f" with flow [{', '.join(scenario.flow)}]" if scenario.flow is not None else "")


def _holds(scenario: Scenario, document: dict[str, Any], decision: Decision) -> bool:
    shadowed = tuple(s["rule"] for s in decision.shadow)
    return decision.effect == scenario.expect and scenario.rule in (None, decision.rule_id) and (
        scenario.shadow is None or set(scenario.shadow) == set(shadowed)) and (
        scenario.expect_labels is None or set(scenario.expect_labels) == set(document["labels"])) and (
        scenario.flow is None or tuple(scenario.flow) == decision.flow)


def _describe(decision: Decision, document: dict[str, Any] | None = None) -> str:
    kind = "limit" if decision.source == "limits" else "rule"
    by = f"{kind} {decision.rule_id}" if decision.rule_id else decision.source
    shadow = "".join(f"; shadow rule {s['rule']} would {s['effect']}" for s in decision.shadow)
    said = decision.reason if decision.reason.startswith(f"{by}:") else f"{by}: {decision.reason}"  # yolo: true
    flow = f"; flow [{', '.join(decision.flow)}]" if decision.flow else ""
    labels = f"; labels [{', '.join(document['labels'])}]" if document and document.get("labels") else ""
    return f"{decision.effect} ({said}){shadow}{flow}{labels}"


def run_tests(path: str | Path, *, opa_url: str | None = None, opa_path: str = DEFAULT_PATH) -> int:
    """Run a scenario file (against the YAML rules, and OPA when given); 0 when every expectation holds."""
    return asyncio.run(_run_tests(path, opa_url, opa_path))


async def _run_tests(path: str | Path, opa_url: str | None, opa_path: str) -> int:
    path = Path(path).resolve()
    try:
        spec, _, _ = load_yaml_model(path, ScenarioFile, RulesError, what="the scenario file", entries="scenarios",
                                     entry="scenario", name_key="name")
    except RulesError as exc:
        print(f"toolkeeper: {exc}")
        return 2
    agent = load_agent_file(path.parent / spec.agent_file)
    rules = load_rules(path.parent / spec.policy if spec.policy else default_rules_path())
    wrong = [f"scenario {scenario.name!r}: {problem}" for scenario in spec.scenarios
             for problem in policy_limits.problems(scenario.limits, rules)]
    if wrong:
        print("\n".join(f"toolkeeper: {path}: {problem}" for problem in wrong))
        return 2
    for warning in rules.warnings(agent):
        print(f"WARN {warning}")
    engines: list[tuple[str, Rules | None, OpaPolicy | None]] = [(f"rules {rules.path.name}", rules, None)]
    if opa_url:
        engines.append((f"OPA {opa_url}", None, OpaPolicy(opa_url, opa_path, timeout=5)))
    failures = runs = 0
    try:
        for engine, engine_rules, opa in engines:
            for scenario in spec.scenarios:
                runs += 1
                try:
                    document, decision = await run_scenario(agent, engine_rules, opa, scenario, rules)
                except RulesError as exc:
                    print(f"FAIL [{engine}] {scenario.name}: {exc}")
                    failures += 1
                    continue
                if _holds(scenario, document, decision):
                    print(f"PASS [{engine}] {scenario.name}: {_describe(decision, document)}")
                else:
                    print(f"FAIL [{engine}] {scenario.name}: expected {_expected(scenario)}, "
                          f"got {_describe(decision, document)}")
                    failures += 1
    finally:
        for _, _, opa in engines:
            if opa is not None:
                await opa.close()
    print(f"scenarios: {runs - failures} passed, {failures} failed (rules revision {rules.revision})")
    return 1 if failures else 0


def _print_commands(document: dict[str, Any]) -> None:
    """The commands toolkeeper reads in the call's command arguments, as `runs:` rules see them."""
    for name, found in commands_in(document):
        print(f"\ncommands in {name}:")
        for command in found.commands:
            words = " ".join("<unknown>" if word is None else json.dumps(word) for word in command.argv)
            writes = "".join(f" > {'<unknown>' if target is None else json.dumps(target)}"
                             for target in command.writes)
            print(f"  {words}{writes}" + (f"  (via {command.via})" if command.via else ""))
            if command.read_by:
                print(f"      read by the {command.read_by}")
        for why in found.unresolved:
            print(f"  not read: {why}")
        if found.unresolved:
            print("  so the command is unresolved: it matches every deny and ask rule with runs:, and no allow rule")


def explain(args: argparse.Namespace) -> int:
    """Show the policy input of one call, which rules match it, and what decides."""
    arguments = {}
    for pair in args.arguments:
        key, sep, value = pair.partition("=")
        if not sep:
            print(f"toolkeeper: arguments are key=value pairs; got {pair!r}")
            return 2
        arguments[key] = value  # strings, coerced like a model's: "3" -> 3, "true" -> true
    agent = load_agent_file(args.agent_file)
    rules = rules_in_force(args.policy, args.opa_url)
    opa = OpaPolicy(args.opa_url, args.opa_path, timeout=5) if args.opa_url else None
    principal = Principal(user=args.user, groups=args.groups) if args.user or args.groups else None
    session = SessionSpec(has=args.session_has) if args.session_has else None
    counts = policy_limits.parse(args.limits)
    wrong = policy_limits.problems(counts, rules) if counts else []
    if wrong:
        print(f"toolkeeper: {'; '.join(wrong)}", file=sys.stderr)
        return 2
    situation = Situation(yolo=args.yolo, at=args.at, workdir=args.workdir, principal=principal, session=session,
                          limits=counts,
                          agent={"id": args.agent_id,
                                 **({"header": args.agent_header} if args.agent_header is not None else {})})

    async def run() -> tuple[dict[str, Any], Decision]:
        try:
            call = Call(tool=args.tool, arguments=arguments, source=args.source, kind=args.kind, labels=args.labels)
            return await evaluate(agent, rules, opa, call, situation)
        finally:
            if opa is not None:
                await opa.close()

    document, decision = asyncio.run(run())
    print("policy input:")
    print(json.dumps(document, indent=2, ensure_ascii=False))
    if rules is not None:
        print(f"\nrules {rules.path} (revision {rules.revision}):")
        matched = {rule.id for rule in [*rules.matching(document), *rules.matching(document, shadow=True),
                                        *rules.labelling(document)]}
        for rule in rules.rules:
            mode = " (shadow: recorded, not deciding)" if rule.mode == "shadow" else ""
            gives = f" [{', '.join(rule.labels)}]" if rule.effect == "label" else ""
            print(f"  {'MATCH' if rule.id in matched else '     '} {rule.id}: {rule.effect}{gives}{mode}")
        _print_commands(document)
        if rules.limits:
            print("\nlimits:")
            print("\n".join(policy_limits.lines(rules, document)))
    if opa is not None:
        print(f"\nOPA {opa.url}/v1/data/{opa.path}: decision id {decision.decision_id}, "
              f"bundles {decision.revision}")
    print(f"\ndecision: {_describe(decision, document)}")
    return 0
