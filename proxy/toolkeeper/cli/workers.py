"""`serve --workers N`: N processes on one port, each a whole toolkeeper sharing the configured store.

The supervisor reserves the port (port 0 picks one), forks the workers, which
each listen on it with SO_REUSEPORT (the kernel spreads connections among
them), and waits until every one is listening before it prints the start line.
It passes SIGTERM, SIGINT and SIGHUP on to them, and starts a worker again
when one dies. What the workers share lives in the store (SQLite by default:
restoration, the retry memo and approvals work across them); their metrics, in
a private directory the supervisor makes (`shared_metrics`), so that any
worker's /metrics counts them all.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

from toolkeeper.metrics import MULTIPROCESS, forget_process
from toolkeeper.settings import Settings

# A worker's whole life: serve with these settings, say "listening" on the fd (None: say nothing), return its
# exit code.
Worker = Callable[[Settings, int | None], int]

START_WAIT = 60.0  # seconds the workers have to start listening
RESTART_PAUSE = 1.0  # seconds before a worker that died is started again
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # passed on to every worker


def worker_count(settings: Settings) -> int:
    """--workers, 0 meaning one per core; refused with terminal consent (one terminal cannot serve many)."""
    count = settings.workers or len(os.sched_getaffinity(0))
    if count < 0:
        raise ValueError(f"--workers must be 0 (one per core) or more, not {settings.workers}")
    if count > 1:
        from toolkeeper.app import consent_mode

        if consent_mode(settings) == "terminal":
            raise ValueError("terminal consent cannot serve several workers: one terminal cannot answer for "
                             f"{count} processes; answer from `toolkeeper approve` instead (--consent approvals, "
                             "with TOOLKEEPER_ADMIN_TOKEN set), or run one worker")
    return count


def supervise(settings: Settings, count: int, worker: Worker, announce: Callable[[int, str], None]) -> int:
    """Start `count` workers on one port, `announce(port, what the first worker said)` once all listen, then
    keep them running until a signal stops them."""
    reserved = reserve_port(settings.host, settings.port)
    try:
        with shared_metrics() as directory:
            return Supervisor(replace(settings, port=reserved.getsockname()[1]), worker, directory).run(count,
                                                                                                        announce)
    finally:
        reserved.close()


@contextlib.contextmanager
def shared_metrics() -> Iterator[str]:
    """A private directory where every worker writes its metrics (prometheus_client's multi-process mode), named
    to the workers by PROMETHEUS_MULTIPROC_DIR before the first fork; removed when the supervisor ends."""
    directory = tempfile.mkdtemp(prefix="toolkeeper-metrics-")  # mode 0700: this user's alone
    before = os.environ.get(MULTIPROCESS)
    os.environ[MULTIPROCESS] = directory
    try:
        yield directory
    finally:
        if before is None:
            os.environ.pop(MULTIPROCESS, None)
        else:
            os.environ[MULTIPROCESS] = before
        shutil.rmtree(directory, ignore_errors=True)


class Supervisor:
    def __init__(self, settings: Settings, worker: Worker, metrics_directory: str | None = None):
        self.settings = settings
        self.worker = worker
        self.metrics_directory = metrics_directory  # the workers' shared metrics
        self.workers: dict[int, int] = {}  # pid -> the worker's index
        self.stopping = False

    def run(self, count: int, announce: Callable[[int, str], None]) -> int:
        for signum in SIGNALS:  # before the first fork: a signal at any moment reaches every worker
            signal.signal(signum, self.forward)
        ready_read, ready_write = os.pipe()
        for index in range(count):
            self.start(index, ready_write)
        said = self.wait_until_ready(ready_read, count)
        os.close(ready_read)
        os.close(ready_write)  # workers started again later announce nothing
        if said is None:
            self.stop_all()
            return 0 if self.stopping else 1
        announce(self.settings.port, said)
        while self.workers:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                break
            index = self.workers.pop(pid, None)
            if self.metrics_directory is not None:
                forget_process(pid, self.metrics_directory)  # its live gauges (calls waiting) leave the sums
            if index is None or self.stopping:
                continue
            print(f"toolkeeper: worker {index} (pid {pid}) ended with status "
                  f"{os.waitstatus_to_exitcode(status)}; starting it again", file=sys.stderr, flush=True)
            time.sleep(RESTART_PAUSE)
            if not self.stopping:
                self.start(index, None)
        return 0

    def forward(self, signum: int, _frame: object) -> None:
        self.stopping = self.stopping or signum != signal.SIGHUP
        for pid in list(self.workers):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def start(self, index: int, ready_fd: int | None) -> None:
        """Fork a worker with the signals held, so none is lost or handled by the supervisor's handler in it."""
        held = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
        pid = os.fork()
        if pid == 0:
            for signum in SIGNALS:  # the worker: signals as a single process has them, then serve
                signal.signal(signum, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
            self._be_the_worker(ready_fd)
        self.workers[pid] = index
        signal.pthread_sigmask(signal.SIG_SETMASK, held)

    def _be_the_worker(self, ready_fd: int | None) -> None:
        code = 1
        try:
            code = self.worker(self.settings, os.dup(ready_fd) if ready_fd is not None else None)
        except BaseException as exc:  # a worker reports and exits: it never returns into the supervisor
            print(f"toolkeeper: worker failed: {exc}", file=sys.stderr, flush=True)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    def wait_until_ready(self, ready_fd: int, count: int) -> str | None:
        """Each worker writes one line once it listens: the policy it describes; None when one dies first, or a
        signal stops the start."""
        deadline, lines = time.monotonic() + START_WAIT, b""
        while lines.count(b"\n") < count:
            if self.stopping:
                return None
            for pid in list(self.workers):
                done, _ = os.waitpid(pid, os.WNOHANG)
                if done:
                    self.workers.pop(pid)
                    return None
            readable, _, _ = select.select([ready_fd], [], [], 0.1)
            if readable:
                lines += os.read(ready_fd, 4096)
            if time.monotonic() > deadline:
                print(f"toolkeeper: the workers did not start within {START_WAIT:g} s", file=sys.stderr)
                return None
        return lines.split(b"\n")[0].decode()

    def stop_all(self) -> None:
        for pid in self.workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        for pid in self.workers:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def reserve_port(host: str, port: int, *, shared_address: bool = True) -> socket.socket:
    """A socket bound to the port and never listening: it holds the port (and resolves port 0) for the workers.
    `shared_address=False`: no SO_REUSEADDR, so only a socket with SO_REUSEPORT of the same user can bind beside
    it (Linux lets any two non-listening SO_REUSEADDR sockets share a port, and one of them may then listen)."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    reserved = socket.socket(family, socket.SOCK_STREAM)
    if shared_address:  # a fixed port: bound again at once after a restart, past the old connections' TIME_WAIT
        reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        reserved.bind((host, port))
    except OSError as exc:
        reserved.close()
        raise ValueError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return reserved
