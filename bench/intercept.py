"""What interception adds: the same chat request through mitmproxy and toolkeeper, against toolkeeper direct.

One `toolkeeper intercept` (its toolkeeper and mitmdump pinned to the last
core, the client and the mock model on the others) maps a made-up host
(`api.bench.test`) to a mock model server. Measured in the same run, each the
median of sequential requests from http.client (the standard library):

- direct: the agent's base URL is toolkeeper's (http://127.0.0.1:PORT/v1);
- intercepted: the base URL stays https://api.bench.test/v1, through the proxy;

first on a kept connection (the per-request cost: mitmproxy's TLS, parsing and
addon, the loopback hop), then with a new connection per request (the CONNECT
and TLS handshake on top). The floor, the mock model alone, is printed too.

    python bench/intercept.py [--quick]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import overhead  # noqa: E402

ROOT = HERE.parent
BODY = json.dumps({"model": "b", "messages": [{"role": "user", "content": "hello"}]}).encode()


def median_ms(connect, path: str, count: int, fresh: bool) -> float:
    """Sequential requests: on one kept connection, or on a new connection (and CONNECT, and TLS) each."""
    took = []
    kept = None if fresh else connect()
    for _ in range(count):
        connection = connect() if fresh else kept
        started = time.perf_counter()
        connection.request("POST", path, body=BODY, headers={"Content-Type": "application/json",
                                                             "Authorization": "Bearer sk-bench"})
        response = connection.getresponse()
        response.read()
        took.append(time.perf_counter() - started)
        assert response.status == 200, response.status
        if fresh:
            connection.close()
    if kept is not None:
        kept.close()
    return statistics.median(took[1:] if not fresh else took) * 1000


def start(workdir: Path, mock_url: str) -> tuple[subprocess.Popen, dict[str, str], str, list[int]]:
    (workdir / "agent.yaml").write_text(f"upstream: {mock_url}\nyolo: true\ntools:\n"
                                        "  - name: run_nothing\n    description: Run nothing. Use it when asked to "
                                        "wait. Returns nothing.\n    command: [/bin/true]\n")
    port = overhead.free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "toolkeeper", "intercept", str(workdir / "agent.yaml"), "--port", str(port),
         "--confdir", str(workdir / "ca"), "--map", f"api.bench.test={mock_url}", "--", "--log-level", "ERROR",
         "--store", ":memory:", "--audit", ":memory:"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True)
    variables = dict(process.stdout.readline().strip().split("=", 1) for _ in range(4))
    line = ""
    while "intercepting on" not in line:
        line = process.stderr.readline()
        if not line:
            raise RuntimeError("toolkeeper intercept did not start")
    threading.Thread(target=lambda: [None for _ in process.stderr], daemon=True).start()
    found = re.search(r"pid (\d+)\); toolkeeper on (http://127\.0\.0\.1:\d+) \(pid (\d+)\)", line)
    return process, variables, found.group(2), [int(found.group(1)), int(found.group(3))]


def run(quick: bool) -> None:
    count = 60 if quick else 400
    mock_port = overhead.free_port()
    mock = subprocess.Popen([sys.executable, str(HERE / "overhead.py"), "--serve-mock", str(mock_port)])
    mock_url = f"http://127.0.0.1:{mock_port}/v1"
    process, variables, toolkeeper, pids = start(Path(tempfile.mkdtemp(prefix="tk-bench-intercept-")), mock_url)
    try:
        cores = sorted(os.sched_getaffinity(0))
        if len(cores) > 1:
            for pid in pids:
                os.sched_setaffinity(pid, {cores[-1]})
            os.sched_setaffinity(0, set(cores[:-1]))
            os.sched_setaffinity(mock.pid, set(cores[:-1]))
        proxy_port = int(variables["HTTPS_PROXY"].rsplit(":", 1)[1])
        trust = ssl.create_default_context(cafile=variables["SSL_CERT_FILE"])

        def through() -> http.client.HTTPSConnection:
            connection = http.client.HTTPSConnection("127.0.0.1", proxy_port, context=trust, timeout=30)
            connection.set_tunnel("api.bench.test", 443)
            return connection

        def direct(port: int):
            return lambda: http.client.HTTPConnection("127.0.0.1", port, timeout=30)

        to_mock, to_toolkeeper = direct(mock_port), direct(int(toolkeeper.rsplit(":", 1)[1]))
        median_ms(through, "/v1/chat/completions", 20, False)  # warm both paths
        rows = []
        for fresh in (False, True):
            floor = median_ms(to_mock, "/v1/chat/completions", count, fresh)
            straight = median_ms(to_toolkeeper, "/v1/chat/completions", count, fresh)
            proxied = median_ms(through, "/v1/chat/completions", count, fresh)
            rows.append(("new connection each" if fresh else "kept connection", floor, straight, proxied))
        print(f"chat completion, no declared call, {count} sequential requests each, median ms\n")
        print(f"{'':<22}{'model alone':>12}{'toolkeeper':>12}{'intercepted':>13}{'added':>9}{'ratio':>8}")
        for name, floor, straight, proxied in rows:
            print(f"{name:<22}{floor:>12.2f}{straight:>12.2f}{proxied:>13.2f}{proxied - straight:>9.2f}"
                  f"{proxied / straight:>7.2f}x")
        kept, fresh = rows
        handshake = fresh[3] - kept[3] - (fresh[2] - kept[2])
        print(f"\nthe CONNECT and TLS handshake of a new connection: {handshake:.2f} ms beyond a new plain "
              "connection to toolkeeper")
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(30)
        mock.terminate()
        mock.wait(10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    os.environ.setdefault("TOOLKEEPER_MITMPROXY_ENV", str(ROOT / ".mitmproxy-env"))
    run(parser.parse_args().quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
