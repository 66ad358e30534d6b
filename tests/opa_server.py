"""An OPA stand-in for the tests and for offline use: OPA's Data API, evaluating real Rego in process.

No registry reachable here ships the OPA binary (docs/how-to/security-team.md, "OPA offline"), so this
server answers `POST /v1/data/<path>` as OPA does (`{"result": ..., "decision_id": ...}`, no `result` when
the rule is undefined, `provenance` on request) by evaluating the policies of a folder (its *.rego but the
*_test.rego) with regorus. A control endpoint switches it into the faults toolkeeper must survive:

    POST /_mode {"mode": "normal" | "undefined" | "error" | "slow" | "garbage"}

    python tests/opa_server.py --policies policies [--port 0]    # stands in for `opa run --server`
    python tests/opa_server.py --test policies                    # stands in for `opa test policies/`
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import re
import sys
import uuid
from pathlib import Path

import hobofan_regorus as regorus
from aiohttp import web


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--policies", help="serve the Data API on the *.rego of this folder")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--test", metavar="FOLDER", help="run the test_* rules of its *_test.rego, as `opa test`")
    args = parser.parse_args()
    if args.test:
        sys.exit(run_tests(Path(args.test)))
    if not args.policies:
        parser.error("give --policies FOLDER (serve) or --test FOLDER")
    files = sorted(p for p in Path(args.policies).glob("*.rego") if not p.name.endswith("_test.rego"))
    revision = hashlib.sha256(b"".join(p.read_bytes() for p in files)).hexdigest()[:12]
    state = {"mode": "normal"}

    def evaluate(path: str, document: dict) -> object:
        engine = regorus.Engine()
        for file in files:
            engine.add_policy(file.name, file.read_text())
        engine.set_input_json(json.dumps(document))
        try:
            return engine.eval_rule("data." + path.strip("/").replace("/", "."))
        except Exception:
            return None  # undefined

    async def data(request: web.Request) -> web.StreamResponse:
        mode = state["mode"]
        if mode == "slow":
            await asyncio.sleep(5)
        if mode == "error":
            return web.json_response({"code": "internal_error", "message": "the policy engine broke"}, status=500)
        if mode == "garbage":
            return web.Response(text="<html>not OPA</html>", content_type="text/html")
        body = await request.json()
        answer: dict = {"decision_id": str(uuid.uuid4())}
        result = None if mode == "undefined" else evaluate(request.match_info["path"], body.get("input") or {})
        if result is not None:
            answer["result"] = result
        if request.query.get("provenance") == "true":
            answer["provenance"] = {"version": "regorus-stand-in", "bundles": {"toolkeeper": {"revision": revision}}}
        return web.json_response(answer)

    async def set_mode(request: web.Request) -> web.Response:
        state["mode"] = (await request.json())["mode"]
        return web.json_response(state)

    async def run() -> None:
        app = web.Application()
        app.router.add_post("/v1/data/{path:.*}", data)
        app.router.add_post("/_mode", set_mode)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", args.port)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        print(f"OPA stand-in listening on http://127.0.0.1:{port}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(run())


TEST_RULE = re.compile(r"^(test_\w+)\b", re.M)
PACKAGE = re.compile(r"^package\s+([\w.]+)", re.M)


def run_tests(folder: Path) -> int:
    """Every `test_*` rule of the folder's *_test.rego, evaluated with all its Rego: PASS when it is true,
    FAIL when it is false or undefined (as `opa test` counts them); 1 when one fails."""
    files = sorted(folder.glob("*.rego"))
    engine = regorus.Engine()
    for file in files:
        engine.add_policy(file.name, file.read_text())
    passed = failed = 0
    for file in (file for file in files if file.name.endswith("_test.rego")):
        text = file.read_text()
        package = PACKAGE.search(text)
        for name in dict.fromkeys(TEST_RULE.findall(text)):  # a test may have several bodies: one verdict
            try:
                verdict = engine.eval_rule(f"data.{package.group(1)}.{name}") if package else None
            except Exception:
                verdict = None  # undefined: a failure
            ok = verdict is True
            passed, failed = passed + ok, failed + (not ok)
            print(f"{'PASS' if ok else 'FAIL'} {file.name}: data.{package.group(1) if package else '?'}.{name}")
    print(f"PASS: {passed}/{passed + failed}" if not failed else f"FAIL: {failed}/{passed + failed}")
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    main()
