"""`toolkeeper eval CASES.yaml --base-url URL --model M`: how often a model has exactly the right command run, each
case asked several times, declared tools against a skill and a shell, on any OpenAI-compatible endpoint. The method
that found a 12B model right 30/30 times with declared tools and 15/30 with a skill and a shell
(docs/explanation/declared-tools.md).

    cases file:  agent: agent.yaml        (relative to the cases file)
                 cases:
                   - {name: release-en, prompt: "Release 1.4.2 to beta.", tool: release,
                      argv: ["./release.sh", "1.4.2", "--channel=beta"]}

declared: toolkeeper runs between the eval and the model (a `serve` of its own, on
  a fresh store and audit trail); a run succeeds when the audit trail shows a call
  of that run with exactly the expected argv (gated calls are refused, consent
  none, but their argv is recorded all the same).
skill: the baseline: the same task given as a skill text and a generic `shell`
  tool, straight to the endpoint; a run succeeds when the model asks to run the
  same command line.

Runs go one at a time, each a distinct request (a `user` field per run: the retry
memo never answers a run with an earlier one's result).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SHELL_TOOL = {"type": "function", "function": {
    "name": "shell", "description": "Run a command line in the project's folder. Returns its output.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string", "description": "The command line."}},
                   "required": ["command"]}}}
ROUND_TIMEOUT = 300.0


class EvalError(Exception):
    """The cases file, the agent file or the endpoint: what stops the eval, said in one line."""


@dataclass
class Run:
    case: str
    mode: str
    number: int
    ok: bool
    seconds: float
    argv: list[str] | None = None  # what the model had run (declared: the trail's argv; skill: the command line)
    error: str | None = None


@dataclass
class Report:
    model: str
    base_url: str
    runs_per_case: int
    cases_file: str
    runs: list[Run] = field(default_factory=list)
    stopped: str | None = None  # why the eval stopped before the end

    def tally(self, case: str, mode: str) -> tuple[int, int, float]:
        mine = [run for run in self.runs if run.case == case and run.mode == mode]
        mean = sum(run.seconds for run in mine) / len(mine) if mine else 0.0
        return sum(run.ok for run in mine), len(mine), mean

    def as_dict(self, cases: list[dict], modes: list[str]) -> dict[str, Any]:
        summary = []
        for case in cases:
            for mode in modes:
                ok, runs, mean = self.tally(case["name"], mode)
                summary.append({"case": case["name"], "mode": mode, "successes": ok, "runs": runs,
                                "mean_seconds": round(mean, 3)})
        return {"model": self.model, "base_url": self.base_url, "runs_per_case": self.runs_per_case,
                "cases_file": self.cases_file, "stopped": self.stopped, "summary": summary,
                "runs": [asdict(run) for run in self.runs]}


def add_parser(commands: argparse._SubParsersAction) -> None:
    command = commands.add_parser("eval", help="measure how often a model calls your tools right: declared "
                                                "tools against a skill and a shell")
    command.add_argument("cases", help="the cases file (YAML): `agent:` and `cases:` of {name, prompt, tool, argv}")
    command.add_argument("--base-url", required=True, help="the model server's OpenAI-compatible base URL")
    command.add_argument("--model", required=True, help="the model to ask")
    command.add_argument("--runs", type=int, default=5, help="runs per case and mode (default 5)")
    command.add_argument("--mode", choices=("declared", "skill", "both"), default="both",
                         help="declared tools through toolkeeper, the skill baseline, or both (default)")
    command.add_argument("--json", metavar="FILE", help="the JSON report (default: eval-<time>.json here)")
    command.add_argument("--api-key-env", default="OPENAI_API_KEY",
                         help="the variable holding the endpoint's key (default OPENAI_API_KEY; none is fine locally)")
    command.set_defaults(run=eval_command)


def eval_command(args: argparse.Namespace) -> int:
    try:
        agent, cases = load_cases(Path(args.cases))
    except EvalError as exc:
        print(f"toolkeeper: {exc}", file=sys.stderr)
        return 2
    modes = ["declared", "skill"] if args.mode == "both" else [args.mode]
    report = Report(args.model, args.base_url, args.runs, args.cases)
    key = os.environ.get(args.api_key_env) or "no-key"
    try:
        for mode in modes:
            runner = DeclaredRuns(agent, args, key) if mode == "declared" else SkillRuns(agent, args, key)
            with runner:
                for case in cases:
                    for number in range(1, args.runs + 1):
                        progress(report, len(cases) * len(modes) * args.runs, case["name"], mode)
                        report.runs.append(runner.run(case, number))
    except EvalError as exc:
        report.stopped = str(exc)
    finally:
        progress_done()
    print_table(report, cases, modes)
    path = Path(args.json or f"eval-{time.strftime('%Y%m%d-%H%M%S')}.json")
    path.write_text(json.dumps(report.as_dict(cases, modes), indent=2, ensure_ascii=False) + "\n")
    print(f"\nreport: {path}")
    if report.stopped:
        print(f"toolkeeper: the eval stopped: {report.stopped}", file=sys.stderr)
        return 1
    return 0


def load_cases(path: Path) -> tuple[Any, list[dict]]:
    """The agent file and the cases, checked: an unknown key, a missing one, or a tool the agent file does not
    declare is refused with the file, the case and the key."""
    import yaml

    from toolkeeper.tools import AgentFileError, load_agent_file

    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise EvalError(f"{path}: cannot read the cases file: {exc}") from None
    if not isinstance(loaded, dict) or set(loaded) - {"agent", "cases"} or "agent" not in loaded:
        unknown = sorted(set(loaded) - {"agent", "cases"}) if isinstance(loaded, dict) else []
        raise EvalError(f"{path}: a cases file is a mapping with `agent:` and `cases:`"
                        + (f"; unknown key {unknown[0]!r}" if unknown else ""))
    try:
        agent = load_agent_file(path.parent / str(loaded["agent"]), serving=False)
    except AgentFileError as exc:
        raise EvalError(f"{path}: key 'agent': {exc}") from None
    cases = loaded.get("cases") or []
    if not isinstance(cases, list) or not cases:
        raise EvalError(f"{path}: key 'cases': a list of {{name, prompt, tool, argv}}, at least one")
    for position, case in enumerate(cases):
        check_case(path, position, case, agent)
    names = [case["name"] for case in cases]
    repeated = next((name for name in names if names.count(name) > 1), None)
    if repeated:
        raise EvalError(f"{path}: case {repeated!r}: key 'name': used by two cases (each is counted by its name)")
    return agent, cases


def check_case(path: Path, position: int, case: Any, agent: Any) -> None:
    if not isinstance(case, dict):
        where = f"{path}: case {position + 1}"
        raise EvalError(f"{where}: a case is a mapping of name, prompt, tool, argv")
    where = f"{path}: case {case.get('name', position + 1)!r}"
    for key in case:
        if key not in ("name", "prompt", "tool", "argv"):
            raise EvalError(f"{where}: key {key!r}: unknown key (a case has name, prompt, tool, argv)")
    for key in ("name", "prompt", "tool"):
        if not isinstance(case.get(key), str) or not case[key].strip():
            raise EvalError(f"{where}: key {key!r}: missing, or not a text")
    if case["tool"] not in agent.tools:
        raise EvalError(f"{where}: key 'tool': {case['tool']!r} is not declared in {agent.path.name} "
                        f"(declared: {', '.join(agent.tools)})")
    argv = case.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(item, str) for item in argv):
        raise EvalError(f"{where}: key 'argv': the full argv the audit trail records, program first, as a list "
                        "of texts")


class DeclaredRuns:
    """A toolkeeper of its own between the eval and the model: the audit trail tells what ran."""

    def __init__(self, agent: Any, args: argparse.Namespace, key: str):
        self.agent, self.args, self.key = agent, args, key
        self.folder = tempfile.TemporaryDirectory(prefix="toolkeeper-eval-")
        self.audit = Path(self.folder.name) / "audit.sqlite3"
        self.log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed with the runs

    def __enter__(self) -> DeclaredRuns:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "toolkeeper", "serve", str(self.agent.path), "--port", "0", "--upstream",
             self.args.base_url, "--store", str(Path(self.folder.name) / "store.sqlite3"), "--audit",
             str(self.audit), "--consent", "none", "--read-timeout", str(ROUND_TIMEOUT), "--log-level", "ERROR"],
            stdout=subprocess.PIPE, stderr=self.log, text=True, start_new_session=True)  # a log nobody must drain
        line = self.process.stdout.readline()  # type: ignore[union-attr]
        if "listening on" not in line:
            self.process.wait(10)
            self.log.seek(0)
            raise EvalError(f"toolkeeper did not start: {self.log.read().strip()}")
        self.url = "http://" + line.split("http://", 1)[1].split()[0]
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        self.process.communicate(timeout=15)
        self.log.close()
        self.folder.cleanup()

    def run(self, case: dict, number: int) -> Run:
        from toolkeeper.audit import open_audit

        request_id = f"eval-{case['name']}-{number}-{os.urandom(4).hex()}"
        started = time.monotonic()
        ask(self.url, self.key, self.args.model, [{"role": "user", "content": case["prompt"]}], [],
            {"X-Request-Id": request_id}, user=request_id, label=f"{self.args.base_url} (through toolkeeper)")
        seconds = time.monotonic() - started
        trail = open_audit(self.audit)
        try:
            seen = [entry.argv for entry in trail.records(tool=case["tool"]) if entry.request_id == request_id]
        finally:
            trail.close()
        ok = case["argv"] in seen
        return Run(case["name"], "declared", number, ok, round(seconds, 3), argv=seen[0] if seen else None)


class SkillRuns:
    """The baseline: the task as a skill text and a generic shell tool, straight to the endpoint."""

    def __init__(self, agent: Any, args: argparse.Namespace, key: str):
        self.agent, self.args, self.key = agent, args, key

    def __enter__(self) -> SkillRuns:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def run(self, case: dict, number: int) -> Run:
        tool = self.agent.tools[case["tool"]]
        messages = [{"role": "system", "content": skill_text(tool)}, {"role": "user", "content": case["prompt"]}]
        started = time.monotonic()
        message = ask(self.args.base_url, self.key, self.args.model, messages, [SHELL_TOOL], {},
                      user=f"eval-{case['name']}-{number}-{os.urandom(4).hex()}")
        seconds = time.monotonic() - started
        command = None
        for call in message.get("tool_calls") or []:
            if call.get("function", {}).get("name") == "shell":
                try:
                    command = shlex.split(str(json.loads(call["function"]["arguments"]).get("command", "")))
                except (ValueError, json.JSONDecodeError, AttributeError):
                    continue
                break
        return Run(case["name"], "skill", number, command == case["argv"], round(seconds, 3), argv=command)


def skill_text(tool: Any) -> str:
    """What a skill says: the task, and the command line to run for it."""
    command = " ".join(shlex.quote(part) if "{{" not in part else part for part in tool.spec.command or ())
    parameters = "\n".join(f"- {{{{{name}}}}}: {parameter.description or parameter.type}"
                           for name, parameter in tool.spec.parameters.items())
    return (f"You have one skill.\n\nSkill: {tool.name}\n{tool.spec.description}\n\nTo do it, call your shell tool "
            f"with this command line, each {{{{placeholder}}}} replaced by its value:\n\n    {command}\n\n"
            f"{parameters}")


def ask(base_url: str, key: str, model: str, messages: list[dict], tools: list[dict], headers: dict[str, str],
        user: str, label: str | None = None) -> dict[str, Any]:
    """One chat completion; an endpoint that cannot be reached or fails is an EvalError that stops the eval."""
    import openai

    client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=ROUND_TIMEOUT)
    try:
        body: dict[str, Any] = {"model": model, "messages": messages, "user": user}
        if tools:
            body["tools"] = tools
        answer = client.chat.completions.create(**body, extra_headers=headers)
    except openai.APIStatusError as exc:
        raise EvalError(f"{label or base_url} answered {exc.status_code}: {exc.message}") from None
    except openai.APIError as exc:
        raise EvalError(f"cannot reach {label or base_url}: {exc}") from None
    finally:
        client.close()
    return answer.choices[0].message.model_dump() if answer.choices else {}


def progress(report: Report, total: int, case: str, mode: str) -> None:
    if sys.stderr.isatty():
        done = len(report.runs)
        bar = "#" * (30 * done // total) + "." * (30 - 30 * done // total)
        sys.stderr.write(f"\r[{bar}] {done}/{total} {mode} {case}".ljust(78)[:78])
        sys.stderr.flush()


def progress_done() -> None:
    if sys.stderr.isatty():
        sys.stderr.write("\r" + " " * 78 + "\r")


def print_table(report: Report, cases: list[dict], modes: list[str]) -> None:
    print(f"model {report.model} at {report.base_url}, {report.runs_per_case} runs per case\n")
    print(f"{'case':<28}" + "".join(f"{mode:>20}" for mode in modes))
    totals = {mode: [0, 0, 0.0] for mode in modes}
    for case in cases:
        cells = []
        for mode in modes:
            ok, runs, mean = report.tally(case["name"], mode)
            totals[mode][0] += ok
            totals[mode][1] += runs
            totals[mode][2] += mean * runs
            cells.append(f"{ok}/{runs} ({mean:.1f} s)" if runs else "-")
        print(f"{case['name']:<28}" + "".join(f"{cell:>20}" for cell in cells))
    cells = [f"{ok}/{runs} ({seconds / runs:.1f} s)" if runs else "-" for ok, runs, seconds in totals.values()]
    print(f"{'total':<28}" + "".join(f"{cell:>20}" for cell in cells))
