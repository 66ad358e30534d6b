"""What checking an agent's JWT adds to a request, against a static key and a direct connection, in one run.

An issuer (a discovery document and its keys, served by this script: what is
measured is toolkeeper's check, not a provider) signs an RS256 token; one
toolkeeper serves agents by a listed static key and by that issuer's JWTs.
Measured, interleaved in rounds so the machine's noise falls on all three:

- direct: the model server (bench/overhead.py's) without toolkeeper;
- static key: through toolkeeper, the agent's key looked up by its SHA-256;
- JWT: through toolkeeper, the token checked (signature, issuer, audience,
  expiry) with the issuer's keys cached, as every request after the first is.

It prints p50/p99 of each, the ratios to direct, and what the JWT check adds
over the static key; and, in this process, the check alone (µs per token).
toolkeeper is pinned to its own core, the rest to the other (`--no-pin` not).

    python bench/identity.py            # 5 rounds of 400 requests
    python bench/identity.py --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import jwt
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric import rsa

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import overhead  # noqa: E402

ROOT = HERE.parent
AUDIENCE = "toolkeeper-bench"
STATIC_KEY = "bench-static-agent-key-0123456789"
BODY = {"model": "bench", "messages": [{"role": "user", "content": "hello"}]}


def serve_issuer(port: int, public_jwk: dict) -> None:
    issuer = f"http://127.0.0.1:{port}"

    async def discovery(request: web.Request) -> web.Response:
        return web.json_response({"issuer": issuer, "jwks_uri": issuer + "/jwks"})

    async def keys(request: web.Request) -> web.Response:
        return web.json_response({"keys": [public_jwk]})

    app = web.Application()
    app.router.add_get("/.well-known/openid-configuration", discovery)
    app.router.add_get("/jwks", keys)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


def signing_key() -> tuple[rsa.RSAPrivateKey, dict]:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = jwt.algorithms.RSAAlgorithm.to_jwk(private.public_key(), as_dict=True)
    return private, {**public, "kid": "bench", "alg": "RS256", "use": "sig"}


def token(private: rsa.RSAPrivateKey, issuer: str) -> str:
    now = int(time.time())
    claims = {"iss": issuer, "aud": AUDIENCE, "sub": "ada", "client_id": "bench-agent", "groups": ["platform"],
              "iat": now, "exp": now + 3600}
    return jwt.encode(claims, private, algorithm="RS256", headers={"kid": "bench"})


async def latencies(url: str, key: str, count: int, tag: str = "") -> list[float]:
    """Sequential requests on a kept connection, each a little different (identical ones read as retries); `tag`
    makes them differ from another run's too (a conversation toolkeeper has seen has a session)."""
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    times = []
    async with aiohttp.ClientSession(headers=headers) as session:
        for index in range(count + 20):
            body = {**BODY, "messages": [{"role": "user", "content": f"hello {tag} #{index}"}]}
            started = time.perf_counter()
            async with session.post(url + "/chat/completions", json=body) as response:
                await response.read()
                assert response.status == 200, (response.status, await response.text())
            if index >= 20:  # the first ones warm the connection and the caches
                times.append(time.perf_counter() - started)
    return times


async def until_served(root: str) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(300):
            try:
                async with session.get(root + "/healthz") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"toolkeeper at {root} did not start")


async def check_alone(issuer: str, signed: str, count: int) -> tuple[float, float]:
    """The check in this process, keys cached: seconds per token checked in full (a token first seen), and per
    token seen before (remembered until it expires), each the median of five runs."""
    from toolkeeper.identity import Issuer, TokenChecker

    checker = TokenChecker(Issuer(issuer), (AUDIENCE,))
    await checker.principal(signed)
    figures = []
    for check in (checker.claims, checker.principal):
        runs = []
        for _ in range(5):
            started = time.perf_counter()
            for _ in range(count):
                await check(signed)
            runs.append((time.perf_counter() - started) / count)
        figures.append(statistics.median(runs))
    await checker.issuer.close()
    return figures[0], figures[1]


def start_processes(workdir: Path, public_jwk: dict) -> tuple[list, str, str, str]:
    mock_port, issuer_port, port = overhead.free_port(), overhead.free_port(), overhead.free_port()
    helpers = [multiprocessing.Process(target=overhead.serve_mock, args=(mock_port,), daemon=True),
               multiprocessing.Process(target=serve_issuer, args=(issuer_port, public_jwk), daemon=True)]
    for process in helpers:
        process.start()
    issuer = f"http://127.0.0.1:{issuer_port}"
    digest = hashlib.sha256(STATIC_KEY.encode()).hexdigest()
    (workdir / "agent.yaml").write_text(f"upstream: http://127.0.0.1:{mock_port}/v1\nagents:\n"
                                        f"  - name: static\n    key_sha256: {digest}\n")
    server = subprocess.Popen([sys.executable, "-m", "toolkeeper", "serve", str(workdir / "agent.yaml"),
                               "--port", str(port), "--log-level", "ERROR", "--policy", "none",
                               "--auth-agents-jwt-issuer", issuer, "--auth-agents-jwt-audience", AUDIENCE],
                              cwd=ROOT, stdout=subprocess.DEVNULL)
    return [*helpers, server], issuer, f"http://127.0.0.1:{mock_port}/v1", f"http://127.0.0.1:{port}/v1"


def pin(server: subprocess.Popen) -> None:
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) > 1:
        os.sched_setaffinity(server.pid, {cores[-1]})
        os.sched_setaffinity(0, set(cores[:-1]))


def ms(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] * 1e3


async def run(quick: bool, pinned: bool) -> None:
    rounds, count = (2, 100) if quick else (5, 400)
    private, public_jwk = signing_key()
    processes, issuer, direct, proxied = start_processes(Path(tempfile.mkdtemp(prefix="tk-bench-identity-")),
                                                         public_jwk)
    try:
        if pinned:
            pin(processes[-1])
        signed = token(private, issuer)
        await overhead.wait_ready(direct)
        await until_served(proxied.removesuffix("/v1"))
        results: dict[str, list[float]] = {"direct": [], "static key": [], "JWT": []}
        for _ in range(rounds):
            results["direct"] += await latencies(direct, "unused", count)
            results["static key"] += await latencies(proxied, STATIC_KEY, count)
            results["JWT"] += await latencies(proxied, signed, count)
        floor = statistics.median(results["direct"])
        print(f"{rounds} rounds of {count} sequential requests each, interleaved\n")
        print(f"{'path':<12}{'p50 ms':>9}{'p99 ms':>9}{'p50 / direct':>14}")
        for name, values in results.items():
            print(f"{name:<12}{ms(values, 0.5):>9.3f}{ms(values, 0.99):>9.3f}"
                  f"{statistics.median(values) / floor:>14.2f}")
        added = (statistics.median(results["JWT"]) - statistics.median(results["static key"])) * 1e6
        print(f"\nthe JWT check adds {added:.0f} µs at p50 over a static key (keys cached)")
        full, remembered = await check_alone(issuer, signed, 200 if quick else 2000)
        print(f"the check alone, in process: {full * 1e6:.0f} µs for a token first seen (RS256, 2048-bit key), "
              f"{remembered * 1e6:.1f} µs for one seen before")
    finally:
        for process in processes:
            process.terminate()  # a multiprocessing.Process and a Popen both have it


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    parser.add_argument("--no-pin", action="store_true", help="leave the processes on any core")
    arguments = parser.parse_args()
    asyncio.run(run(arguments.quick, not arguments.no_pin))
    return 0


if __name__ == "__main__":
    sys.exit(main())
