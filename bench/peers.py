"""`bench/overhead.py --peers`: toolkeeper against the gateways users compare it with, on the same load.

Each server under test runs as its own process tree, all of them pinned to one core (the last), with wrk (the
load generator, in C) and the mock model server of bench/overhead.py on the other core(s):

- the floor, a bare aiohttp pass-through, on asyncio and on uvloop (serve runs on uvloop where it installs);
- toolkeeper (`toolkeeper serve`, one worker, its default loop);
- LiteLLM's proxy (`litellm[proxy]` and the OpenTelemetry SDK its requests import; one uvicorn worker, no
  master key, no database, logging at ERROR, no callbacks, the model cost map read from the package instead of
  the network);
- Portkey's gateway (`@portkey-ai/gateway`, Node, headless, the provider `openai` and the mock as its custom
  host, given in the x-portkey-* headers of each request).

All point at the same mock. The load: OpenAI Chat Completions, one user message and one tool in the request,
the model calling no tool, not streamed; wrk with one thread and 32 connections, each request's body made
distinct by a counter. Each server is first checked to answer the request correctly (the mock's text back,
finish_reason `stop`, no tool call), then warmed, then measured in slices taken in turn, so that the machine's
noise falls on all of them alike. Per server: requests per second (all slices' requests over their time), CPU
per request (the CPU time of the server's whole process tree, read from /proc, over the requests, the median
of its slices), p50 and p99 latency as wrk measures them (the median of the slices'); and, paired by slice,
ratios against the floor on uvloop and between toolkeeper and each peer.

Peers are installed by `bash bench/peers.sh` into bench/.peers/; one not installed is named, with that
command, and the rest are measured.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson
import overhead

ROOT = overhead.ROOT
PEERS = ROOT / "bench" / ".peers"
LITELLM = PEERS / "litellm"
GATEWAY = PEERS / "portkey" / "node_modules" / "@portkey-ai" / "gateway"
CONNECTIONS = 32
KEY = "sk-bench-not-a-key"
TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city."}},
                   "required": ["city"]}}}
QUESTION = overhead.MESSAGES[0]["content"]
LITELLM_CONFIG = """model_list:
  - model_name: bench
    litellm_params:
      model: openai/bench
      api_base: {mock}
      api_key: {key}
litellm_settings:
  telemetry: false
  set_verbose: false
  callbacks: []
  success_callback: []
  failure_callback: []
  turn_off_message_logging: true
general_settings:
  dangerously_permit_weak_or_unset_master_key: true
  disable_spend_logs: true
  disable_error_logs: true
"""
WRK_SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
{headers}
local head, tail = {head}, {tail}
local counter = 0
request = function()
  counter = counter + 1
  return wrk.format(nil, nil, nil, head .. counter .. tail)
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("WRK %d %d %d %d %d\\n", summary.requests, summary.duration,
                         e.connect + e.read + e.write + e.timeout, e.status,
                         latency:percentile(50)), string.format("WRK99 %d\\n", latency:percentile(99)))
end
"""


@dataclass
class Target:
    name: str
    argv: list[str]
    env: dict = field(default_factory=dict)
    headers: dict = field(default_factory=dict)
    version: str = ""
    port: int = field(default_factory=overhead.free_port)
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


def body(n: int | str) -> dict:
    return {"model": "bench", "messages": [{"role": "user", "content": f"{QUESTION} #{n}"}], "tools": [TOOL],
            "stream": False}


