"""An MCP server that needs OAuth, for the tests of toolkeeper's MCP servers with `auth:`: the official SDK's server
over Streamable HTTP, behind a check of each request's bearer token against the test provider's keys, for this
server's own audience (its URL) alone, as a resource server does.

    python oauth_server.py --port PORT --issuer ISSUER --log FILE

Each request it accepts adds a line to FILE: the SHA-256 of the token it came with and the claims that say who
made it and for whom (aud, sub, client_id, act). Its tool `whoami` answers the same of its own request. A request
without a good token is answered 401, as the MCP authorization specification says.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import sys
import urllib.request

import jwt
import mcp_types as types
import uvicorn
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

SHOWN = ("aud", "sub", "client_id", "act", "scope")


def options() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--issuer", required=True)
    parser.add_argument("--log", required=True)
    return parser.parse_args()


ARGS = options()
RESOURCE = f"http://127.0.0.1:{ARGS.port}/mcp"
with urllib.request.urlopen(ARGS.issuer + "/.well-known/openid-configuration", timeout=10) as answer:
    KEYS = jwt.PyJWKClient(json.loads(answer.read())["jwks_uri"], cache_keys=True)


def checked(token: str) -> dict:
    key = KEYS.get_signing_key_from_jwt(token).key
    return jwt.decode(token, key, algorithms=["RS256", "ES256"], audience=RESOURCE, issuer=ARGS.issuer)


def seen(token: str, claims: dict) -> dict:
    return {"token_sha256": hashlib.sha256(token.encode()).hexdigest(),
            **{name: claims[name] for name in SHOWN if name in claims}}


async def list_tools(ctx, params) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[types.Tool(
        name="whoami", description="Say who the request that called it was made by, and for whom.",
        input_schema={"type": "object", "properties": {}})])


async def call_tool(ctx, params) -> types.CallToolResult:
    token = ctx.request.headers["authorization"][7:]
    return types.CallToolResult(content=[types.TextContent(text=json.dumps(seen(token, checked(token))))])


SERVER = Server("oauth-notes", on_list_tools=list_tools, on_call_tool=call_tool)
MANAGER = StreamableHTTPSessionManager(app=SERVER)


class Guarded:
    """The MCP endpoint behind the bearer check."""

    async def __call__(self, scope, receive, send) -> None:
        headers = {name.decode().lower(): value.decode() for name, value in scope["headers"]}
        authorization = headers.get("authorization", "")
        try:
            if not authorization.lower().startswith("bearer "):
                raise jwt.InvalidTokenError("no bearer token")
            claims = checked(authorization[7:])
        except jwt.PyJWTError as exc:
            challenge = f'Bearer error="invalid_token", error_description="{type(exc).__name__}"'
            await JSONResponse({"error": "invalid_token"}, status_code=401,
                               headers={"WWW-Authenticate": challenge})(scope, receive, send)
            return
        with open(ARGS.log, "a") as log:
            log.write(json.dumps(seen(authorization[7:], claims)) + "\n")
        await MANAGER.handle_request(scope, receive, send)


@contextlib.asynccontextmanager
async def lifespan(app):
    async with MANAGER.run():
        print(f"oauth server listening on {RESOURCE}", flush=True)
        yield


app = Starlette(routes=[Route("/mcp", Guarded(), methods=["GET", "POST", "DELETE"])], lifespan=lifespan)

if __name__ == "__main__":
    print("oauth server starting", file=sys.stderr)
    uvicorn.run(app, host="127.0.0.1", port=ARGS.port, log_level="warning")
