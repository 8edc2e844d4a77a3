"""The DP rank `loadlink route` chooses reaches SGLang 0.5.23 in a form SGLang's own code reads.

A real `loadlink engine --dp-size 2` publishes its load and KV events per rank. In front of it a
small HTTP server plays the worker: `GET`s are passed to the engine (so the router discovers the
engine's `/server_info` and subscribes to its sockets), and every generation request is recorded
as it arrived, then forwarded to the engine. `loadlink route --dp-rank-field MODE` routes to that
front. Each recorded request is then read with SGLang's own code from the wheel:
`GenerateReqInput` (after `/generate`'s JSON contract, `api_types.decode_GenerateRequest`),
`CompletionRequest`, `ChatCompletionRequest`, `ResponsesRequest`, and
`OpenAIServingBase.extract_routed_dp_rank_from_header` for the header. The rank SGLang would run
the request on must be the one the router says it chose (`x-loadlink-dp-rank`), for every mode
and route; and the engine behind counts exactly those requests as routed.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import threading
import types
import urllib.error
import urllib.request
import warnings
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import loadlink_bin
from live import get_json, http, responds, start_engine, wait_until
from test_publish_interop import free_port_block

RANK_HEADER = "x-data-parallel-rank"

# ---- SGLang's request models, loaded without torch ------------------------------------------------
#
# `io_struct.py` and `openai/protocol.py` import torch, numpy, the OpenAI SDK and half of SGLang's
# runtime at module level; none of it is used by the request models' parsing. The modules are
# executed from the wheel with those imports answered by stub modules, inside a scope that puts
# `sys.modules` back afterwards, so the other interop suites' own SGLang shells are untouched.


class _Anything:
    """A stub value: callable, subscriptable, usable as a decorator and as a base class."""

    def __init__(self, *_a, **_k):
        pass

    def __call__(self, *a, **k):
        return a[0] if len(a) == 1 and callable(a[0]) and not k else _Anything()

    def __getattr__(self, _name):
        return _Anything()

    def __getitem__(self, _key):
        return _Anything()

    def __iter__(self):
        return iter(())

    def __bool__(self):
        return False

    def __or__(self, _other):
        return _Anything()

    __ror__ = __or__

    def __mro_entries__(self, _bases):
        return (object,)


class _StubModule(types.ModuleType):
    """A module whose every attribute is a stub. For the OpenAI SDK (`typed`), attributes are
    pydantic models (TypedDicts for its `*Param` names), since SGLang's models use them as field
    types and bases."""

    typed = False

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if self.typed and name.endswith("Param"):
            from typing_extensions import TypedDict

            value = TypedDict(name, {}, total=False)
        elif self.typed:
            from pydantic import BaseModel, ConfigDict

            value = type(name, (BaseModel,), {"model_config": ConfigDict(extra="allow"),
                                              "__module__": self.__name__})
        else:
            value = _Anything()
        setattr(self, name, value)
        return value


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    STUBBED = ("numpy", "torch", "openai", "sglang")
    REAL = {
        "sglang.srt.managers.io_struct",
        "sglang.srt.entrypoints.openai.protocol",
        "sglang.srt.entrypoints.openai.serving_base",
        "sglang.api.v1.api_types",
    }

    @classmethod
    def covers(cls, name: str) -> bool:
        return any(name == p or name.startswith(p + ".") for p in cls.STUBBED)

    def find_spec(self, name, path, target=None):
        if name in self.REAL or not self.covers(name):
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        m = _StubModule(spec.name)
        m.__path__ = []
        m.typed = spec.name == "openai" or spec.name.startswith("openai.")
        return m

    def exec_module(self, module):
        pass


@contextlib.contextmanager
def _wheel_scope():
    """Imports in this scope run the wheel's request modules against stubs; on exit SGLang's and
    the stubs' entries in `sys.modules` are put back as they were (the loaded modules stay alive
    through their objects; real third-party modules imported meanwhile stay loaded)."""
    saved = dict(sys.modules)
    for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
        del sys.modules[name]
    root = list(importlib.util.find_spec("sglang").submodule_search_locations)[0]
    for pkg in ("sglang", "sglang.srt", "sglang.srt.managers", "sglang.srt.entrypoints",
                "sglang.srt.entrypoints.openai", "sglang.api", "sglang.api.v1"):
        shell = types.ModuleType(pkg)
        shell.__path__ = [os.path.join(root, *pkg.split(".")[1:])]
        sys.modules[pkg] = shell
    for module in _SGLANG.values():  # already loaded: type hints resolve in their own globals
        sys.modules[module.__name__] = module
    finder = _StubFinder()
    sys.meta_path.insert(0, finder)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            yield
    finally:
        sys.meta_path.remove(finder)
        for name in [n for n in sys.modules if n not in saved and _StubFinder.covers(n)]:
            del sys.modules[name]
        sys.modules.update(saved)


_SGLANG: dict = {}


def sglang() -> types.SimpleNamespace:
    """SGLang 0.5.23's request models, loaded once."""
    if not _SGLANG:
        import msgspec.msgpack

        real_decoder = msgspec.msgpack.Decoder

        def lenient_decoder(*a, **k):
            # io_struct builds its IPC decoder over every struct at import; with stubbed field
            # types that fails, and the IPC decoder is not what this test uses.
            try:
                return real_decoder(*a, **k)
            except TypeError:
                return None

        with _wheel_scope():
            msgspec.msgpack.Decoder = lenient_decoder
            try:
                io_struct = importlib.import_module("sglang.srt.managers.io_struct")
            finally:
                msgspec.msgpack.Decoder = real_decoder
            protocol = importlib.import_module("sglang.srt.entrypoints.openai.protocol")
            serving_base = importlib.import_module("sglang.srt.entrypoints.openai.serving_base")
            api_types = importlib.import_module("sglang.api.v1.api_types")
        _SGLANG.update(io_struct=io_struct, protocol=protocol, serving_base=serving_base,
                       api_types=api_types)
    return types.SimpleNamespace(**_SGLANG)