def output(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def targets(mock: str, workdir: Path) -> tuple[list[Target], list[str]]:
    """The servers to measure, all pointed at `mock`; and the peers not installed."""
    import uvloop

    me = [sys.executable, str(ROOT / "bench" / "overhead.py")]
    (workdir / "agent.yaml").write_text("upstream: http://127.0.0.1:9/v1\nyolo: true\ntools:\n"
                                        "  - name: noop\n    description: Do nothing. Returns nothing.\n"
                                        "    command: [/bin/true]\n")
    found = [Target("floor (asyncio)", [*me, "--serve-floor", "{port}", mock],
                    version=f"aiohttp {aiohttp.__version__}"),
             Target("floor (uvloop)", [*me, "--serve-floor", "{port}", mock, "uvloop"],
                    version=f"aiohttp {aiohttp.__version__}, uvloop {uvloop.__version__}"),
             Target("toolkeeper", [sys.executable, "-m", "toolkeeper", "serve", str(workdir / "agent.yaml"),
                                   "--port", "{port}", "--upstream", mock, "--workers", "1", "--log-level", "WARNING"],
                    version=f"toolkeeper {importlib.metadata.version('toolkeeper')}, Python "
                            f"{sys.version.split()[0]}, event loop: serve's default (uvloop where installed)")]
    missing = []
    for name, peer in (("LiteLLM's proxy", litellm), ("Portkey's gateway", portkey)):
        target = peer(mock, workdir)
        if target:
            found.append(target)
        else:
            missing.append(name)
    return found, missing


def litellm(mock: str, workdir: Path) -> Target | None:
    """LiteLLM's proxy: the config routes model `bench` to the mock as an OpenAI-compatible server; one uvicorn
    worker; no master key (so no auth), no database, logs at ERROR, no callbacks, no telemetry."""
    if not (LITELLM / "bin" / "litellm").exists():
        return None
    config = workdir / "litellm.yaml"
    config.write_text(LITELLM_CONFIG.format(mock=mock, key=KEY))
    version = [*output([str(LITELLM / "bin" / "python"), "-c", "import importlib.metadata as m, sys; "
                        "print(m.version('litellm'), sys.version.split()[0])"]).split(), "?", "?"]
    return Target("LiteLLM proxy", [str(LITELLM / "bin" / "litellm"), "--config", str(config), "--host", "127.0.0.1",
                                    "--port", "{port}", "--num_workers", "1"],
                  env={"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR", "LITELLM_MODE": "PRODUCTION",
                       "DATABASE_URL": None, "LITELLM_MASTER_KEY": None},
                  version=f"litellm {version[0]}, Python {version[1]}, uvicorn on uvloop, one worker")


def portkey(mock: str, workdir: Path) -> Target | None:
    """Portkey's gateway, headless, in production mode; each request names the provider (`openai`) and the mock
    as its custom host in its x-portkey-* headers, and carries the key the gateway passes on."""
    node_path = PEERS / "portkey" / "node-path"  # which node bench/peers.sh chose
    if not (GATEWAY / "build" / "start-server.js").exists() or not node_path.exists():
        return None
    node = node_path.read_text().strip()
    version = json.loads((GATEWAY / "package.json").read_text())["version"]
    return Target("Portkey gateway", [node, str(GATEWAY / "build" / "start-server.js"), "--port={port}", "--headless"],
                  env={"NODE_ENV": "production"},
                  headers={"x-portkey-provider": "openai", "x-portkey-custom-host": mock,
                           "Authorization": f"Bearer {KEY}"},
                  version=f"@portkey-ai/gateway {version}, Node {output([node, '--version'])}")


# -- processes and their CPU ------------------------------------------------------------------

def cores() -> tuple[str, str] | None:
    """The server's core and the load's: the last core for the server measured, the others for wrk and the mock."""
    mine = sorted(os.sched_getaffinity(0))
    if len(mine) < 2:
        return None
    return str(mine[-1]), ",".join(str(core) for core in mine[:-1])


def pinned(argv: list[str], core: str | None) -> list[str]:
    return ["taskset", "-c", core, *argv] if core else argv


def start(argv: list[str], core: str | None, log: Path, env: dict | None = None) -> subprocess.Popen:
    """In a session of its own, so that stopping it stops everything it started; `env` adds to the environment,
    and takes out what it maps to None."""
    environment = {**os.environ, **(env or {})}
    with log.open("wb") as out:
        return subprocess.Popen(pinned(argv, core), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                env={k: v for k, v in environment.items() if v is not None}, start_new_session=True)


def stop(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(15)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(5)
    except ProcessLookupError:
        pass


def tree_cpu(root: int) -> float:
    """CPU seconds (user + system) of `root` and every process below it, from /proc/PID/stat: each process's
    own time, its threads' included, and that of its children it has waited for."""
    parents: dict[int, int] = {}
    stats: dict[int, list[str]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry)] = int(fields[1])
            stats[int(entry)] = fields
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in tree]
        tree.update(children)
        frontier.extend(children)
    ticks = sum(int(stats[pid][i]) for pid in tree if pid in stats for i in (11, 12, 13, 14))
    return ticks / overhead.TICKS


# -- the check and the load -------------------------------------------------------------------

async def answers(target: Target, within: float) -> None:
    """Wait for `target` to answer the bench's request, and check that it answers it correctly: the mock's text
    back, the turn finished, no tool called."""
    deadline, last = time.monotonic() + within, "no answer"
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if target.process and target.process.poll() is not None:
                raise RuntimeError(f"{target.name} exited ({target.process.returncode})")
            try:
                async with session.post(target.url + "/chat/completions", json=body("check"),
                                        headers=target.headers) as response:
                    text = await response.read()
                    if response.status != 200:
                        raise RuntimeError(f"{response.status}: {text[:300]!r}")
                    choice = orjson.loads(text)["choices"][0]
                    message = choice["message"]
                    if message.get("content") != overhead.TEXT or message.get("tool_calls") or \
                            choice.get("finish_reason") != "stop":
                        raise AssertionError(f"{target.name} answered wrongly: {text[:400]!r}")
                    return
            except (aiohttp.ClientError, RuntimeError) as exc:
                last = str(exc)
                await asyncio.sleep(0.25)
    raise RuntimeError(f"{target.name} did not answer within {within:.0f} s: {last}")


