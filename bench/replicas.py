"""Beyond one process, measured in one run: workers, the PostgreSQL store, approvals across replicas, parallel calls.

(e) `--workers 2` against one worker: throughput at concurrency 32 (wrk, a C load
    generator, against a canned model answer served by HAProxy, so that the two
    cores go to toolkeeper), no declared call, streamed and not. Goal: >= 1.7x.
(f) the PostgreSQL store against the SQLite one, same toolkeeper otherwise, p50 at
    concurrency 1: a request with no declared call (a conversation with history,
    so the store is read) and one with a declared call (/bin/true). Goals: +0.3 ms
    and +1 ms at most.
(g) a call waiting for approval on one replica, approved through the other
    (PostgreSQL LISTEN/NOTIFY): from the approve answer to the agent's answer,
    which includes /bin/true's run and a model round. Goal: the release within 100 ms.
(h) four 100 ms tools in one response against one: the turn's time. Goal: ~1x.

    python bench/replicas.py            # the full run (about two minutes)
    python bench/replicas.py --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
import overhead  # the mock model server and the client of the other benchmark

ROOT = overhead.ROOT
POSTGRES = os.environ.get("TOOLKEEPER_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
TOKEN = "bench-admin-token"
AGENT = """upstream: http://127.0.0.1:9/v1
yolo: false
tools:
  - name: noop
    description: Do nothing. Returns nothing.
    command: [/bin/true]
    tier: silent
  - name: gated
    description: Do nothing, once someone approves. Returns nothing.
    command: [/bin/true]
  - name: nap
    description: Sleep a tenth of a second. Returns nothing.
    parameters:
      tag: {type: string, description: "Which nap."}
    command: [/bin/sleep, "0.1"]
    tier: silent
"""
CANNED = """
defaults
    mode http
    timeout connect 2s
    timeout client 60s
    timeout server 60s
frontend model
    bind 127.0.0.1:{port}
    option http-buffer-request
    acl streamed req.body -m sub "\\"stream\\":true"
    http-request return status 200 content-type text/event-stream file {sse} if streamed
    http-request return status 200 content-type application/json file {whole}
"""
WRK_SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{body}'
"""


class Servers:
    """The processes of one run, stopped together."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.processes: list[subprocess.Popen] = []

    def start(self, args: list[str], **kwargs) -> subprocess.Popen:
        process = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, text=True, **kwargs)
        self.processes.append(process)
        return process

    def toolkeeper(self, upstream: str, *extra: str, env: dict | None = None) -> str:
        process = self.start([sys.executable, "-m", "toolkeeper", "serve", str(self.workdir / "agent.yaml"),
                              "--port", "0", "--upstream", upstream, "--log-level", "ERROR", *extra],
                             env={**os.environ, **(env or {})}, start_new_session=True)
        line = process.stdout.readline()
        if "listening on" not in line:
            raise RuntimeError(f"toolkeeper did not start: {line!r}")
        return line.split("http://", 1)[1].split()[0]

    def stop(self, process: subprocess.Popen | None = None) -> None:
        for each in [process] if process else self.processes:
            if each.poll() is None:
                each.terminate()
                each.wait(15)


def listening(port: int, within: float = 15.0) -> None:
    """Wait until something accepts connections on `port` (HAProxy can take over half a second to bind on a
    loaded machine, and wrk would find nothing there)."""
    deadline = time.monotonic() + within
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on port {port} after {within:.0f} s") from None
            time.sleep(0.05)


def wrk(url: str, body: dict, seconds: int) -> float:
    script = Path(tempfile.mkstemp(suffix=".lua")[1])
    script.write_text(WRK_SCRIPT.format(body=json.dumps(body)))
    done = subprocess.run(["wrk", "-t1", "-c32", f"-d{seconds}s", "-s", str(script), url + "/chat/completions"],
                          capture_output=True, text=True, timeout=seconds + 60)
    script.unlink()
    found = re.search(r"Requests/sec:\s+([\d.]+)", done.stdout)
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", done.stdout)
    if not found or errors:
        raise RuntimeError(f"wrk failed: {done.stdout} {done.stderr}")
    return float(found.group(1))


def workers_case(servers: Servers, quick: bool) -> None:
    """(e): wrk against toolkeeper with one worker, then two, in front of HAProxy's canned answer."""
    port = overhead.free_port()
    (servers.workdir / "whole.json").write_bytes(overhead.ANSWER_WHOLE)
    (servers.workdir / "sse.txt").write_bytes(overhead.ANSWER_SSE)
    config = servers.workdir / "canned.cfg"
    config.write_text(CANNED.format(port=port, sse=servers.workdir / "sse.txt", whole=servers.workdir / "whole.json"))
    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    servers.start([haproxy, "-f", str(config), "-db"])
    listening(port)
    canned = f"http://127.0.0.1:{port}/v1"
    seconds = 3 if quick else 10
    print(f"(e) throughput at concurrency 32 (wrk, {seconds} s each), no declared call")
    print(f"{'case':<16}{'direct rps':>11}{'1 worker':>10}{'2 workers':>11}{'2/1':>7}")
    for stream in (False, True):
        body = {"model": "b", "messages": overhead.MESSAGES, "stream": stream}
        direct = wrk(canned, body, seconds)
        rates = []
        for count in (1, 2):
            url = servers.toolkeeper(canned, "--workers", str(count), "--store", str(servers.workdir / f"s{count}.db"),
                                     "--audit", str(servers.workdir / f"a{count}.db"))
            wrk("http://" + url, body, 1)  # warm
            rates.append(wrk("http://" + url, body, seconds))
            servers.stop(servers.processes[-1])
        print(f"{'SSE' if stream else 'whole':<16}{direct:>11.0f}{rates[0]:>10.0f}{rates[1]:>11.0f}"
              f"{rates[1] / rates[0]:>7.2f}")


