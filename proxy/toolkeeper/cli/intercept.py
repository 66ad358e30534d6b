"""`toolkeeper intercept`: toolkeeper for agents that cannot change their base URL, through mitmproxy.

    toolkeeper intercept AGENT_FILE [--port 8080] [--route HOST[/PATH]=API] [--map HOST=URL] [-- SERVE OPTIONS]

It starts toolkeeper on a free loopback port and mitmdump (explicit proxy
mode, on loopback) with toolkeeper's addon (wire/intercept/addon.py), waits
until both answer, then prints the variables an agent needs, one NAME=VALUE
line each. Model requests to the routed hosts and paths go through toolkeeper
(the same declared tools, policies and audit), to their original server or
where `--map` sends them; every other host is tunnelled untouched. SIGTERM or
Ctrl-C stops both; a toolkeeper that dies is started again (meanwhile the
agent gets a 502 in its API's shape).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import re
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from toolkeeper.cli import mitmenv
from toolkeeper.cli.workers import reserve_port
from toolkeeper.wire import ADDON, ENDPOINTS, HOST_NAME

# host, exact path (None: any path ending in the API's endpoint), API
DEFAULT_ROUTES = (
    ("api.openai.com", None, "chat"), ("api.openai.com", None, "responses"),
    ("api.anthropic.com", None, "messages"),
    ("*.openai.azure.com", None, "chat"), ("*.openai.azure.com", None, "responses"),
    ("chatgpt.com", "/backend-api/codex/responses", "responses"),
)
VARIABLES = ("HTTPS_PROXY", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS")
BUNDLE = "toolkeeper-ca-bundle.pem"
MAX_RESTARTS = 5  # toolkeeper dying more often than this within RESTART_WINDOW stops everything: say so
RESTART_WINDOW = 60.0
PR_SET_PDEATHSIG = 1


class Refused(Exception):
    """What stops `intercept` at start: the message says what to change."""


class Stopped(Exception):
    """A signal to stop came while starting."""


@dataclass
class Plan:
    routes: list[tuple[str, str | None, str]]
    maps: dict[str, str]

    def origins(self) -> list[str]:
        """Where toolkeeper may forward a signed request: the routed hosts, the mapped URLs."""
        hosts = {host for host, _, _ in self.routes if host not in self.maps}
        return sorted({f"https://{host}" for host in hosts} |
                      {f"{urlsplit(url).scheme}://{urlsplit(url).netloc}" for url in self.maps.values()})

    def allow_hosts(self) -> list[str]:
        """mitmproxy's --allow-hosts: only these are intercepted (host:port); every other host is tunnelled."""
        hosts = {host for host, _, _ in self.routes} | set(self.maps)
        return [("^(?:[a-z0-9-]+\\.)+" + re.escape(host[2:]) if host.startswith("*.") else "^" + re.escape(host))
                + ":\\d+$" for host in sorted(hosts)]


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("intercept", help="toolkeeper for an agent that cannot change its base URL: an "
                                 "HTTPS proxy (mitmproxy) that re-routes its model requests through toolkeeper",
                                 epilog="After --, options for the toolkeeper it starts, as for serve: toolkeeper "
                                 "intercept agent.yaml --port 8080 -- --policy rules.yaml --consent approvals")
    parser.add_argument("agent_file", nargs="?", help="the agent file (declared tools), as for serve (or "
                        "`agent_file:` in the config file of serve's options, or $TOOLKEEPER_AGENT_FILE)")
    parser.add_argument("--port", type=int, default=8080, help="the proxy's port, on 127.0.0.1 (default 8080)")
    parser.add_argument("--route", action="append", default=[], metavar="HOST[/PATH]=API",
                        help="also route this host (and path) through toolkeeper, speaking API: chat, responses or "
                        "messages; HOST may start with *. (repeatable)")
    parser.add_argument("--map", action="append", default=[], metavar="HOST=URL",
                        help="route HOST, and send all of its traffic to URL, which stands for https://HOST/v1 "
                        "(a local model server; repeatable)")
    parser.add_argument("--export", action="store_true", help="print `export NAME=VALUE` lines, for eval")
    parser.add_argument("--confdir", help="where mitmproxy's CA lives (default ~/.mitmproxy)")
    parser.add_argument("--prepare", action="store_true",
                        help=f"only make mitmproxy's environment (${mitmenv.ENV_VARIABLE}) and say which, then exit")
    # after `--` (cli/__init__.py): options for the toolkeeper it starts (--policy, --consent, --audit ...)
    parser.set_defaults(run=run, serve_options=[])


