"""Two WASI calls replaced, so that a module's limits hold where wasmtime's own WASI would not enforce them.

- `poll_oneoff` (sleep, wait for input): wasmtime's sleeps inside the host,
  where epoch interruption cannot reach, so a module asking to sleep a minute
  would hold its thread a minute whatever its time limit. Here a sleep ends
  at the module's deadline at the latest, and the module is stopped there as
  a timeout. Input is always ready (stdin is a file).
- `path_symlink`: a module may not create symbolic links, so a writable mount
  never holds one pointing outside it for a later tool, or a person, to follow.

The deadline is the calling thread's: each module runs on one pool thread.
"""

from __future__ import annotations

import struct
import threading
import time

import wasmtime

WASI = "wasi_snapshot_preview1"
SUBSCRIPTION = 48  # bytes: userdata u64, tag u8, then (clock) id u32 @16, timeout u64 @24, precision @32, flags @40
EVENT = 32  # bytes: userdata u64, error u16 @8, type u8 @10, fd_readwrite @16
CLOCK, FD_READ = 0, 1
ABSTIME = 1
ERRNO_SUCCESS, ERRNO_INVAL, ERRNO_PERM = 0, 28, 63

_deadline = threading.local()


class DeadlineReached(Exception):
    """A module slept into its time limit: it is stopped as a timeout, there and then."""


def set_deadline(monotonic_deadline: float) -> None:
    """The time (time.monotonic) past which this thread's module must not sleep."""
    _deadline.at = monotonic_deadline


def define_limits(linker: wasmtime.Linker) -> None:
    """Shadow WASI's poll_oneoff and path_symlink on a linker that already defines WASI."""
    i32 = wasmtime.ValType.i32()
    linker.allow_shadowing = True
    linker.define_func(WASI, "poll_oneoff", wasmtime.FuncType([i32] * 4, [i32]), _poll_oneoff, access_caller=True)
    linker.define_func(WASI, "path_symlink", wasmtime.FuncType([i32] * 5, [i32]), _no_symlink)
    linker.allow_shadowing = False


def _no_symlink(old_ptr: int, old_len: int, fd: int, new_ptr: int, new_len: int) -> int:
    return ERRNO_PERM


def _poll_oneoff(caller: wasmtime.Caller, in_ptr: int, out_ptr: int, count: int, nevents_ptr: int) -> int:
    memory = caller.get("memory")
    if not isinstance(memory, wasmtime.Memory) or count <= 0:
        return ERRNO_INVAL
    raw = memory.read(caller, in_ptr, in_ptr + count * SUBSCRIPTION)
    subscriptions = [raw[i * SUBSCRIPTION:(i + 1) * SUBSCRIPTION] for i in range(count)]
    ready = [s for s in subscriptions if s[8] != CLOCK]  # input and output never block here
    if not ready:
        ready = [_sleep_for_earliest(subscriptions)]
    events = b"".join(_event(s) for s in ready)
    memory.write(caller, events, out_ptr)
    memory.write(caller, struct.pack("<I", len(ready)), nevents_ptr)
    return ERRNO_SUCCESS


def _sleep_for_earliest(subscriptions: list[bytes]) -> bytes:
    """Sleep until the earliest clock subscription fires, or this thread's deadline: the one that fired."""
    now_ns = time.monotonic_ns()

    def wait_ns(sub: bytes) -> int:
        timeout, flags = struct.unpack_from("<Q", sub, 24)[0], struct.unpack_from("<H", sub, 40)[0]
        if flags & ABSTIME:  # an absolute time on the module's clock: wasmtime's clocks are the host's
            clock_id = struct.unpack_from("<I", sub, 16)[0]
            now = time.time_ns() if clock_id == 0 else now_ns
            return max(0, timeout - now)
        return timeout

    earliest = min(subscriptions, key=wait_ns)
    wanted = wait_ns(earliest) / 1e9
    left = getattr(_deadline, "at", time.monotonic() + wanted) - time.monotonic()
    if left < wanted:
        time.sleep(max(0.0, left))
        raise DeadlineReached  # back in the module, it might run on without an epoch check: stop it here
    time.sleep(wanted)
    return earliest


def _event(subscription: bytes) -> bytes:
    userdata, tag = subscription[:8], subscription[8]
    return userdata + struct.pack("<HB", ERRNO_SUCCESS, tag) + bytes(EVENT - 11)