class _RawRequest:
    """What `extract_routed_dp_rank_from_header` reads of a FastAPI request: its headers."""

    def __init__(self, headers: list[tuple[str, str]]):
        from starlette.datastructures import Headers

        self.headers = Headers(raw=[(k.lower().encode("latin-1"), v.encode("latin-1"))
                                    for k, v in headers])


def sglang_rank(path: str, headers: list[tuple[str, str]], body: dict):
    """The DP rank SGLang 0.5.23 would run this request on (None: its own dispatcher picks)."""
    s = sglang()
    with _wheel_scope():
        if path == "/generate":
            s.api_types.decode_GenerateRequest(body)  # the JSON contract gate; raises if refused
            obj = s.io_struct.GenerateReqInput(**body)
            obj.normalize_batch_and_arguments()
            return obj.routed_dp_rank  # /generate does not read the header
        model = {
            "/v1/completions": s.protocol.CompletionRequest,
            "/v1/chat/completions": s.protocol.ChatCompletionRequest,
            "/v1/responses": s.protocol.ResponsesRequest,
        }[path]
        request = model.model_validate(body)
        extract = s.serving_base.OpenAIServingBase.extract_routed_dp_rank_from_header
        return extract(None, _RawRequest(headers), request.routed_dp_rank)


def test_sglang_reads_the_three_spellings_as_the_engine_does():
    """The oracle itself: header over body, the alias, a bad header a 400 (as `docs/engine.md`
    "Routed DP rank" says, and as `crates/engine/tests/routed_rank.rs` holds the engine to)."""
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert sglang_rank("/v1/chat/completions", [("X-Data-Parallel-Rank", "3")],
                       {**chat, "routed_dp_rank": 1}) == 3
    assert sglang_rank("/v1/completions", [], {"model": "m", "prompt": "x",
                                               "data_parallel_rank": 2}) == 2
    assert sglang_rank("/generate", [("X-Data-Parallel-Rank", "3")],
                       {"text": "x", "routed_dp_rank": 1}) == 1
    from fastapi import HTTPException

    with pytest.raises(HTTPException) as bad:
        sglang_rank("/v1/chat/completions", [("X-Data-Parallel-Rank", "abc")], chat)
    assert bad.value.status_code == 400
    assert bad.value.detail == "Invalid X-Data-Parallel-Rank header: must be an integer, got 'abc'"


# ---- The live chain: router -> recording front -> engine ------------------------------------------