def plan_of(routes: list[str], maps: list[str]) -> Plan:
    """The routes and maps, checked: an unknown API, a path that is not its endpoint, a URL that is not http(s)."""
    plan = Plan(list(DEFAULT_ROUTES), {})
    for given in routes:
        where, _, api = given.rpartition("=")
        host, slash, path = where.partition("/")
        if api not in ENDPOINTS or not HOST_NAME.fullmatch(host.lower().removeprefix("*.")):
            raise Refused(f"--route {given}: give HOST[/PATH]=API (a host name, no port; it may start with *.), "
                          f"API one of {', '.join(ENDPOINTS)}")
        if slash and not ("/" + path).endswith(ENDPOINTS[api]):
            raise Refused(f"--route {given}: a {api} path ends with {ENDPOINTS[api]}")
        plan.routes.append((host.lower(), "/" + path if slash else None, api))
    for given in maps:
        host, _, url = given.partition("=")
        if not HOST_NAME.fullmatch(host.lower()) or urlsplit(url).scheme not in ("http", "https") or not urlsplit(
                url).netloc:
            raise Refused(f"--map {given}: give HOST=URL, HOST one host name (no port, no *), the URL http(s)://...")
        plan.maps[host.lower()] = url.rstrip("/")
        plan.routes += [(host.lower(), None, api) for api in ENDPOINTS]
    return plan


def run(args: argparse.Namespace) -> int:
    try:
        if args.prepare:
            mitmdump, what = mitmenv.mitmdump(say=lambda line: print(line, file=sys.stderr))
            print(f"{what}: {mitmdump}")
            return 0
        if not (args.agent_file or serve_finds_its_agent_file(args.serve_options)):
            raise Refused("give the agent file: toolkeeper intercept AGENT_FILE (or `-- --config FILE` naming it)")
        plan = plan_of(args.route, args.map)
        confdir = writable_confdir(args.confdir)
        port_is_free(args.port)
        mitmdump, what = mitmenv.mitmdump(say=lambda line: print(line, file=sys.stderr))
    except (Refused, mitmenv.EnvironmentProblem) as exc:
        print(f"toolkeeper: {exc}", file=sys.stderr)
        return 2
    return Interception(args.agent_file, plan, confdir, args.port, mitmdump, what, args.serve_options).run(args.export)


def serve_finds_its_agent_file(serve_options: list[str]) -> bool:
    """Whether the serve it starts may name its agent file itself: from its options or the environment."""
    named = any(option.startswith(("--config", "--agent-file")) for option in serve_options)
    return named or bool(os.environ.get("TOOLKEEPER_AGENT_FILE") or os.environ.get("TOOLKEEPER_CONFIG"))


def writable_confdir(given: str | None) -> Path:
    confdir = Path(given or Path.home() / ".mitmproxy")
    try:
        confdir.mkdir(parents=True, exist_ok=True)
        probe = confdir / ".toolkeeper-probe"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise Refused(f"cannot write mitmproxy's CA in {confdir}: {exc.strerror or exc} (--confdir elsewhere)"
                      ) from None
    return confdir


def port_is_free(port: int) -> None:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            raise Refused(f"cannot listen on 127.0.0.1:{port}: {exc.strerror or exc} (--port another)") from None


def trust_store() -> str:
    """The CAs a client trusts today: its SSL_CERT_FILE if set, else the system's bundle."""
    paths = ssl.get_default_verify_paths()
    for candidate in (os.environ.get("SSL_CERT_FILE"), paths.cafile, paths.openssl_cafile,
                      "/etc/ssl/certs/ca-certificates.crt"):
        # never the bundle an earlier run printed: it trusts mitmproxy's own CA
        if candidate and Path(candidate).is_file() and Path(candidate).name != BUNDLE:
            return candidate
    raise Refused("no system CA bundle found: set SSL_CERT_FILE to the CAs your clients trust")