async def latency(url: str, bodies: list[dict], rounds: int) -> float:
    """p50 of one request after another; each body made distinct, so none is taken for a retry."""
    times = []
    async with aiohttp.ClientSession() as session:
        for n in range(rounds):
            for body in bodies:
                messages = [*body["messages"][:-1], {**body["messages"][-1],
                                                     "content": body["messages"][-1]["content"] + f" #{n}"}]
                started = time.perf_counter()
                async with session.post(url + "/chat/completions", json={**body, "messages": messages}) as answer:
                    await answer.read()
                    if answer.status != 200:
                        raise RuntimeError(f"{answer.status}: {await answer.text()}")
                times.append(time.perf_counter() - started)
    return statistics.median(times)


def fresh_schema() -> str:
    import psycopg

    name = f"tk_bench_{os.getpid()}"
    with psycopg.connect(POSTGRES, autocommit=True) as db:
        db.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")
        db.execute(f"CREATE SCHEMA {name}")
    return f"{POSTGRES}?options=-csearch_path%3D{name}"


async def store_case(servers: Servers, mock: str, quick: bool) -> None:
    """(f): the same toolkeeper on the SQLite store, then on PostgreSQL."""
    history = {"model": "b", "messages": [{"role": "user", "content": "Hello"},
                                          {"role": "assistant", "content": "Hello! How can I help?"},
                                          {"role": "user", "content": "Is the build green?"}]}
    declared = {"model": "b", "messages": [{"role": "user", "content": "call noop"}]}
    rounds = 100 if quick else 600
    print(f"\n(f) the store: p50 at concurrency 1, {rounds} requests each, ms")
    print(f"{'case':<28}{'SQLite':>9}{'PostgreSQL':>12}{'added':>8}")
    stores = {"SQLite": str(servers.workdir / "store.db"), "PostgreSQL": fresh_schema()}
    found: dict[str, dict[str, float]] = {}
    for name, store in stores.items():
        url = "http://" + servers.toolkeeper(mock, "--store", store, "--audit", str(servers.workdir / "audit.db"))
        await latency(url, [history, declared], 20)  # warm
        found[name] = {"no declared call": await latency(url, [history], rounds),
                       "one declared call": await latency(url, [declared], rounds)}
        servers.stop(servers.processes[-1])
    for case in ("no declared call", "one declared call"):
        sqlite, postgres = found["SQLite"][case], found["PostgreSQL"][case]
        print(f"{case:<28}{sqlite * 1e3:>9.3f}{postgres * 1e3:>12.3f}{(postgres - sqlite) * 1e3:>8.3f}")


