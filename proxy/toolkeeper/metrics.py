"""Prometheus metrics, on `prometheus_client`: every family declared once below, every series there from the start.

    toolkeeper_requests_total{api,stream,code}         agent requests answered (chat, responses, messages)
    toolkeeper_unspoken_requests_total{endpoint}        model requests to an API toolkeeper does not speak
    toolkeeper_ungoverned_refused_total{endpoint}       requests to a tool-capable endpoint it does not govern
    toolkeeper_ungoverned_passed_total{endpoint}        ... let through by --pass-ungoverned
    toolkeeper_model_rounds_total                       upstream model calls
    toolkeeper_upstream_seconds (histogram)             one model round, first byte to last
    toolkeeper_declared_calls_total{tool,status}        declared calls, by outcome
    toolkeeper_decisions_total{source,effect}           policy decisions, by who decided
    toolkeeper_shadow_matches_total{rule,effect}        calls a shadow rule matched, and what it would have done
    toolkeeper_tool_seconds{tool} (histogram)           a declared tool's run
    toolkeeper_history_restorations_total{outcome}      hidden exchanges put back (hit) or missed
    toolkeeper_approvals_waiting (gauge)                calls waiting for a person's answer now
    toolkeeper_approval_wait_seconds (histogram)        how long a call waited for its answer
    toolkeeper_audit_write_failures_total               audit events that could not be written
    toolkeeper_upstream_errors_total{api,status}        turns ended by the model server's failure
    toolkeeper_unknown_calls_total{kind}                calls of a kind toolkeeper does not know, denied
    toolkeeper_hosted_tools_withheld_total{kind}        tools the model server runs, withheld by the rules
    toolkeeper_group_calls_total{group}                 calls, by the group of the user each was for
    toolkeeper_flow_decisions_total{effect}             decisions a rule on the session's history made
    toolkeeper_secrets_found_total{action,kind}         secrets found in what goes to the model or out
    toolkeeper_notify_deliveries_total{channel,outcome} asks sent to a `notify:` channel: delivered, error, given_up
    toolkeeper_limit_stopped_total{limit,effect}        calls (and model rounds) a limit denied or asked about

Read from the store when the page is asked for (`readers`), so every replica
and worker shows the same numbers, in the limit's unit (run time in seconds):

    toolkeeper_limit_max{limit}                         a limit's maximum, per scope
    toolkeeper_limit_used{limit}                        what its scopes used in its window, summed
    toolkeeper_limit_used_highest{limit}                what its most used scope used
    toolkeeper_limit_scopes{limit}                      its scopes with a count in the window
    toolkeeper_limit_scopes_full{limit}                 its scopes at or past the maximum

One process: a registry per `Metrics` (several apps in one process never
collide). `serve --workers N`: the supervisor sets PROMETHEUS_MULTIPROC_DIR to a
private directory before it forks, each worker writes its values there, and any
worker's /metrics adds them all up (`MultiProcessCollector`).

A label whose values come from outside is bounded: a tool name counts as
itself when toolkeeper declared it, and any other name (the agent's own tools,
the model server's, an MCP server's), like an unknown call's kind, as itself
for the first CAP distinct values of the process, then as `other`.

Calls are counted by the principal's group, never by its user: a user is a
label value per person, without end, and each new value is a series the
metrics store keeps for good (a denial of service on it, and names of people
in a place made for numbers). Nor is a group counted as the first CAP seen:
which groups those are would depend on who called first. A group counts as
itself only when the configuration names it (the groups the rules test by
name, and those `auth.oidc.roles` maps to a role): what an operator chose to
watch, bounded by the configuration's size, and known at start, so each
series is there at zero. A call for a user in none of those groups counts as
`other`; a call for no group at all (an agent alone, a user whose token or
header gives no groups) as `none`. A call counts once under each named group
of its user, so the sum over groups can exceed the calls.

For the same reason a limit's series are by limit (an id the policy file
names: bounded, known at start) and never by scope: a scope is a user's name,
an agent's, a group's. The page sums and counts a limit's scopes; who is near
a limit is the admin API's and the console's to show.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolkeeper.audit import ExecutionRecord

log = logging.getLogger("toolkeeper")

MULTIPROCESS = "PROMETHEUS_MULTIPROC_DIR"
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
CAP = 50  # distinct outside values a bounded label shows before `other`
OTHER = "other"
# Who decides (the record's decision_source) and what: the decisions_total series there from the start.
DECISION_SOURCES = ("rules", "opa", "policy", "tier", "yolo", "default", "consent", "loop_detector", "store",
                    "retry", "toolkeeper", "hosted", "pin", "limits")
DECISION_EFFECTS = ("allow", "deny")
FLOW_EFFECTS = ("allow", "ask", "deny")  # a rule on the session asks or denies (an allow is rarer, but may)
CALL_ENDINGS = ("ok", "failed", "timeout", "denied", "invalid")  # a declared tool's series there from the start
NO_GROUP = "none"  # a call for no group: the agent alone, or a user whose credentials name no group
GLOB = frozenset("*?[")  # a rule's group pattern (team-*) names no one group: it counts nothing as itself


@dataclass(frozen=True)
class Family:
    kind: str  # counter | gauge | histogram
    help: str
    labels: tuple[str, ...] = ()  # sorted: the page shows them so
    bounded: tuple[str, ...] = ()  # labels whose values come from outside: CAP of them, then `other`


FAMILIES = {
    "toolkeeper_requests_total": Family("counter", "Agent requests answered, by API, streaming and status.",
                                        ("api", "code", "stream")),
    "toolkeeper_unspoken_requests_total": Family(
        "counter", "Model requests passed through to an endpoint toolkeeper does not speak (no declared tools).",
        ("endpoint",)),
    "toolkeeper_ungoverned_refused_total": Family(
        "counter", "Requests to a tool-capable endpoint toolkeeper does not govern, refused.", ("endpoint",)),
    "toolkeeper_ungoverned_passed_total": Family(
        "counter", "Requests to a tool-capable endpoint toolkeeper does not govern, passed by --pass-ungoverned.",
        ("endpoint",)),
    "toolkeeper_model_rounds_total": Family("counter", "Model rounds: one upstream call each."),
    "toolkeeper_upstream_seconds": Family("histogram", "One model round, request to last byte."),
    "toolkeeper_declared_calls_total": Family("counter", "Declared calls, by tool and outcome.", ("status", "tool")),
    "toolkeeper_decisions_total": Family("counter", "Policy decisions, by source and effect.", ("effect", "source")),
    "toolkeeper_shadow_matches_total": Family(
        "counter", "Calls a shadow rule matched, by rule and the effect it would have had.", ("effect", "rule")),
    "toolkeeper_tool_seconds": Family("histogram", "A declared tool's run, in seconds.", ("tool",)),
    "toolkeeper_history_restorations_total": Family(
        "counter", "Assistant messages given back their hidden exchange (hit), or whose exchange was not found: "
        "expired or edited history (miss).", ("outcome",)),
    "toolkeeper_approvals_waiting": Family("gauge", "Calls waiting for a person's answer now."),
    "toolkeeper_approval_wait_seconds": Family(
        "histogram", "How long a call waited for a person's answer (from the ask to the answer)."),
    "toolkeeper_audit_write_failures_total": Family(
        "counter", "Audit events that could not be written (the call was then refused, or its outcome lost)."),
    "toolkeeper_upstream_errors_total": Family(
        "counter", "Turns ended by the model server's failure, by status (502: unreachable or malformed, 504: no "
        "answer in time).", ("api", "status")),
    "toolkeeper_unknown_calls_total": Family("counter", "Calls of a kind toolkeeper does not know, denied.",
                                             ("kind",), bounded=("kind",)),
    "toolkeeper_hosted_tools_withheld_total": Family(
        "counter", "Tools the model server runs, withheld from a request by the rules.", ("kind",),
        bounded=("kind",)),
    "toolkeeper_group_calls_total": Family(
        "counter", "Calls, by the group of the user each was for: a group the configuration names (the rules, "
        "auth.oidc.roles), other for any other, none for no group. Never by user.", ("group",)),
    "toolkeeper_flow_decisions_total": Family(
        "counter", "Decisions made by a rule on what the session had already done (its labels), by effect.",
        ("effect",)),
    "toolkeeper_secrets_found_total": Family(
        "counter", "Secrets found in tool results and egress arguments, by kind and what was done (redact, block, "
        "allow).", ("action", "kind"), bounded=("kind",)),
    "toolkeeper_notify_deliveries_total": Family(  # a channel is named in the policy file: bounded by its size
        "counter", "Asks sent to a notify: channel, by outcome: delivered (the channel answered 2xx), error (an "
        "attempt failed: no connection, no answer in time, not 2xx; tried again), given_up (never delivered: the "
        "call was answered or expired first, or the channel cannot be used).", ("channel", "outcome")),
    "toolkeeper_limit_stopped_total": Family(
        "counter", "Calls and model rounds a limit stopped (deny) or had asked, by limit (ids from the policy file).",
        ("effect", "limit")),
}
# The families read from the store when the page is asked for (the same on every replica): by limit, never by scope.
READ_FAMILIES = {
    "toolkeeper_limit_max": "A limit's maximum per scope, in its unit (calls, tokens, seconds of run time).",
    "toolkeeper_limit_used": "What a limit's scopes used in its window, summed, in its unit.",
    "toolkeeper_limit_used_highest": "What a limit's most used scope used in its window, in its unit.",
    "toolkeeper_limit_scopes": "A limit's scopes with a count in its window.",
    "toolkeeper_limit_scopes_full": "A limit's scopes at or past its maximum.",
}
READ_WAIT = 2.0  # seconds each reader has before the page is sent without its families
# What a reader gives: each READ_FAMILIES name it read, with its samples (labels, value)
Read = dict[str, list[tuple[dict[str, str], float]]]


class Capped:
    """A label's outside values: the first CAP distinct ones as themselves, the rest as `other`."""

    def __init__(self, cap: int = CAP):
        self.cap = cap
        self.seen: set[str] = set()

    def __call__(self, value: str) -> str:
        if value in self.seen:
            return value
        if len(self.seen) >= self.cap:
            return OTHER
        self.seen.add(value)
        return value