def wait_for_port(port: int, process: subprocess.Popen, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise Refused(f"{what} stopped as it started (exit {process.returncode})")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise Refused(f"{what} did not listen on 127.0.0.1:{port} within {timeout:g} s")


class Interception:
    """The two processes, started, watched and stopped together."""

    def __init__(self, agent_file: str | None, plan: Plan, confdir: Path, port: int, mitmdump: Path, what: str,
                 serve_options: list[str]):
        self.agent_file, self.plan, self.confdir, self.port = agent_file, plan, confdir, port
        self.mitmdump, self.what, self.serve_options = mitmdump, what, serve_options
        self.secret = secrets.token_hex(32)
        # toolkeeper's port, held for the whole run (bound, never listening): a toolkeeper started again gets it
        # back, and no other user's process can take it meanwhile and receive the agents' keys
        self.reserved = reserve_port("127.0.0.1", 0, shared_address=False)
        self.toolkeeper_port = self.reserved.getsockname()[1]
        self.toolkeeper: subprocess.Popen | None = None
        self.proxy: subprocess.Popen | None = None
        self.stopping = threading.Event()
        self.watching = False

    def start_toolkeeper(self) -> int:
        """toolkeeper on the reserved loopback port, told the secret and the origins it may forward to: its port."""
        env = {**_child_environment(), "TOOLKEEPER_INTERCEPT_SECRET": self.secret,
               "TOOLKEEPER_INTERCEPT_UPSTREAMS": ",".join(self.plan.origins()), "TOOLKEEPER_REUSE_PORT": "1"}
        agent_file = [self.agent_file] if self.agent_file else []  # else serve's config or environment names it
        self.toolkeeper = _start([sys.executable, "-m", "toolkeeper", "serve", *agent_file, *self.serve_options,
                                  "--host", "127.0.0.1", "--port", str(self.toolkeeper_port), "--workers", "1"], env,
                                 stdout=subprocess.PIPE)
        if "listening on" not in _first_line(self.toolkeeper, 60):
            _stop([self.toolkeeper])
            raise Refused(f"toolkeeper did not start (exit {self.toolkeeper.returncode}): see its message above")
        threading.Thread(target=_copy, args=(self.toolkeeper.stdout,), daemon=True).start()
        return self.toolkeeper_port

    def start_proxy(self, toolkeeper_port: int) -> None:
        config = self.confdir / f"toolkeeper-intercept-{self.port}.json"  # one per proxy sharing the confdir
        config.write_text(json.dumps({"toolkeeper": f"http://127.0.0.1:{toolkeeper_port}",
                                      "routes": self.plan.routes, "maps": self.plan.maps}))
        config.chmod(0o600)
        env = {**_child_environment(), "TOOLKEEPER_INTERCEPT_CONFIG": str(config),
               "TOOLKEEPER_INTERCEPT_SECRET": self.secret}
        hosts = [argument for pattern in self.plan.allow_hosts() for argument in ("--allow-hosts", pattern)]
        self.proxy = _start(
            [str(self.mitmdump), "--mode", "regular", "--listen-host", "127.0.0.1", "--listen-port", str(self.port),
             "--set", f"confdir={self.confdir}", "--set", "connection_strategy=lazy",
             "--set", f"ssl_verify_upstream_trusted_ca={trust_store()}", "--set", "termlog_verbosity=warn",
             "--set", "flow_detail=0", *hosts, "-s", str(ADDON)], env, stdout=sys.stderr)
        wait_for_port(self.port, self.proxy, "mitmdump")

    def variables(self) -> dict[str, str]:
        """What an agent needs: the proxy, and trust in its CA (a bundle with the system's CAs for Python)."""
        ca = self.confdir / "mitmproxy-ca-cert.pem"
        if not ca.is_file():
            raise Refused(f"mitmproxy did not write its CA in {self.confdir}")
        bundle = self.confdir / BUNDLE
        bundle.write_text(Path(trust_store()).read_text() + "\n" + ca.read_text())
        return dict(zip(VARIABLES, (f"http://127.0.0.1:{self.port}", str(bundle), str(bundle), str(ca)),
                        strict=True))

    def run(self, export: bool) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.on_signal)
        signal.signal(signal.SIGHUP, self.on_reload)
        try:
            self.start_proxy(self.start_toolkeeper())
            variables = self.variables()
            for name, value in variables.items():
                print(f"{'export ' if export else ''}{name}={value}", flush=True)
            print(f"toolkeeper: intercepting on 127.0.0.1:{self.port} ({self.what}, pid {self.proxy.pid}); "
                  f"toolkeeper on http://127.0.0.1:{self.toolkeeper_port} (pid {self.toolkeeper.pid})",
                  file=sys.stderr, flush=True)
            self.watching = True
            return self.watch()
        except Stopped:
            return 0
        except (Refused, OSError) as exc:
            print(f"toolkeeper: {exc}", file=sys.stderr)
            return 2
        finally:
            _stop([self.proxy, self.toolkeeper])
            self.reserved.close()

    def watch(self) -> int:
        """Until a signal: a toolkeeper that dies is started again; a mitmdump that dies stops everything."""
        deaths: list[float] = []
        while not self.stopping.wait(0.2):
            if self.proxy.poll() is not None:
                print(f"toolkeeper: mitmdump stopped (exit {self.proxy.returncode})", file=sys.stderr)
                return 1
            if self.toolkeeper.poll() is None:
                continue
            deaths = [t for t in deaths if t > time.monotonic() - RESTART_WINDOW] + [time.monotonic()]
            if len(deaths) > MAX_RESTARTS:
                raise Refused(f"toolkeeper stopped {len(deaths)} times within {RESTART_WINDOW:g} s: stopping")
            print(f"toolkeeper: toolkeeper stopped (exit {self.toolkeeper.returncode}); starting it again",
                  file=sys.stderr, flush=True)
            time.sleep(1)  # never a hot loop; meanwhile the agent gets a 502
            with contextlib.suppress(Refused):
                self.start_toolkeeper()
        return 0

    def on_signal(self, signum: int, frame: object) -> None:
        self.stopping.set()
        if not self.watching:  # still starting: stop at once (run's `finally` stops what has started)
            raise Stopped

    def on_reload(self, signum: int, frame: object) -> None:
        """SIGHUP: toolkeeper reads its agent file and rules again (as `serve` does)."""
        if self.toolkeeper is not None and self.toolkeeper.poll() is None:
            self.toolkeeper.send_signal(signal.SIGHUP)


