"""Helpers for interop tests that run live processes: `loadlink engine`s, SGLang's router, a
`loadlink wire listen` reader; plain HTTP; a KV-event subscriber and a replay client.

Every wait here is bounded and polls a condition; every process started through `Procs` is
killed when the test ends (the `procs` fixture in conftest.py)."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time
import urllib.error
import urllib.request
from typing import Callable, Optional

import zmq

from conftest import loadlink_bin

END_SEQ = (-1).to_bytes(8, "big", signed=True)


class Procs:
    """Processes a test started; `kill_all` ends each one by its own handle."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen] = []

    def spawn(self, args: list[str], **kw) -> subprocess.Popen:
        kw.setdefault("stdout", subprocess.DEVNULL)
        kw.setdefault("stderr", subprocess.DEVNULL)
        p = subprocess.Popen(args, **kw)
        self.started.append(p)
        return p

    def kill_all(self) -> None:
        for p in self.started:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)


def wait_until(what: str, cond: Callable[[], object], timeout: float = 20.0, every: float = 0.05):
    """Polls `cond` until it returns something truthy (and returns it), or fails naming `what`."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = cond()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def http(url: str, body: Optional[dict] = None, timeout: float = 30.0) -> tuple[int, bytes, dict]:
    """GET (or POST `body` as JSON): status, raw body, headers. Never raises on an HTTP status."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def get_json(url: str) -> object:
    status, body, _ = http(url)
    assert status == 200, f"GET {url}: {status} {body[:300]!r}"
    return json.loads(body)


def post_json(url: str, body: dict) -> dict:
    status, raw, _ = http(url, body)
    assert status == 200, f"POST {url}: {status} {raw[:300]!r}"
    return json.loads(raw)


def responds(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            r.read()
            return True
    except (OSError, urllib.error.HTTPError):
        return False


def start_engine(procs: Procs, http_port: int, *args: str) -> str:
    """A `loadlink engine` on `http_port` (10x time scale, 120 s at most), once /health answers."""
    p = procs.spawn([loadlink_bin(), "engine", "--port", str(http_port), "--time-scale", "10",
                     "--duration", "120", *args])
    url = f"http://127.0.0.1:{http_port}"
    wait_until(f"engine {url} /health", lambda: p.poll() is not None or responds(url + "/health"))
    assert p.poll() is None, f"engine exited with {p.returncode}"
    return url


def generate(url: str, input_ids: list[int], max_new_tokens: int = 1) -> dict:
    """SGLang's native /generate with exact token ids: with one output token a finished request
    caches exactly its prompt's full pages."""
    return post_json(url + "/generate", {"input_ids": input_ids,
                                         "sampling_params": {"max_new_tokens": max_new_tokens}})


def subscriber(endpoint: str) -> zmq.Socket:
    s = zmq.Context.instance().socket(zmq.SUB)
    s.setsockopt(zmq.SUBSCRIBE, b"")
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    return s


def recv(s: zmq.Socket, timeout: float = 15.0) -> list[bytes]:
    assert s.poll(int(timeout * 1000)), f"nothing received within {timeout}s"
    return s.recv_multipart()


def seq_of(frames: list[bytes]) -> int:
    return int.from_bytes(frames[1], "big", signed=True)


def join(s: zmq.Socket, emit: Callable[[int], None], timeout: float = 15.0) -> list[bytes]:
    """Slow joiner: calls `emit(i)` (i = 0, 1, …) until the subscriber receives a first message,
    and returns that message. Only a received message proves the subscription is live."""
    deadline = time.monotonic() + timeout
    i = 0
    while time.monotonic() < deadline:
        emit(i)
        i += 1
        if s.poll(100):
            return s.recv_multipart()
    raise AssertionError(f"the subscriber received nothing within {timeout}s")


def replay(endpoint: str, start_seq: int, timeout: float = 15.0) -> tuple[list[list[bytes]], list[bytes]]:
    """SGLang's replay request from a DEALER: `[b"", start seq 8B BE]`. Returns the replies before
    the end marker and the end marker itself."""
    d = zmq.Context.instance().socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.connect(endpoint)
    try:
        d.send_multipart([b"", start_seq.to_bytes(8, "big")])
        replies = []
        while True:
            frames = recv(d, timeout)
            if frames[2] == END_SEQ:
                return replies, frames
            replies.append(frames)
    finally:
        d.close(0)


class LineReader:
    """A subprocess's stdout lines, read on a thread, taken with a bounded wait."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        self.proc = proc
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)

    def next(self, timeout: float = 15.0) -> str:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no output line within {timeout}s (exit code {self.proc.poll()})") from None
