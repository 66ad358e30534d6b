"""An OPA stand-in for the tests: OPA's Data API, evaluating real Rego in process.

No OPA binary can be installed on these machines, so this server answers
`POST /v1/data/<path>` as OPA does (`{"result": ..., "decision_id": ...}`, no
`result` when the rule is undefined, `provenance` on request) by evaluating the
policies of a folder (its *.rego but the *_test.rego) with regorus. A control
endpoint switches it into the faults toolkeeper must survive:

    POST /_mode {"mode": "normal" | "undefined" | "error" | "slow" | "garbage"}

    python tests/opa_server.py --policies policies [--port 0]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import uuid
from pathlib import Path

import hobofan_regorus as regorus
from aiohttp import web


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--policies", required=True)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
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


if __name__ == "__main__":
    main()