def wrk_script(target: Target, workdir: Path) -> Path:
    text = orjson.dumps(body("")).decode()
    head, tail = text.split(' #"', 1)
    lua = json.dumps  # a JSON string is a Lua string here (ASCII, no escapes but \")
    script = workdir / f"wrk-{target.port}.lua"
    script.write_text(WRK_SCRIPT.format(
        headers="\n".join(f"wrk.headers[{lua(k)}] = {lua(v)}" for k, v in target.headers.items()),
        head=lua(head + ' #'), tail=lua('"' + tail)))
    return script


def load(target: Target, script: Path, seconds: int, core: str | None, mock: int) -> dict:
    """One slice: wrk for `seconds` against `target`, and the CPU its process tree spent meanwhile; and how busy
    the load's side was (wrk and the mock model, over the load's cores): near 100%, the load limits the rate."""
    before, mock_before, wrk_before = tree_cpu(target.process.pid), tree_cpu(mock), children_cpu()
    done = subprocess.run(pinned(["wrk", "-t1", f"-c{CONNECTIONS}", f"-d{seconds}s", "--timeout", "10s", "-s",
                                  str(script), target.url + "/chat/completions"], core),
                          capture_output=True, text=True, timeout=seconds + 60)
    cpu = tree_cpu(target.process.pid) - before
    load_cpu = tree_cpu(mock) - mock_before + children_cpu() - wrk_before
    lines = {line.split()[0]: line.split()[1:] for line in done.stdout.splitlines() if line.startswith("WRK")}
    if "WRK" not in lines:
        raise RuntimeError(f"wrk failed against {target.name}: {done.stdout} {done.stderr}")
    requests, duration, failed, status, p50 = (int(x) for x in lines["WRK"])
    if failed or status or not requests:
        raise RuntimeError(f"{target.name}: {failed} socket errors, {status} non-2xx answers in {requests}")
    load_cores = len(core.split(",")) if core else os.cpu_count()
    return {"rps": requests / (duration / 1e6), "requests": requests, "seconds": duration / 1e6, "cpu": cpu,
            "cpu_us": cpu / requests * 1e6, "p50": p50 / 1e3, "p99": int(lines["WRK99"][0]) / 1e3,
            "load": load_cpu / (duration / 1e6) / load_cores}


def children_cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def measure(found: list[Target], workdir: Path, repeats: int, seconds: int, warm: int, core: str | None,
            mock: int) -> dict:
    """Every target in turn, `repeats` times over, after a warm-up of `warm` seconds each (Node's JIT takes about
    ten seconds of this load to reach its pace). Also prints what each spent while the others were measured
    (all of them wait on the same core)."""
    scripts = {target.name: wrk_script(target, workdir) for target in found}
    for target in found:
        load(target, scripts[target.name], warm, core, mock)
    slices: dict[str, list[dict]] = {target.name: [] for target in found}
    before, started = {target.name: tree_cpu(target.process.pid) for target in found}, time.monotonic()
    for _ in range(repeats):
        for target in found:
            slices[target.name].append(load(target, scripts[target.name], seconds, core, mock))
    elapsed = time.monotonic() - started
    idle = {target.name: (tree_cpu(target.process.pid) - before[target.name]
                          - sum(one["cpu"] for one in slices[target.name]))
            / (elapsed - sum(one["seconds"] for one in slices[target.name])) for target in found}
    print("CPU each spent while the others were measured: "
          + ", ".join(f"{name} {share:.1%}" for name, share in idle.items()))
    return slices


def summary(measured: list[dict]) -> dict:
    return {"rps": sum(one["requests"] for one in measured) / sum(one["seconds"] for one in measured),
            **{key: statistics.median(one[key] for one in measured) for key in ("cpu_us", "p50", "p99", "load")}}


def paired(mine: list[dict], theirs: list[dict], key: str) -> float:
    """The median over the repeats of mine over theirs, slice by slice (slices of one repeat share its noise)."""
    return statistics.median(a[key] / b[key] for a, b in zip(mine, theirs, strict=True))


