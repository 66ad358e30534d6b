"""The audit trail under faults: a PostgreSQL that hangs or restarts, a trail too large to list in Python.

A TCP relay between toolkeeper and the real PostgreSQL plays the network: paused, it takes bytes and
forwards none (a hung server); dropped, it closes every connection (a restart, as the client sees it).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
from conftest import LOOKUP, Toolkeeper, call, postgres_schema, start_toolkeeper, user, write_agent

AGENT = """
    upstream: http://127.0.0.1:9/v1
    yolo: true
    tools:
""" + LOOKUP


class Relay:
    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.running = threading.Event()
        self.running.set()
        self.connections: list[socket.socket] = []
        self.closing = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closing:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.connections += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                self.running.wait()
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def pause(self) -> None:
        self.running.clear()

    def resume(self) -> None:
        self.running.set()

    def drop(self) -> None:
        """Every connection closed, as a PostgreSQL restart does."""
        for sock in self.connections:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self.connections = []

    def close(self) -> None:
        self.closing = True
        self.resume()
        self.drop()
        self.server.close()


@pytest.fixture(params=["audit", "audit and store"])
def relayed(request, scripted, tmp_path):
    """toolkeeper with its audit trail (and, the second time, its store too) in PostgreSQL behind the relay."""
    with postgres_schema() as url:
        relay = Relay(("127.0.0.1", 5432))
        relayed_url = url.replace("127.0.0.1:5432", f"127.0.0.1:{relay.port}")
        write_agent(tmp_path, AGENT)
        store = ["--store", relayed_url] if request.param == "audit and store" else []
        process = start_toolkeeper(tmp_path / "agent.yaml", scripted.base_url, "--audit", relayed_url, *store)
        tk = Toolkeeper(process, tmp_path)
        try:
            yield tk, relay
        finally:
            relay.resume()
            tk.close_clients()
            process.stop()
            relay.close()


def ask(scripted, tk, word: str) -> str:
    scripted.script({"tool_calls": [call("lookup", {"word": word})]}, {"content": "{tool_result}"})
    return tk.client(timeout=30).chat.completions.create(model="m", messages=user()).choices[0].message.content


def get(tk, path: str, timeout: float = 10) -> tuple[int, float]:
    started = time.monotonic()
    try:
        with urllib.request.urlopen(tk.base_url[:-3] + path, timeout=timeout) as answer:
            status = answer.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    return status, time.monotonic() - started


def test_a_hung_database_refuses_calls_quickly_and_never_freezes_the_proxy(request, scripted, relayed):
    tk, relay = relayed
    assert ask(scripted, tk, "before").startswith("ran")
    relay.pause()
    results: dict[str, object] = {}
    caller = threading.Thread(target=lambda: results.update(answer=ask(scripted, tk, "during"),
                                                            took=time.monotonic() - started))
    started = time.monotonic()
    caller.start()
    time.sleep(0.3)
    status, took = get(tk, "/healthz")
    assert status == 200 and took < 1.0, took  # the event loop is free while the database hangs
    assert ready_becomes(tk, 503, within=8)  # from the background check: never waiting on the database
    caller.join(30)
    assert str(results["answer"]).startswith(("Not run: lookup could not be recorded in the audit trail",
                                              "Not run: toolkeeper could not tell whether this call already ran"))
    # the store's wait (2 s) then the audit trail's (3 s) for the refused call's record
    assert results["took"] < 6 + (2 if "store" in request.node.callspec.params["relayed"] else 0), results["took"]
    assert ["lookup", "during"] not in tk.calls()
    relay.resume()
    deadline = time.monotonic() + 15
    while not ask(scripted, tk, "after").startswith("ran"):  # the stuck connection is given up, a new one opened
        assert time.monotonic() < deadline, "calls never ran again"
    assert ["lookup", "after"] in tk.calls()
    assert ready_becomes(tk, 200, within=8)


def ready_becomes(tk, status: int, within: float) -> bool:
    """/readyz says `status` within so many seconds, each answer quick whatever the database does."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        said, took = get(tk, "/readyz")
        assert took < 0.25, took  # 50 ms on a quiet machine; this one runs the suite on both cores
        if said == status:
            return True
        time.sleep(0.1)
    return False


def test_calls_run_again_after_the_database_restarts(scripted, relayed):
    tk, relay = relayed
    assert ask(scripted, tk, "one").startswith("ran")
    relay.drop()
    assert ask(scripted, tk, "two").startswith("ran")  # reconnected, without restarting toolkeeper
    status, _ = get(tk, "/readyz")
    assert status == 200
