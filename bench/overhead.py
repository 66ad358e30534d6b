"""What toolkeeper adds to a request, measured against a direct connection in the same run.

Three servers run as their own processes on 127.0.0.1: a fast mock model
server, a bare aiohttp pass-through (the floor: what any proxy costs), and
toolkeeper. The same requests go to each, at concurrency 1 and 32, streamed and
not, for (a) a request whose model calls no declared tool and (b) one whose
model calls one declared tool (`/bin/true`), and the script prints:

- added latency p50/p99 against direct, for the floor and for toolkeeper;
- throughput as a ratio of the floor's;
- CPU per request of the floor and of toolkeeper, and their ratio. Each case runs
  in five slices per server, taken in turn, so that the machine's noise falls on
  both alike: CPU is the median of a server's slices, and the ratio the median
  of toolkeeper's slice over the floor's just before it;
- for (b), what the declared round adds beyond the command's own run time
  and the second model round: toolkeeper(b) - toolkeeper(a) - direct - /bin/true.

(c) and (d) run the same turn as (a) over the Responses API (`/v1/responses`)
and Anthropic's Messages API (`/v1/messages`), and print toolkeeper's CPU per
request against its Chat Completions one.

Targets (issue 2): (a) throughput >= 0.8x the floor's and added p50 <= 0.4 ms at
concurrency 1; (b) the declared round adds <= 2 ms beyond the command's run;
(c), (d) a Responses or Messages turn with no declared call costs within 10% of
a Chat Completions one.

    python bench/overhead.py            # the full run (about a minute and a half)
    python bench/overhead.py --quick    # a smoke run
    python bench/overhead.py --peers    # toolkeeper against LiteLLM's proxy and Portkey's gateway (bench/peers.py;
                                        # `bash bench/peers.sh` installs them), about three minutes; --quick too
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
TICKS = os.sysconf("SC_CLK_TCK")
REPEATS = 5  # slices per server and case, taken in turn
CHAT = "/chat/completions"

TEXT = "The build is green and the release notes are ready for review."
MESSAGES = [{"role": "user", "content": "Is the build green?"}]


# -- the mock model server -------------------------------------------------------------

def _whole(message: dict) -> bytes:
    return orjson.dumps({"id": "chatcmpl-bench", "object": "chat.completion", "created": 1700000000,
                         "model": "bench", "choices": [{"index": 0, "message": message, "logprobs": None,
                                                        "finish_reason": "tool_calls" if "tool_calls" in message
                                                        else "stop"}],
                         "usage": {"prompt_tokens": 20, "completion_tokens": 12, "total_tokens": 32}})


def _sse(deltas: list[dict], finish: str) -> bytes:
    head = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1700000000, "model": "bench"}
    events = [{**head, "choices": [{"index": 0, "delta": d, "logprobs": None, "finish_reason": None}]}
              for d in deltas]
    events.append({**head, "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish}]})
    return b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def _call(name: str, arguments: str) -> tuple[bytes, bytes]:
    """A response calling one tool: whole, and streamed."""
    entry = {"id": "call_bench1", "type": "function", "function": {"name": name, "arguments": arguments}}
    whole = _whole({"role": "assistant", "content": None, "tool_calls": [entry]})
    streamed = _sse([{"role": "assistant", "content": None},
                     {"tool_calls": [{"index": 0, **entry, "function": {"name": name, "arguments": ""}}]},
                     {"tool_calls": [{"index": 0, "function": {"arguments": arguments}}]}], "tool_calls")
    return whole, streamed


ANSWER_WHOLE = _whole({"role": "assistant", "content": TEXT})
ANSWER_SSE = _sse([{"role": "assistant", "content": ""}] + [{"content": w + " "} for w in TEXT.split()], "stop")
# A request whose last user message starts with one of these words makes the mock call that tool.
CALLS = {"call": _call("noop", "{}"), "wasm": _call("word_count", '{"text": "the quick brown fox"}'),
         "argv": _call("word_count_argv", '{"text": "the quick brown fox"}')}


def _responses_events() -> tuple[bytes, bytes]:
    """The same answer over the Responses API: whole, and streamed event by event as OpenAI sends it."""
    message = {"id": "msg_bench", "type": "message", "role": "assistant", "status": "completed",
               "content": [{"type": "output_text", "text": TEXT, "annotations": [], "logprobs": []}]}
    usage = {"input_tokens": 20, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 12,
             "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 32}
    head = {"id": "resp_bench", "object": "response", "created_at": 1700000000, "status": "in_progress",
            "model": "bench", "output": [], "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
            "usage": None}
    final = {**head, "status": "completed", "output": [message], "usage": usage}
    at = {"item_id": "msg_bench", "output_index": 0, "content_index": 0}
    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    events = [{"type": "response.created", "response": head}, {"type": "response.in_progress", "response": head},
              {"type": "response.output_item.added", "output_index": 0,
               "item": {**message, "status": "in_progress", "content": []}},
              {"type": "response.content_part.added", **at, "part": part},
              *({"type": "response.output_text.delta", **at, "delta": w + " ", "logprobs": []} for w in TEXT.split()),
              {"type": "response.output_text.done", **at, "text": TEXT, "logprobs": []},
              {"type": "response.content_part.done", **at, "part": {**part, "text": TEXT}},
              {"type": "response.output_item.done", "output_index": 0, "item": message},
              {"type": "response.completed", "response": final}]
    streamed = b"".join(b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps({**e, "sequence_number": n})
                        + b"\n\n" for n, e in enumerate(events))
    return orjson.dumps(final), streamed


RESPONSES_WHOLE, RESPONSES_SSE = _responses_events()


def _messages_events() -> tuple[bytes, bytes]:
    """The same answer over Anthropic's Messages API: whole, and streamed as Anthropic sends it."""
    usage = {"input_tokens": 20, "output_tokens": 12, "cache_creation_input_tokens": 0,
             "cache_read_input_tokens": 0}
    message = {"id": "msg_bench", "type": "message", "role": "assistant", "model": "bench",
               "content": [{"type": "text", "text": TEXT}], "stop_reason": "end_turn", "stop_sequence": None,
               "usage": usage}
    events = [{"type": "message_start", "message": {**message, "content": [], "stop_reason": None}},
              {"type": "ping"},
              {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
              *({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": w + " "}}
                for w in TEXT.split()),
              {"type": "content_block_stop", "index": 0},
              {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
               "usage": {"output_tokens": 12}},
              {"type": "message_stop"}]
    streamed = b"".join(b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in events)
    return orjson.dumps(message), streamed


MESSAGES_WHOLE, MESSAGES_SSE = _messages_events()


async def mock_messages(request: web.Request) -> web.StreamResponse:
    body = orjson.loads(await request.read())
    if not body.get("stream"):
        return web.Response(body=MESSAGES_WHOLE, content_type="application/json")
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write_eof(MESSAGES_SSE)
    return response


async def mock_responses(request: web.Request) -> web.StreamResponse:
    body = orjson.loads(await request.read())
    if not body.get("stream"):
        return web.Response(body=RESPONSES_WHOLE, content_type="application/json")
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write_eof(RESPONSES_SSE)
    return response


async def mock_chat(request: web.Request) -> web.StreamResponse:
    body = orjson.loads(await request.read())
    last = body["messages"][-1]
    wanted = CALLS.get(str(last.get("content")).split(" ", 1)[0]) if last["role"] == "user" else None
    whole, streamed = wanted or (ANSWER_WHOLE, ANSWER_SSE)
    if not body.get("stream"):
        return web.Response(body=whole, content_type="application/json")
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(streamed)
    await response.write_eof()
    return response


def serve_mock(port: int) -> None:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", mock_chat)
    app.router.add_post("/v1/responses", mock_responses)
    app.router.add_post("/v1/messages", mock_messages)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


# -- the floor: a bare aiohttp pass-through ----------------------------------------------

def serve_floor(port: int, upstream: str, loop: str = "asyncio") -> None:
    async def forward(request: web.Request) -> web.StreamResponse:
        session: aiohttp.ClientSession = request.app["session"]
        async with session.post(upstream + "/chat/completions", data=await request.read(),
                                headers={"Content-Type": "application/json"}) as answer:
            response = web.StreamResponse(status=answer.status, headers={
                "Content-Type": answer.headers.get("Content-Type", "application/json")})
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    async def session_ctx(app: web.Application):
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            app["session"] = session
            yield

    app = web.Application()
    app.cleanup_ctx.append(session_ctx)
    app.router.add_post("/v1/chat/completions", forward)
    if loop == "uvloop":  # as serve runs, where uvloop installs
        import uvloop

        web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None, loop=uvloop.new_event_loop())
        return
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


# -- the client ------------------------------------------------------------------------------

def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """The process's CPU time, every thread's (those that ended too), in nanoseconds from the kernel's clock
    of that process where Linux gives it (the clock-tick counts of /proc/PID/stat are 10 ms steps, too coarse
    for the short slices measured here)."""
    try:
        return time.clock_gettime(((~pid) << 3) | 2)  # Linux's CPU clock id of a process: CPUCLOCK_SCHED
    except OSError:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICKS


async def wait_ready(url: str) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(200):
            try:
                async with session.post(url + "/chat/completions", json={"messages": MESSAGES, "model": "b"}) as r:
                    await r.read()
                    return
            except aiohttp.ClientError:
                await asyncio.sleep(0.05)
    raise RuntimeError(f"{url} did not start")


async def measure(url: str, body: dict, concurrency: int, total: int, pid: int | None,
                  path: str = "/chat/completions", warm: int = 50) -> dict:
    """Each request differs by a counter: identical ones would be taken for retries and replayed."""
    latencies: list[float] = []
    counter = iter(range(10**9))
    key = "messages" if "messages" in body else "input"

    def encoded() -> bytes:
        last = body[key][-1]
        conversation = [*body[key][:-1], {**last, "content": f"{last['content']} #{next(counter)}"}]
        return orjson.dumps({**body, key: conversation})

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def one() -> None:
            started = time.perf_counter()
            async with session.post(url + path, data=encoded(),
                                    headers={"Content-Type": "application/json"}) as response:
                await response.read()
                if response.status != 200:
                    raise RuntimeError(f"{url}: {response.status}")
            latencies.append(time.perf_counter() - started)

        queue = iter(range(max(warm, concurrency)))

        async def worker() -> None:
            for _ in queue:
                await one()

        await asyncio.gather(*(worker() for _ in range(concurrency)))  # warm the pools: a connection a worker
        latencies.clear()
        cpu_before = cpu_seconds(pid) if pid else 0.0
        queue = iter(range(total))

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
        cpu = (cpu_seconds(pid) - cpu_before) if pid else 0.0
    return {**percentiles(latencies), "rps": total / elapsed, "cpu_us": cpu / total * 1e6, "latencies": latencies,
            "elapsed": elapsed, "total": total}


def percentiles(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    return {"p50": statistics.median(ordered), "p99": ordered[int(len(ordered) * 0.99) - 1]}


async def compare(targets: dict[str, tuple[str, str, dict]], pids: dict, concurrency: int, total: int,
                  repeats: int = REPEATS) -> dict:
    """The same load (`targets`: a name's base URL, path and body) on each in turn, `repeats` times over, in
    slices of `total // repeats` requests, so that what the machine does meanwhile falls on all of them alike.
    Per name: latencies over every slice, throughput over their time, CPU per request the median of its
    slices'; and its CPU per request over that of the name measured just before it, the median over the
    repeats (`cpu_ratio`): paired, as the noise of one moment is shared by the slices measured in it."""
    slices: dict[str, list[dict]] = {name: [] for name in targets}
    for repeat in range(repeats):
        for name, (url, path, body) in targets.items():
            slices[name].append(await measure(url, body, concurrency, total // repeats, pids.get(name), path,
                                              warm=50 if repeat == 0 else 5))
    row, previous = {}, None
    for name, measured in slices.items():
        row[name] = {**percentiles([latency for one in measured for latency in one["latencies"]]),
                     "rps": sum(one["total"] for one in measured) / sum(one["elapsed"] for one in measured),
                     "cpu_us": statistics.median(one["cpu_us"] for one in measured)}
        if previous is not None and pids.get(name) and pids.get(previous):
            row[name]["cpu_ratio"] = statistics.median(mine["cpu_us"] / theirs["cpu_us"] for mine, theirs
                                                       in zip(measured, slices[previous], strict=True))
        previous = name
    return row


async def true_run_time(samples: int) -> float:
    times = []
    for _ in range(samples):
        started = time.perf_counter()
        process = await asyncio.create_subprocess_exec("/bin/true", start_new_session=True,
                                                       stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        await process.communicate()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def pin(processes: list[subprocess.Popen]) -> None:
    """On a machine of two or more cores: the proxies measured (floor, toolkeeper) on the last core, the client
    and the mock model on the others, so the proxy measured never shares its core with the load."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return
    os.sched_setaffinity(0, set(cores[:-1]))
    os.sched_setaffinity(processes[0].pid, set(cores[:-1]))
    for process in processes[1:]:
        os.sched_setaffinity(process.pid, {cores[-1]})


async def run(quick: bool) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="tk-bench-"))
    agent = workdir / "agent.yaml"
    agent.write_text("upstream: http://127.0.0.1:9/v1\nyolo: true\ntools:\n"
                     "  - name: noop\n    description: Do nothing. Returns nothing.\n"
                     "    command: [/bin/true]\n")
    mock_port, floor_port, tk_port = free_port(), free_port(), free_port()
    mock_url = f"http://127.0.0.1:{mock_port}/v1"
    me = [sys.executable, str(Path(__file__).resolve())]
    processes = [
        subprocess.Popen([*me, "--serve-mock", str(mock_port)]),
        subprocess.Popen([*me, "--serve-floor", str(floor_port), mock_url]),
        subprocess.Popen([sys.executable, "-m", "toolkeeper", "serve", str(agent), "--port", str(tk_port),
                          "--upstream", mock_url, "--log-level", "WARNING"], cwd=ROOT, stdout=subprocess.DEVNULL),
    ]
    pin(processes)
    urls = {"direct": mock_url, "floor": f"http://127.0.0.1:{floor_port}/v1",
            "toolkeeper": f"http://127.0.0.1:{tk_port}/v1"}
    pids = {"direct": None, "floor": processes[1].pid, "toolkeeper": processes[2].pid}
    failed = False
    try:
        for url in urls.values():
            await wait_ready(url)
        sizes = {1: 300 if quick else 2000, 32: 600 if quick else 6000}
        print(f"toolkeeper overhead, {os.cpu_count()} cores; latencies in ms, added = minus direct\n")
        print(f"{'case':<26}{'conc':>5}{'direct p50':>11}{'floor +p50':>11}{'tk +p50':>9}{'tk +p99':>9}"
              f"{'floor rps':>10}{'tk rps':>8}{'tk/floor':>9}{'floor cpu':>10}{'tk cpu':>8}{'cpu ratio':>10}")
        results = {}
        for stream in (False, True):
            body = {"model": "b", "messages": MESSAGES, "stream": stream}
            for concurrency, total in sizes.items():
                row = await compare({name: (url, CHAT, body) for name, url in urls.items()}, pids, concurrency, total)
                results[(stream, concurrency)] = row
                d, f, t = row["direct"], row["floor"], row["toolkeeper"]
                ratio = t["rps"] / f["rps"]
                name = f"(a) no declared call{' SSE' if stream else ''}"
                print(f"{name:<26}{concurrency:>5}{d['p50'] * 1e3:>11.3f}{(f['p50'] - d['p50']) * 1e3:>11.3f}"
                      f"{(t['p50'] - d['p50']) * 1e3:>9.3f}{(t['p99'] - d['p99']) * 1e3:>9.3f}{f['rps']:>10.0f}"
                      f"{t['rps']:>8.0f}{ratio:>9.2f}{f['cpu_us']:>8.0f}µs{t['cpu_us']:>6.0f}µs"
                      f"{t['cpu_ratio']:>10.2f}")

        true_time = await true_run_time(50 if quick else 300)
        print(f"\n/bin/true's own run time (asyncio subprocess, p50): {true_time * 1e3:.3f} ms")
        print(f"{'case':<26}{'conc':>5}{'tk(b) p50':>11}{'tk(a) p50':>11}{'direct':>9}{'added':>9}"
              f"{'tk(b) rps':>10}")
        for stream in (False, True):
            body = {"model": "b", "messages": [{"role": "user", "content": "call"}], "stream": stream}
            for concurrency, total in {1: sizes[1] // 2, 32: sizes[32] // 2}.items():
                b = (await compare({"toolkeeper": (urls["toolkeeper"], CHAT, body)}, pids, concurrency,
                                   total))["toolkeeper"]
                a = results[(stream, concurrency)]["toolkeeper"]
                direct = results[(stream, concurrency)]["direct"]
                added = b["p50"] - a["p50"] - direct["p50"] - true_time
                name = f"(b) one declared call{' SSE' if stream else ''}"
                print(f"{name:<26}{concurrency:>5}{b['p50'] * 1e3:>11.3f}{a['p50'] * 1e3:>11.3f}"
                      f"{direct['p50'] * 1e3:>9.3f}{added * 1e3:>9.3f}{b['rps']:>10.0f}")
        await responses_cases(urls, pids, sizes)
    except Exception as exc:  # a broken run must say so, not print half a table
        print(f"benchmark failed: {exc}", file=sys.stderr)
        failed = True
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(10)
    return 1 if failed else 0


async def responses_cases(urls: dict, pids: dict, sizes: dict) -> None:
    """(c) the same turn over the Responses API and (d) over the Messages API: toolkeeper's cost against its
    Chat Completions one, measured in turn with it."""
    print(f"\n{'case':<26}{'conc':>5}{'direct p50':>11}{'tk +p50':>9}{'tk rps':>8}{'tk cpu':>8}"
          f"{'chat cpu':>9}{'api/chat':>10}")
    apis = (("(c) Responses", "/responses", "input", {}), ("(d) Messages", "/messages", "messages",
                                                                 {"max_tokens": 64}))
    for label, path, key, extra in apis:
        for stream in (False, True):
            body = {"model": "b", key: [{"role": "user", "content": MESSAGES[0]["content"]}], "stream": stream,
                    **extra}
            chat_body = {"model": "b", "messages": MESSAGES, "stream": stream}
            for concurrency, total in sizes.items():
                row = await compare({"direct": (urls["direct"], path, body),
                                     "chat": (urls["toolkeeper"], CHAT, chat_body),
                                     "api": (urls["toolkeeper"], path, body)},
                                    {"chat": pids["toolkeeper"], "api": pids["toolkeeper"]}, concurrency, total)
                d, c, t = row["direct"], row["chat"], row["api"]
                name = f"{label}, no call{' SSE' if stream else ''}"
                print(f"{name:<26}{concurrency:>5}{d['p50'] * 1e3:>11.3f}{(t['p50'] - d['p50']) * 1e3:>9.3f}"
                      f"{t['rps']:>8.0f}{t['cpu_us']:>6.0f}µs{c['cpu_us']:>7.0f}µs{t['cpu_ratio']:>10.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--peers", action="store_true", help="toolkeeper against LiteLLM's proxy and Portkey's "
                        "gateway, same load, one core each (bench/peers.py; `bash bench/peers.sh` installs them)")
    parser.add_argument("--serve-mock", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-floor", nargs="+", help=argparse.SUPPRESS)  # PORT UPSTREAM [asyncio|uvloop]
    args = parser.parse_args()
    if args.serve_mock:
        serve_mock(args.serve_mock)
        return 0
    if args.serve_floor:
        serve_floor(int(args.serve_floor[0]), *args.serve_floor[1:])
        return 0
    if args.peers:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import peers

        return asyncio.run(peers.run(args.quick))
    return asyncio.run(run(args.quick))


if __name__ == "__main__":
    sys.exit(main())
