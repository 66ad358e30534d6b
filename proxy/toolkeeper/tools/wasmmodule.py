"""WebAssembly modules compiled once: at load, to refuse a broken `wasm:` entry, and for every call after.

The compiled modules belong to one wasmtime engine, configured for the limits
the wasm runner enforces (epoch interruption for wall time, fuel for an
instruction budget); the runner instantiates them on that same engine. A
module is compiled again only when its file changes.
"""

from __future__ import annotations

import threading
from pathlib import Path

import wasmtime


class WasmModuleError(Exception):
    """The module file cannot be used (found at load, or when the file changed)."""


class ModuleCache:
    def __init__(self) -> None:
        config = wasmtime.Config()
        config.epoch_interruption = True
        config.consume_fuel = True
        self.engine = wasmtime.Engine(config)
        self._modules: dict[Path, tuple[tuple[int, int], wasmtime.Module]] = {}
        self._lock = threading.Lock()

    def module(self, path: Path) -> wasmtime.Module:
        """The compiled module, compiled again only when the file changed."""
        try:
            stat = path.stat()
        except OSError as exc:
            raise WasmModuleError(f"{path}: {exc.strerror or exc}") from exc
        version = (stat.st_mtime_ns, stat.st_size)
        with self._lock:
            cached = self._modules.get(path)
            if cached and cached[0] == version:
                return cached[1]
        try:
            module = wasmtime.Module.from_file(self.engine, str(path))
        except (wasmtime.WasmtimeError, OSError) as exc:
            raise WasmModuleError(f"{path} does not compile: {exc}") from exc
        exports = {export.name for export in module.exports}
        if "_start" not in exports:
            raise WasmModuleError(f"{path} exports no `_start`: it must be a WASI command module")
        with self._lock:
            self._modules[path] = (version, module)
        return module


_shared: ModuleCache | None = None
_shared_lock = threading.Lock()


def compiled_modules() -> ModuleCache:
    """One cache per process: modules compiled when the agent file loads are reused by every call."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = ModuleCache()
        return _shared