def _client() -> Any:
    """prometheus_client, imported with the first `Metrics`: it picks where values live (memory, or the files of
    PROMETHEUS_MULTIPROC_DIR) once, when imported, so the supervisor of --workers sets the variable first."""
    import prometheus_client
    from prometheus_client import values

    if os.environ.get(MULTIPROCESS) and values.ValueClass is values.MutexValue:
        raise RuntimeError(f"prometheus_client was imported before {MULTIPROCESS} was set: the workers' metrics "
                           "would not be shared")
    prometheus_client.disable_created_metrics()  # the *_created series: one more per series, read by nobody here
    return prometheus_client


class Metrics:
    def __init__(self) -> None:
        client = _client()
        self.content_type: str = client.CONTENT_TYPE_LATEST  # the page's
        self.shared = os.environ.get(MULTIPROCESS) or None  # the workers' directory, in multi-process mode
        self.registry = client.CollectorRegistry()
        if self.shared:  # each value is written to the directory; the page reads all of it
            from prometheus_client.multiprocess import MultiProcessCollector

            MultiProcessCollector(self.registry, path=self.shared)
        self._capped: dict[str, Capped] = {}
        self.groups: frozenset[str] = frozenset()  # the groups counted as themselves (named_groups)
        self._seen: dict[tuple[str, ...], Any] = {}  # each series by its family and label values
        self._families = {name: self._family(client, name, family) for name, family in FAMILIES.items()}
        self.readers: list[Callable[[], Awaitable[Read]]] = []  # read when the page is asked for: READ_FAMILIES
        for effect, source in itertools.product(DECISION_EFFECTS, DECISION_SOURCES):
            self.expect("toolkeeper_decisions_total", effect=effect, source=source)
        for effect in FLOW_EFFECTS:
            self.expect("toolkeeper_flow_decisions_total", effect=effect)
        self.named_groups(())

    def _family(self, client: Any, name: str, family: Family) -> Any:
        registry = None if self.shared else self.registry
        if family.kind == "histogram":
            return client.Histogram(name, family.help, family.labels, registry=registry, buckets=BUCKETS)
        if family.kind == "gauge":  # several workers: the sum of the live ones
            return client.Gauge(name, family.help, family.labels, registry=registry, multiprocess_mode="livesum")
        return client.Counter(name, family.help, family.labels, registry=registry)

    def _series(self, name: str, labels: dict[str, str]) -> Any:
        if not labels:
            return self._families[name]
        key = (name, *labels.items())
        series = self._seen.get(key)
        if series is None:  # prometheus_client's labels() takes a lock and checks each value: once per series here
            bounded = FAMILIES[name].bounded
            series = self._families[name].labels(*(self.bounded(label, labels[label]) if label in bounded
                                                   else labels[label] for label in FAMILIES[name].labels))
            if not bounded:  # outside values are not kept here: there is no end to them
                self._seen[key] = series
        return series

    def bounded(self, label: str, value: str) -> str:
        """An outside value of `label`, as the page shows it: itself, or `other` past CAP distinct ones."""
        capped = self._capped.get(label)
        if capped is None:
            capped = self._capped[label] = Capped()
        return capped(value)

    def count(self, name: str, amount: float = 1, **labels: str) -> None:
        self._series(name, labels).inc(amount)

    def add(self, name: str, amount: float, **labels: str) -> None:
        """A gauge up (or down, with a negative amount)."""
        self._series(name, labels).inc(amount)

    def observe(self, name: str, seconds: float, **labels: str) -> None:
        self._series(name, labels).observe(seconds)

    def expect(self, name: str, **labels: str) -> None:
        """A series of a labelled family shown from the start, at zero (an unlabelled one always is)."""
        self._series(name, labels)

    def declared(self, tools: Iterable[str]) -> None:
        """The declared tools' series, from the start (and after a reload, for the tools it adds)."""
        for tool in tools:
            for status in CALL_ENDINGS:
                self.expect("toolkeeper_declared_calls_total", status=status, tool=tool)
            self.expect("toolkeeper_tool_seconds", tool=tool)

    def named_groups(self, names: Iterable[str]) -> None:
        """The groups the configuration names (a pattern is none), counted as themselves from now on, each series
        there from the start (and after a reload, for the groups it adds)."""
        self.groups = self.groups | {name for name in names if name and not GLOB & set(name)}
        for group in (*sorted(self.groups), OTHER, NO_GROUP):
            self.expect("toolkeeper_group_calls_total", group=group)

    def grouped(self, document: dict[str, Any] | None) -> None:
        """A call, under each named group of the user it was for (a policy input's `principal.groups`)."""
        principal = (document or {}).get("principal")
        groups = principal.get("groups") if isinstance(principal, dict) else None
        groups = [group for group in groups if isinstance(group, str)] if isinstance(groups, list) else []
        for group in [g for g in dict.fromkeys(groups) if g in self.groups] or [OTHER if groups else NO_GROUP]:
            self.count("toolkeeper_group_calls_total", group=group)

    def record(self, record: ExecutionRecord) -> None:
        """An observer of execution records."""
        # a declared tool's name is the agent file's; any other comes from the agent or a server: bounded
        tool = record.tool if record.source == "declared" else self.bounded("tool", record.tool)
        self.count("toolkeeper_declared_calls_total", status=record.status, tool=tool)
        if record.decision:
            self.count("toolkeeper_decisions_total", effect=record.decision, source=record.decision_source)
        self.shadowed(record.shadow)
        self.grouped(record.policy_input)
        if record.duration_ms:
            self.observe("toolkeeper_tool_seconds", record.duration_ms / 1000, tool=tool)

    def shadowed(self, matches: Iterable[dict[str, str]]) -> None:
        """The shadow rules that matched a call (or a hosted tool's offer), each by rule and its effect."""
        for shadow in matches:
            self.count("toolkeeper_shadow_matches_total", effect=shadow["effect"], rule=shadow["rule"])

    def render(self) -> bytes:
        """The page, in prometheus_client's text format (`content_type`)."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)

    async def page(self) -> bytes:
        """The page: the readers' families (read now, from the store: the same numbers on every replica and
        worker, which a gauge summed over the workers would not be), after `render`'s. A reader that fails or
        does not answer within READ_WAIT leaves its families out, never the page."""
        read: Read = {}
        for reader in self.readers:
            try:
                async with asyncio.timeout(READ_WAIT):
                    found = await reader()
            except Exception as exc:  # a store that does not answer: the rest of the page still tells
                log.warning("metrics: %s left out of this scrape: %s", getattr(reader, "__name__", reader),
                            str(exc) or type(exc).__name__)
                continue
            for name, samples in found.items():
                read.setdefault(name, []).extend(samples)
        return self.render() + read_page(read)


def read_page(read: Read) -> bytes:
    """The families read from the store, in the page's text format (prometheus_client writes it, escapes
    included)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import GaugeMetricFamily

    families = []
    for name, samples in read.items():
        labels = sorted({label for sample_labels, _ in samples for label in sample_labels})
        family = GaugeMetricFamily(name, READ_FAMILIES[name], labels=labels)
        for sample_labels, value in samples:
            family.add_metric([sample_labels.get(label, "") for label in labels], value)
        families.append(family)

    class Found:
        def collect(self) -> list[Any]:
            return families

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Found())
    return generate_latest(registry)


def forget_process(pid: int, directory: str) -> None:
    """A worker that died: its live gauges leave the sums (its counters stay: what it counted happened)."""
    from prometheus_client.multiprocess import mark_process_dead

    mark_process_dead(pid, directory)
