"""The architecture, checked: each layer imports only what it may, through facades, with no circle.

Read from the source with `ast`, so a lazy import inside a function counts too.

    wire/     HTTP: adapters, upstream, admin API, pages    may use engine, policy, audit, tools
      apis/{chat,responses,messages}/   one room per API: none imports another's; all share apis/base, relay
      admin/, intercept/                never an API's room; intercept/routing.py and the addon: no toolkeeper
      upstream.py, errors.py, sse.py    the generic client: no API's room
    engine/   the tool loop, one declared call, history     never wire, never aiohttp
    tools/    the declaration                               nothing of runners, policy, engine, audit, wire
    runners/  argv, wasm                                    never decides (policy), records (audit) or
                                                            knows the turn (engine)
    policy/   decisions, rules, OPA, consent, approvals     never aiohttp, never the engine
    audit/    the record and the trail                      nothing else of toolkeeper
    store/    history, links, retry memo, approvals (SQL)   nothing else of toolkeeper
    scripted/ the scripted model (a dev tool)               nothing else of toolkeeper, and nothing but cli/ uses it
    common (strict), database, settings, metrics, tracing: leaves every layer may use; app.py and cli/ compose them all.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "proxy" / "toolkeeper"
LAYERS = ("wire", "engine", "tools", "runners", "policy", "identity", "audit", "store", "cli", "scripted")
LEAVES = ("toolkeeper.common", "toolkeeper.strict", "toolkeeper.database", "toolkeeper.settings", "toolkeeper.metrics",
          "toolkeeper.tracing")
FORBIDDEN = {
    "engine": {"toolkeeper.wire", "toolkeeper.cli", "toolkeeper.app", "aiohttp"},
    "tools": {"toolkeeper.runners", "toolkeeper.policy", "toolkeeper.engine", "toolkeeper.audit",
              "toolkeeper.wire", "toolkeeper.cli", "toolkeeper.app"},
    "runners": {"toolkeeper.policy", "toolkeeper.audit", "toolkeeper.engine", "toolkeeper.wire",
                "toolkeeper.cli", "toolkeeper.app"},
    "policy": {"toolkeeper.engine", "toolkeeper.wire", "toolkeeper.cli", "toolkeeper.app", "aiohttp"},
    "audit": {"toolkeeper.wire", "toolkeeper.engine", "toolkeeper.tools", "toolkeeper.runners",
              "toolkeeper.policy", "toolkeeper.store", "toolkeeper.cli", "toolkeeper.app", "toolkeeper.metrics",
              "toolkeeper.tracing", "toolkeeper.settings"},
    "store": {"toolkeeper.wire", "toolkeeper.engine", "toolkeeper.tools", "toolkeeper.runners",
              "toolkeeper.policy", "toolkeeper.audit", "toolkeeper.cli", "toolkeeper.app", "toolkeeper.metrics",
              "toolkeeper.tracing", "toolkeeper.settings"},
    "wire": {"toolkeeper.runners", "toolkeeper.cli", "toolkeeper.app", "toolkeeper.scripted"},
    # who calls: it checks tokens and sign-ins for the wire, and knows nothing of what the calls then do
    "identity": {"toolkeeper.wire", "toolkeeper.engine", "toolkeeper.tools", "toolkeeper.runners",
                 "toolkeeper.policy", "toolkeeper.audit", "toolkeeper.store", "toolkeeper.cli", "toolkeeper.app"},
}
for _layer in ("engine", "tools", "runners", "policy", "identity", "audit", "store"):
    FORBIDDEN[_layer].add("toolkeeper.scripted")
FORBIDDEN["scripted"] = {f"toolkeeper.{name}" for name in LAYERS if name != "scripted"} | set(LEAVES) | {
    "toolkeeper.app"}
API_ROOMS = ("chat", "responses", "messages")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports(path: Path) -> set[str]:
    """The modules a file imports; `from package import module` names the module."""
    known = modules() if path != PACKAGE else {}
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                names.add(submodule if submodule in known else node.module)
    return names


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def test_no_layer_imports_what_it_must_not():
    broken = []
    for module, path in modules().items():
        forbidden = FORBIDDEN.get(layer(module) or "", set())
        for name in imports(path):
            if any(name == bad or name.startswith(bad + ".") for bad in forbidden):
                broken.append(f"{module} imports {name}")
    assert not broken


def test_other_layers_are_reached_through_their_facade():
    broken = []
    for module, path in modules().items():
        for name in imports(path):
            target = layer(name)
            if target and target != layer(module) and name != f"toolkeeper.{target}":
                broken.append(f"{module} imports {name}, not the facade toolkeeper.{target}")
    assert not broken


@pytest.mark.parametrize("kept", ["audit", "store"])
def test_what_is_kept_imports_nothing_of_toolkeeper_but_its_leaves(kept):
    for module, path in modules().items():
        if layer(module) == kept:
            mine = {name for name in imports(path) if name.startswith("toolkeeper")}
            assert mine <= {"toolkeeper.common", "toolkeeper.database"} | {m for m in modules()
                                                                           if layer(m) == kept}, module


def test_no_import_circle():
    graph = {module: {name for name in imports(path) if name in modules() and name != module}
             for module, path in modules().items()}
    done: set[str] = set()

    def visit(module: str, trail: list[str]) -> None:
        if module in trail:
            raise AssertionError("import circle: " + " -> ".join([*trail[trail.index(module):], module]))
        if module in done:
            return
        for name in sorted(graph[module]):
            visit(name, [*trail, module])
        done.add(module)

    for module in graph:
        visit(module, [])


def test_each_api_room_keeps_to_itself():
    """An API's room may use the shared adapter parts, never another API's room (the facade gathers them)."""
    broken = []
    for module, path in modules().items():
        room = _api_room(module)
        if module == "toolkeeper.wire.apis":
            continue
        for name in imports(path):
            other = _api_room(name)
            if other and other != room:
                broken.append(f"{module} imports {name}")
    assert not broken


def test_the_generic_rooms_of_wire_know_no_api():
    """The upstream client, the error shapes, admin and interception serve every API and know none."""
    broken = []
    for module, path in modules().items():
        if module.startswith(("toolkeeper.wire.admin", "toolkeeper.wire.intercept")) or module in (
                "toolkeeper.wire.upstream", "toolkeeper.wire.errors", "toolkeeper.wire.sse", "toolkeeper.wire.guard"):
            broken += [f"{module} imports {name}" for name in imports(path) if name.startswith("toolkeeper.wire.apis")]
    assert not broken


def test_what_the_mitmproxy_addon_runs_imports_nothing_of_toolkeeper():
    """The addon runs in mitmproxy's own environment: it and the routing it shares with toolkeeper use the
    standard library (and mitmproxy) alone."""
    folder = PACKAGE / "wire" / "intercept"
    assert imports(folder / "routing.py") <= {"__future__", "hashlib", "hmac", "re"}
    assert not {name for name in imports(folder / "addon.py") if name.startswith("toolkeeper")}
    assert "routing" in imports(folder / "addon.py")


def _api_room(module: str) -> str | None:
    parts = module.split(".")
    return parts[3] if parts[:3] == ["toolkeeper", "wire", "apis"] and len(parts) > 3 and parts[3] in API_ROOMS \
        else None


def test_modules_and_functions_stay_readable():
    too_long = []
    for module, path in modules().items():
        text = path.read_text()
        if text.count("\n") > MAX_MODULE_LINES:
            too_long.append(f"{module}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_long.append(f"{module}.{node.name}: {length} lines")
    assert not too_long


@pytest.mark.parametrize("facade", [f"toolkeeper.{name}" for name in LAYERS if name != "cli"])
def test_each_facade_exports_a_sorted_all_that_resolves(facade):
    package = importlib.import_module(facade)
    exported = package.__all__
    assert list(exported) == sorted(exported, key=lambda n: (not n.isupper(), not n[:1].isupper(), n))
    for name in exported:
        assert getattr(package, name) is not None, f"{facade}.{name}"
    lazy = getattr(package, "_HOME_OF", None)  # a facade that imports each name when first used
    assert lazy is None or set(lazy) == set(exported)