class Front:
    """The worker the router sees: GETs answered by the engine, generation requests recorded,
    then forwarded to it (`/v1/responses`, which the simulated engine does not serve, gets a
    minimal answer here)."""

    def __init__(self, engine: str):
        self.engine = engine
        self.received: list[tuple[str, list[tuple[str, str]], dict]] = []
        self.lock = threading.Lock()
        front = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _reply(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):  # noqa: N802 (http.server's naming)
                status, body, _ = http(front.engine + self.path)
                self._reply(status, body)

            def do_POST(self):  # noqa: N802
                raw = self._body()
                with front.lock:
                    front.received.append((self.path, list(self.headers.items()), json.loads(raw)))
                if self.path == "/v1/responses":
                    self._reply(200, json.dumps({"object": "response", "output": []}).encode())
                    return
                headers = {"Content-Type": "application/json"}
                if (rank := self.headers.get(RANK_HEADER)) is not None:
                    headers["X-Data-Parallel-Rank"] = rank
                req = urllib.request.Request(front.engine + self.path, data=raw, headers=headers)
                try:
                    with urllib.request.urlopen(req, timeout=30) as r:
                        self._reply(r.status, r.read())
                except urllib.error.HTTPError as e:
                    self._reply(e.code, e.read())

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = b""
                    while (size := int(self.rfile.readline().strip(), 16)) > 0:
                        out += self.rfile.read(size)
                        self.rfile.readline()
                    self.rfile.readline()
                    return out
                return self.rfile.read(int(self.headers.get("Content-Length", "0")))

            def log_message(self, *_):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def front_factory():
    made: list[Front] = []

    def make(engine: str) -> Front:
        made.append(Front(engine))
        return made[-1]

    yield make
    for f in made:
        f.server.shutdown()


BODIES = {
    "/generate": {"text": "hello there", "sampling_params": {"max_new_tokens": 1}},
    "/v1/completions": {"model": "loadlink-sim", "prompt": "hello there", "max_tokens": 1},
    "/v1/chat/completions": {"model": "loadlink-sim", "max_tokens": 1,
                             "messages": [{"role": "user", "content": "hello there"}]},
    "/v1/responses": {"model": "loadlink-sim", "input": "hello there"},
}
HEADER_ROUTES = {"/v1/completions", "/v1/chat/completions", "/v1/responses"}
BODY_ROUTES = {"/generate", "/v1/completions", "/v1/chat/completions"}


def routed_on_engine(engine: str) -> float:
    _, body, _ = http(engine + "/metrics")
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.decode().splitlines()
               if line.startswith("loadlink_engine_rank_requests_total{")
               and 'rank_from="routed"' in line)


@pytest.mark.parametrize("mode", ["header", "body", "both", "none"])
def test_sglang_runs_each_request_on_the_rank_the_router_chose(procs, front_factory, mode):
    kv = free_port_block(4)
    engine = start_engine(procs, free_port_block(1), "--dp-size", "2", "--kv-events-config",
                          json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{kv}"}))
    front = front_factory(engine)
    port = free_port_block(1)
    router = f"http://127.0.0.1:{port}"
    procs.spawn([loadlink_bin(), "route", "--worker-urls", front.url, "--port", str(port),
                 "--duration", "120", "--dp-rank-field", mode])
    wait_until("the router to serve", lambda: responds(router + "/health"))

    def per_rank_view():
        workers = get_json(router + "/workers")["workers"]
        w = next((w for w in workers if w["url"] == front.url), None)
        ranks = (w or {}).get("ranks") or []
        fresh = len(ranks) == 2 and all(r["source"] == "engine" for r in ranks)
        return w if fresh else None

    view = wait_until("both ranks' load streams at the router", per_rank_view)
    expected_mode = "worker" if mode == "none" else "per-rank"
    assert view["rank_routing"]["mode"] == expected_mode, view["rank_routing"]

    chosen = []
    for _ in range(2):
        for path, body in BODIES.items():
            status, raw, headers = http(router + path, body)
            assert status == 200, f"{mode} {path}: {status} {raw[:300]!r}"
            picked = {k.lower(): v for k, v in headers.items()}.get("x-loadlink-dp-rank")
            chosen.append((path, None if picked is None else int(picked)))

    with front.lock:
        received = list(front.received)
    assert [p for p, _, _ in received] == [p for p, _ in chosen]
    forwarded_with_rank = 0
    for (path, headers, body), (_, picked) in zip(received, chosen):
        header = {k.lower(): v for k, v in headers}.get(RANK_HEADER)
        travels_in_header = mode in ("header", "both") and path in HEADER_ROUTES
        travels_in_body = mode in ("body", "both") and path in BODY_ROUTES
        what = f"--dp-rank-field {mode} {path}: header {header!r}, body {body}"
        if travels_in_header or travels_in_body:
            assert picked in (0, 1), what
        else:
            assert picked is None, f"{what}: the router says it chose rank {picked}"
        assert (header is not None) == travels_in_header, what
        assert ("routed_dp_rank" in body) == travels_in_body, what
        if travels_in_header:
            assert header == str(picked), what
        if travels_in_body:
            assert body["routed_dp_rank"] == picked, what
        assert sglang_rank(path, headers, body) == picked, what
        if picked is not None and path != "/v1/responses":
            forwarded_with_rank += 1
    assert (forwarded_with_rank > 0) == (mode != "none")
    # The engine behind ran exactly those requests on a routed rank.
    assert routed_on_engine(engine) == forwarded_with_rank