async def approval_case(servers: Servers, mock: str, quick: bool) -> None:
    """(g): wait on replica A, approve through replica B."""
    store = fresh_schema()
    env = {"TOOLKEEPER_ADMIN_TOKEN": TOKEN}
    a, b = ("http://" + servers.toolkeeper(mock, "--store", store, "--audit", store, "--consent", "approvals",
                                           env=env) for _ in range(2))
    samples = []
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession() as session:
        for n in range(10 if quick else 40):
            body = {"model": "b", "messages": [{"role": "user", "content": f"gated #{n}"}]}
            waiting = asyncio.ensure_future(session.post(a + "/chat/completions", json=body))
            approval, deadline = None, time.monotonic() + 10
            while approval is None:
                if time.monotonic() > deadline:
                    raise RuntimeError("no call waited for approval")
                await asyncio.sleep(0.05)
                async with session.get(b[:-3] + "/toolkeeper/approvals", headers=headers) as listed:
                    approval = next(iter((await listed.json())["approvals"]), None)
            async with session.post(b[:-3] + f"/toolkeeper/approvals/{approval['id']}/approve",
                                    headers=headers, json={}) as answer:
                await answer.read()
            approved = time.perf_counter()
            response = await waiting
            await response.read()
            samples.append(time.perf_counter() - approved)
    print(f"\n(g) approved through the other replica -> the agent's answer (p50 of {len(samples)}): "
          f"{statistics.median(samples) * 1e3:.1f} ms, max {max(samples) * 1e3:.1f} ms "
          "(includes /bin/true and the second model round)")


async def parallel_case(servers: Servers, mock: str, quick: bool) -> None:
    """(h): one response with four 100 ms tools, against one with one."""
    url = "http://" + servers.toolkeeper(mock, "--store", str(servers.workdir / "p.db"), "--audit",
                                         str(servers.workdir / "pa.db"))
    rounds = 5 if quick else 20
    one = await latency(url, [{"model": "b", "messages": [{"role": "user", "content": "nap1 x"}]}], rounds)
    four = await latency(url, [{"model": "b", "messages": [{"role": "user", "content": "nap4 x"}]}], rounds)
    print(f"\n(h) one response calling one 100 ms tool: {one * 1e3:.0f} ms; calling four: {four * 1e3:.0f} ms "
          f"({four / one:.2f}x)")


def add_mock_calls() -> None:
    """The mock model's extra answers for these cases: the gated call, and one or four naps."""
    overhead.CALLS["call"] = overhead._call("noop", "{}")
    entries = [{"id": f"call_nap{i}", "type": "function", "function": {"name": "nap", "arguments":
                                                                         orjson.dumps({"tag": str(i)}).decode()}}
               for i in range(4)]
    for word, count in (("nap1", 1), ("nap4", 4)):
        overhead.CALLS[word] = (overhead._whole({"role": "assistant", "content": None,
                                                 "tool_calls": entries[:count]}), b"")
    overhead.CALLS["gated"] = overhead._call("gated", "{}")


async def run(quick: bool) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="tk-bench-replicas-"))
    (workdir / "agent.yaml").write_text(AGENT)
    servers = Servers(workdir)
    failed = False
    try:
        mock_port = overhead.free_port()
        servers.start([sys.executable, str(Path(__file__).resolve()), "--serve-mock", str(mock_port)])
        mock = f"http://127.0.0.1:{mock_port}/v1"
        await overhead.wait_ready(mock)
        print(f"beyond one process, {os.cpu_count()} cores\n")
        workers_case(servers, quick)
        await store_case(servers, mock, quick)
        await approval_case(servers, mock, quick)
        await parallel_case(servers, mock, quick)
    except Exception as exc:  # a broken run must say so, not print half a table
        print(f"benchmark failed: {exc!r}", file=sys.stderr)
        failed = True
    finally:
        servers.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--serve-mock", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    add_mock_calls()
    if args.serve_mock:
        overhead.serve_mock(args.serve_mock)
        return 0
    return asyncio.run(run(args.quick))


if __name__ == "__main__":
    sys.exit(main())
