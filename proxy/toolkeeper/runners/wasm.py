"""The wasm runner: a declared tool as a WASI command module, run in wasmtime.

The module starts from nothing: no file, no variable, no network. Its entry in
the agent file gives it its argv (the same template rules as argv tools), the
variables it names, and the folders it mounts (read-only unless `writable`);
that list is its whole world. A model's value cannot reach past it: `../x` or
a symlink out of a mount finds nothing.

Limits that hold against a hostile module: linear memory (store limits), wall
time (epoch interruption, driven by a ticker thread) and, optionally, fuel (an
instruction budget). A module that exceeds one is stopped and the call is
answered; it runs on a bounded thread pool, never on the event loop.

Modules are compiled by the declaration layer when the agent file loads
(`toolkeeper.tools.compiled_modules`) and recompiled when their file changes;
every call gets a fresh instance, so no state survives between calls.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
import wasmtime

from toolkeeper.runners.base import OutputBuffer, RunResult, declared_environment
from toolkeeper.runners.wasi import DeadlineReached, define_limits, set_deadline
from toolkeeper.tools import DeclaredTool, ModuleCache, WasmModuleError, compiled_modules

TICK = 0.005  # seconds between epoch ticks: the resolution of the wall-time limit
DEFAULT_MEMORY_MIB = 64
UNLIMITED_FUEL = 2**62

TRAP_WORDS = {
    wasmtime.TrapCode.UNREACHABLE: "it reached an `unreachable` instruction (the module crashed on purpose, "
                                   "as a panic or abort does)",
    wasmtime.TrapCode.MEMORY_OUT_OF_BOUNDS: "it accessed memory outside its bounds",
    wasmtime.TrapCode.STACK_OVERFLOW: "its call stack overflowed (runaway recursion)",
    wasmtime.TrapCode.INTEGER_DIVISION_BY_ZERO: "it divided an integer by zero",
    wasmtime.TrapCode.INTEGER_OVERFLOW: "an integer operation overflowed",
    wasmtime.TrapCode.BAD_CONVERSION_TO_INTEGER: "it converted an invalid number to an integer",
    wasmtime.TrapCode.INDIRECT_CALL_TO_NULL: "it called a null function pointer",
    wasmtime.TrapCode.BAD_SIGNATURE: "it called a function through a pointer of the wrong type",
    wasmtime.TrapCode.TABLE_OUT_OF_BOUNDS: "it accessed a table outside its bounds",
    wasmtime.TrapCode.HEAP_MISALIGNED: "it made a misaligned atomic memory access",
}


class _Ticker:
    """Advances the engine's epoch every TICK; a store's deadline is counted in ticks."""

    def __init__(self, engine: wasmtime.Engine):
        self.engine = engine
        self._started = False
        self._lock = threading.Lock()

    def ensure_started(self) -> None:
        with self._lock:
            if not self._started:
                threading.Thread(target=self._run, name="wasm-epoch", daemon=True).start()
                self._started = True

    def _run(self) -> None:
        while True:
            time.sleep(TICK)
            self.engine.increment_epoch()


class WasmRunner:
    # Threads, not cores: a module waiting in a (bounded) sleep holds its thread, and must not hold up others.
    def __init__(self, modules: ModuleCache, max_workers: int = 32):
        self.modules = modules
        self.engine = modules.engine
        self.linker = wasmtime.Linker(self.engine)
        self.linker.define_wasi()
        define_limits(self.linker)
        self.pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="wasm")
        self.ticker = _Ticker(self.engine)

    async def run(self, tool: DeclaredTool, argv: list[str], values: dict[str, Any]) -> RunResult:
        self.ticker.ensure_started()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool, self._run, tool, argv, values)

    def _run(self, tool: DeclaredTool, argv: list[str], values: dict[str, Any]) -> RunResult:
        spec = tool.spec
        stdout, stderr = OutputBuffer(spec.max_output), OutputBuffer(max(256, spec.max_output // 4))
        started = time.monotonic()
        try:
            module = self.modules.module(tool.wasm_path)
        except WasmModuleError as exc:
            return RunResult("error", None, stdout, stderr, time.monotonic() - started, str(exc), "module")
        memory_limit = (spec.memory or DEFAULT_MEMORY_MIB) * 1024 * 1024

        store = wasmtime.Store(self.engine)
        store.set_limits(memory_size=memory_limit)
        store.set_fuel(spec.fuel or UNLIMITED_FUEL)
        store.set_epoch_deadline(max(1, round(spec.timeout / TICK)))
        set_deadline(started + spec.timeout + 2 * TICK)  # a sleeping module wakes past it, and is stopped
        wasi = wasmtime.WasiConfig()
        wasi.argv = argv
        wasi.env = list(declared_environment(tool).items())  # no PATH: a module runs no programs
        wasi.stdout_custom = stdout.feed
        wasi.stderr_custom = stderr.feed
        for guest, mount in tool.mounts.items():
            wasi.preopen_dir(str(mount.path), guest, mount.writable)
        stdin_path = None
        if spec.stdin == "json":
            with tempfile.NamedTemporaryFile("wb", prefix="tk-stdin-", delete=False) as handle:
                handle.write(orjson.dumps(values))
                stdin_path = handle.name
            wasi.stdin_file(stdin_path)
        store.set_wasi(wasi)

        status, code, detail, trap_words = "ok", 0, "", None
        instance = None
        try:
            instance = self.linker.instantiate(store, module)
            instance.exports(store)["_start"](store)
        except wasmtime.ExitTrap as exit_trap:
            code = exit_trap.code
            status = "ok" if code == 0 else "failed"
        except DeadlineReached:  # asleep on the host when its time ran out
            status, code, detail = "timeout", None, f"{spec.timeout:g} s"
            trap_words = f"it ran past its time limit of {spec.timeout:g} s"
        except wasmtime.Trap as trap:
            status, trap_words = self._explain(trap, spec, _memory_size(instance, store), memory_limit)
            code = None
            detail = f"{spec.timeout:g} s" if status == "timeout" else ""
        except wasmtime.WasmtimeError as exc:
            status, code, detail = "error", None, f"the module could not run: {exc}"
        finally:
            if stdin_path:
                os.unlink(stdin_path)
        return RunResult(status, code, stdout, stderr, time.monotonic() - started, detail,  # type: ignore[arg-type]
                         "module", trap_words)

    @staticmethod
    def _explain(trap: wasmtime.Trap, spec: Any, memory: int | None, memory_limit: int) -> tuple[str, str]:
        """A trap in words the model and the auditor understand: (status, words)."""
        code = trap.trap_code
        if code == wasmtime.TrapCode.INTERRUPT:
            return "timeout", f"it ran past its time limit of {spec.timeout:g} s"
        if code == wasmtime.TrapCode.OUT_OF_FUEL:
            return "failed", f"it ran out of fuel: its budget of {spec.fuel:,} instructions was used up"
        words = TRAP_WORDS.get(code, f"it trapped: {trap.message.splitlines()[0]}")  # type: ignore[arg-type]
        if code == wasmtime.TrapCode.MEMORY_OUT_OF_BOUNDS and memory is not None:
            mib = 1024 * 1024
            words += f" (its memory: {memory / mib:.1f} MiB of its {memory_limit // mib} MiB limit)"
        return "failed", words


def _memory_size(instance: wasmtime.Instance | None, store: wasmtime.Store) -> int | None:
    """The size of the instance's exported memory, to tell a module stopped at its memory limit."""
    if instance is None:
        return None
    memory = instance.exports(store).get("memory")
    return memory.data_len(store) if isinstance(memory, wasmtime.Memory) else None


_shared: WasmRunner | None = None


def shared_runner() -> WasmRunner:
    """One runner per process, over the modules compiled when the agent file loaded."""
    global _shared
    if _shared is None:
        _shared = WasmRunner(compiled_modules())
    return _shared

