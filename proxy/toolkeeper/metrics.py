"""Prometheus metrics, in the text format, from a registry small enough to read.

    toolkeeper_requests_total{api,stream,code}         agent requests answered (chat, responses)
    toolkeeper_unspoken_requests_total{path}            model requests to an API toolkeeper does not speak
    toolkeeper_model_rounds_total                       upstream model calls
    toolkeeper_upstream_seconds (histogram)             one model round, first byte to last
    toolkeeper_declared_calls_total{tool,status}        declared calls, by outcome
    toolkeeper_decisions_total{source,effect}           policy decisions, by who decided
    toolkeeper_tool_seconds{tool} (histogram)           a declared tool's run
    toolkeeper_history_restorations_total{outcome}      hidden exchanges put back (hit) or missed
    toolkeeper_approvals_waiting (gauge)                calls waiting for a person's answer now
    toolkeeper_approval_wait_seconds (histogram)        how long a call waited for its answer
    toolkeeper_audit_write_failures_total               audit events that could not be written
    toolkeeper_upstream_errors_total{api,status}        turns ended by the model server's failure

Each process counts its own: with --workers or replicas, scrape each.
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from toolkeeper.audit import ExecutionRecord

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


def _labels(pairs: tuple[tuple[str, str], ...]) -> str:
    if not pairs:
        return ""
    inner = ",".join(f'{k}="{v}"'.replace("\n", " ") for k, v in pairs)
    return "{" + inner + "}"


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, Counter[tuple[tuple[str, str], ...]]] = {}
        self._histograms: dict[str, dict[tuple[tuple[str, str], ...], list[float]]] = {}
        self._help: dict[str, str] = {}
        self._gauges: dict[str, Callable[[], dict[tuple[tuple[str, str], ...], float]]] = {}
        self._kinds: dict[str, str] = {}  # what a value read elsewhere is: counter or gauge

    def count(self, name: str, help_text: str, amount: float = 1, **labels: str) -> None:
        with self._lock:
            self._help.setdefault(name, help_text)
            self._counters.setdefault(name, Counter())[tuple(sorted(labels.items()))] += amount

    def observe(self, name: str, help_text: str, seconds: float, **labels: str) -> None:
        with self._lock:
            self._help.setdefault(name, help_text)
            series = self._histograms.setdefault(name, {}).setdefault(tuple(sorted(labels.items())),
                                                                      [0.0] * (len(BUCKETS) + 2))
            series[bisect.bisect_left(BUCKETS, seconds)] += 1  # the first bucket it fits in
            series[-1] += seconds

    def counted_elsewhere(self, name: str, help_text: str,
                          read: Callable[[], dict[tuple[tuple[str, str], ...], float]], kind: str = "counter") -> None:
        """A counter (or a gauge) kept by another component, read when scraped."""
        self._help[name] = help_text
        self._gauges[name] = read
        self._kinds[name] = kind

    def record(self, record: ExecutionRecord) -> None:
        """An observer of execution records."""
        self.count("toolkeeper_declared_calls_total", "Declared calls, by tool and outcome.",
                   tool=record.tool, status=record.status)
        if record.decision:
            self.count("toolkeeper_decisions_total", "Policy decisions, by source and effect.",
                       source=record.decision_source, effect=record.decision)
        if record.duration_ms:
            self.observe("toolkeeper_tool_seconds", "A declared tool's run, in seconds.",
                         record.duration_ms / 1000, tool=record.tool)

    def render(self) -> str:
        lines: list[str] = []
        with self._lock:
            for name, series in sorted(self._counters.items()):
                lines += [f"# HELP {name} {self._help[name]}", f"# TYPE {name} counter"]
                lines += [f"{name}{_labels(labels)} {value:g}" for labels, value in sorted(series.items())]
            for name, read in sorted(self._gauges.items()):
                lines += [f"# HELP {name} {self._help[name]}", f"# TYPE {name} {self._kinds[name]}"]
                lines += [f"{name}{_labels(labels)} {value:g}" for labels, value in sorted(read().items())]
            for name, histogram in sorted(self._histograms.items()):
                lines += [f"# HELP {name} {self._help[name]}", f"# TYPE {name} histogram"]
                for labels, series in sorted(histogram.items()):
                    running = 0.0
                    for bound, count in zip((*BUCKETS, "+Inf"), series[:-1], strict=True):
                        running += count
                        le = (*labels, ("le", f"{bound:g}" if bound != "+Inf" else bound))
                        lines.append(f"{name}_bucket{_labels(le)} {running:g}")
                    lines.append(f"{name}_sum{_labels(labels)} {series[-1]:.6f}")
                    lines.append(f"{name}_count{_labels(labels)} {running:g}")
        return "\n".join(lines) + "\n"
