"""A limit held across replicas: two toolkeepers on one PostgreSQL behind a real HAProxy, 50 calls at once against
a limit of 20: exactly 20 run, 30 are denied with the limit's reason, and both replicas' metrics show the same
count (the store's)."""

from __future__ import annotations

import re
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import LOOKUP, YOLO, call, postgres_schema, start_toolkeeper, write_agent
from test_replicas import Cluster, LoadBalancer

RULES = """
limits:
  - id: lookups-capped
    when: {tool: lookup}
    max: 20
    per: 1h
    reason: At most 20 lookups an hour, across every replica.
"""


@pytest.fixture(scope="module")
def capped(scripted, tmp_path_factory):
    directory = tmp_path_factory.mktemp("capped")
    write_agent(directory, YOLO + LOOKUP)
    (directory / "rules.yaml").write_text(RULES)
    with postgres_schema() as url:
        processes = [start_toolkeeper(directory / "agent.yaml", scripted.base_url, "--store", url, "--audit", url,
                                      "--policy", str(directory / "rules.yaml"), "--consent", "none")
                     for _ in range(2)]
        balancer = LoadBalancer(directory, [p.url.removesuffix("/v1") for p in processes])
        try:
            yield Cluster("replicas", directory, balancer.url, processes, url, url)
        finally:
            balancer.stop()
            for process in processes:
                process.stop()


def metric(base: str, name: str, **labels: str) -> float:
    with urllib.request.urlopen(base + "/metrics", timeout=10) as answer:
        page = answer.read().decode()
    wanted = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    found = re.search(rf"^{name}{{{re.escape(wanted)}}} ([0-9.e+]+)$", page, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def test_fifty_calls_at_once_on_two_replicas_against_a_limit_of_twenty_run_exactly_twenty(scripted, capped):
    word = f"cap{time.monotonic_ns()}"
    scripted.script({"when": word, "answering": False, "repeat": True, "tool_calls": [call("lookup", {"word": word})]},
                    {"when": word, "answering": True, "repeat": True, "content": "{tool_result}"})
    with ThreadPoolExecutor(50) as pool:
        answers = list(pool.map(lambda n: capped.ask([{"role": "user", "content": f"Look {word} up ({n})."}]),
                                range(50)))
    said = [answer["choices"][0]["message"]["content"] for answer in answers]
    denied = [text for text in said if "At most 20 lookups an hour, across every replica." in text]
    assert (len(capped.calls()), len(denied)) == (20, 30), said
    records = capped.records(tool="lookup")
    assert len({record["pid"] for record in records}) == 2  # both replicas decided some
    assert sorted(r["status"] for r in records).count("ok") == 20
    assert {r["decision_rule"] for r in records if r["status"] == "denied"} == {"lookups-capped"}
    for base in capped.replicas:  # the store's count, the same on each replica
        assert metric(base, "toolkeeper_limit_used", limit="lookups-capped") == 20
        assert metric(base, "toolkeeper_limit_max", limit="lookups-capped") == 20
    stopped = sum(metric(base, "toolkeeper_limit_stopped_total", effect="deny", limit="lookups-capped")
                  for base in capped.replicas)
    assert stopped == 30