def _child_environment() -> dict[str, str]:
    """This environment without any TOOLKEEPER_INTERCEPT_* of an earlier run (its secret would win)."""
    return {name: value for name, value in os.environ.items() if not name.startswith("TOOLKEEPER_INTERCEPT_")}


def _start(argv: list[str], env: dict[str, str], stdout) -> subprocess.Popen:
    """A child in a session of its own (stopped with its children), its stdin closed (consent goes through the
    approvals channel, not a terminal it shares with the shell), and SIGTERMed if this process dies."""
    return subprocess.Popen(argv, env=env, stdout=stdout, stdin=subprocess.DEVNULL, text=True,
                            start_new_session=True, preexec_fn=_die_with_parent)


def _libc_prctl():
    with contextlib.suppress(OSError, AttributeError):
        return ctypes.CDLL(None, use_errno=True).prctl
    return None


PRCTL = _libc_prctl()  # looked up here, before any fork: the child only calls it


def _die_with_parent() -> None:
    if PRCTL is not None:
        PRCTL(PR_SET_PDEATHSIG, signal.SIGTERM)


def _first_line(process: subprocess.Popen, timeout: float) -> str:
    """The child's first line of output, or "" when it says nothing within `timeout` seconds."""
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(process.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return lines[0] if lines else ""


def _stop(processes: list[subprocess.Popen | None]) -> None:
    """SIGTERM to each one's process group, SIGKILL past 10 s."""
    running = [p for p in processes if p is not None and p.poll() is None]
    for process in running:
        _signal_group(process, signal.SIGTERM)
    for process in running:
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            _signal_group(process, signal.SIGKILL)
            process.wait(5)


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signum)


def _copy(stream) -> None:
    for line in stream:
        sys.stderr.write(line)
