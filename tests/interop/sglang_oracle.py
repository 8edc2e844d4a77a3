"""Loads the real SGLang 0.5.23 modules without their heavy package __init__ files.

SGLang's package __init__ files import torch; the three modules the load protocol lives in do
not need it. This module registers empty package shells whose __path__ points at the installed
wheel, so `import sglang.srt.managers.load_snapshot` executes the real file, and stubs the two
runtime modules those files read configuration from (`runtime_context`, `environ`).
Nothing from SGLang is copied here: every protocol behaviour under test is SGLang's own code.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from dataclasses import dataclass, field


def _wheel_root() -> str:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("sglang==0.5.23 is not installed (pip install --no-deps sglang==0.5.23)")
    return list(spec.submodule_search_locations)[0]


@dataclass
class Parallel:
    """The fields of SGLang's parallel runtime context that the load modules read."""

    attn_dp_enabled: bool = False
    nnodes: int = 1
    node_rank: int = 0
    num_dp_ranks: int = 1
    load_balance_method: str = "round_robin"
    pp_rank: int = 0
    attn_tp_rank: int = 0
    attn_cp_rank: int = 0
    attn_dp_size: int = 1
    attn_dp_rank: int = 0
    dp_rank: int = 0


@dataclass
class Serving:
    tokenizer_worker_num: int = 1


@dataclass
class _Flag:
    value: bool = False

    def get(self):
        return self.value


@dataclass
class _Envs:
    SGLANG_LOAD_SNAPSHOT_USE_ZMQ: _Flag = field(default_factory=_Flag)


PARALLEL = Parallel()
SERVING = Serving()
ENVS = _Envs()


def _install() -> None:
    if "sglang.srt.runtime_context" in sys.modules:
        return
    root = _wheel_root()
    for pkg in (
        "sglang",
        "sglang.srt",
        "sglang.srt.managers",
        "sglang.srt.managers.scheduler_components",
        "sglang.srt.disaggregation",
        "sglang.srt.utils",
    ):
        mod = types.ModuleType(pkg)
        mod.__path__ = [os.path.join(root, *pkg.split(".")[1:])]
        sys.modules[pkg] = mod
    rc = types.ModuleType("sglang.srt.runtime_context")
    rc.get_parallel = lambda: PARALLEL
    rc.get_serving = lambda: SERVING
    sys.modules[rc.__name__] = rc
    env = types.ModuleType("sglang.srt.environ")
    env.envs = ENVS
    sys.modules[env.__name__] = env


_install()
load_snapshot = importlib.import_module("sglang.srt.managers.load_snapshot")
kv_events = importlib.import_module("sglang.srt.disaggregation.kv_events")
load_publisher = importlib.import_module("sglang.srt.managers.scheduler_components.load_publisher")


def _functions_from(relpath: str, names: set[str]) -> types.SimpleNamespace:
    """Runs only the named top-level functions of a wheel file whose imports need torch: their own
    source, compiled from the installed file, so the oracle is still SGLang's code."""
    import ast

    path = os.path.join(sys.modules["sglang"].__path__[0], relpath)
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    missing = names - {n.name for n in body}
    if missing:
        raise RuntimeError(f"{relpath} no longer defines {sorted(missing)}")
    scope: dict = {}
    exec(compile(ast.Module(body=body, type_ignores=[]), path, "exec"), scope)
    return types.SimpleNamespace(**{n: scope[n] for n in names})


mem_cache_utils = _functions_from("srt/mem_cache/utils.py", {"hash_str_to_int64"})
