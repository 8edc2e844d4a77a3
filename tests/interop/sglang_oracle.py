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