def report(slices: dict[str, list[dict]], repeats: int, seconds: int, warm: int) -> None:
    floor = slices.get("floor (uvloop)")
    print(f"\n{'server':<18}{'rps':>8}{'CPU/req':>10}{'p50 ms':>9}{'p99 ms':>9}{'load':>7}"
          f"{'CPU/floor':>11}{'p99/floor':>11}{'rps/floor':>11}")
    for name, measured in slices.items():
        row = summary(measured)
        line = (f"{name:<18}{row['rps']:>8.0f}{row['cpu_us']:>8.0f}µs{row['p50']:>9.2f}{row['p99']:>9.2f}"
                f"{row['load']:>7.0%}")
        if floor:
            line += "".join(f"{paired(measured, floor, key):>11.2f}" for key in ("cpu_us", "p99", "rps"))
        print(line)
    mine = slices.get("toolkeeper")
    peers = [name for name in slices if not name.startswith(("floor", "toolkeeper"))]
    if mine and peers:
        print(f"\n{'toolkeeper against':<18}{'peer CPU / tk CPU':>19}{'peer p99 / tk p99':>19}"
              f"{'tk rps / peer rps':>19}")
        for name in peers:
            print(f"{name:<18}{paired(slices[name], mine, 'cpu_us'):>19.2f}{paired(slices[name], mine, 'p99'):>19.2f}"
                  f"{paired(mine, slices[name], 'rps'):>19.2f}")
    print(f"\n{repeats} slices of {seconds} s per server after {warm} s of warm-up, taken in turn; CPU/req and "
          "the latencies are the median of the slices', rps over all of them; ratios are paired by slice (median "
          "over the repeats); `load`: how busy wrk and the mock model kept their core(s)"
          + ("; ratios above 1 in the last table mean toolkeeper is ahead." if mine and peers else "."))


# -- the run ---------------------------------------------------------------------------------

async def checked(found: list[Target], workdir: Path) -> tuple[list[Target], bool]:
    """Those of `found` that answer the request correctly; a peer that does not is named and left out, the floor
    or toolkeeper not answering ends the run."""
    good, failed = [], False
    for target in found:
        started = time.monotonic()
        try:
            await answers(target, 180)
        except (RuntimeError, AssertionError) as exc:
            output = (workdir / f"{target.port}.log").read_text(errors="replace")[-1500:]
            print(f"{target.name} is not measured: {exc}\n  its output ends: {output}", file=sys.stderr)
            if target.name.startswith(("floor", "toolkeeper")):
                raise
            failed = True
            continue
        good.append(target)
        loop = re.search(r"event loop ([^)]+)\)", (workdir / f"{target.port}.log").read_text(errors="replace"))
        if target.name == "toolkeeper" and loop:
            target.version = target.version.replace("serve's default (uvloop where installed)", loop.group(1))
        print(f"  {target.name}: {target.version}; answers correctly ({time.monotonic() - started:.1f} s to "
              "start)", flush=True)
    return good, failed


async def run(quick: bool) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="tk-bench-peers-"))
    pins = cores()
    server_core, load_core = pins if pins else (None, None)
    mock_port = overhead.free_port()
    mock_url = f"http://127.0.0.1:{mock_port}/v1"
    processes = [start([sys.executable, str(ROOT / "bench" / "overhead.py"), "--serve-mock", str(mock_port)],
                       load_core, workdir / "mock.log")]
    repeats, seconds, warm = (2, 2, 3) if quick else (5, 5, 10)
    failed = False
    try:
        print(f"peers: the same load on each (wrk, 1 thread, {CONNECTIONS} connections; Chat Completions, one tool "
              "in the request, no call, not streamed), each checked first to answer it correctly")
        print(f"pinned: the server measured on core {server_core}, wrk and the mock model on {load_core}"
              if pins else "one core: nothing pinned")
        found, missing = targets(mock_url, workdir)
        for name in missing:
            print(f"  {name} is not installed: `bash bench/peers.sh` installs it into bench/.peers/; measuring the "
                  "rest")
        await overhead.wait_ready(mock_url)
        for target in found:
            argv = [arg.replace("{port}", str(target.port)) for arg in target.argv]
            target.process = start(argv, server_core, workdir / f"{target.port}.log", target.env)
            processes.append(target.process)
        good, failed = await checked(found, workdir)
        report(measure(good, workdir, repeats, seconds, warm, load_core, processes[0].pid), repeats, seconds, warm)
    except Exception as exc:  # a broken run must say so, not print half a table
        print(f"benchmark failed: {exc}", file=sys.stderr)
        failed = True
    finally:
        for process in processes:
            stop(process)
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0
