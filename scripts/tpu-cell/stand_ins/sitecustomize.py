"""The TPU cell's host stand-ins: the one place that stands in for what a
cell host lacks (docs/tpu-cell.md). Never in a wheel, never on a TPU VM: the
cell's run.sh puts this folder on PYTHONPATH (after everything else) only
when --host-stand-ins names one, and each is active only where
MRL_HOST_STAND_INS (the one variable, from run.sh to the engine) names it.
Each active one is in ACTIVE (name -> what it replaces): the tool reads this
module's ACTIVE in its own process (maxtext_rl_overlay.config.reader
host_stand_ins), so smoke's engine, a child that runs this module as it
starts, copies them into its result, and every line it touches names them.

- no-inet-sockets: the host refuses AF_INET/AF_INET6 sockets (errno 97,
  even on loopback). vLLM's single-process executor still asks for a free
  port (vllm.utils.network_utils.get_open_port binds one: OSError 97), and
  the TPU worker makes a world-size-1 gloo group (gloo resolves the host's
  address: it cannot). Stands in: get_open_port returns a fixed port that
  nothing binds, and a gloo process group of world size 1 is made with
  torch's `fake` backend (a group of one exchanges nothing).
- torch-2.13-torchax: torchax 0.0.13 (tpu-inference's pin) fails to import
  under torch 2.13 (`aten.prod` has no overload `dim_Dimname`): its
  decomposition table names overloads torch 2.13 dropped. Stands in: an
  overload lookup that torch no longer has is skipped where torchax builds
  that table, instead of failing the import.
- torchvision-no-ops: the host's torchvision (0.28, PyPI's CUDA build) cannot
  load its C++ ops next to the CPU torch, and its import then fails where it
  registers their meta kernels (`RuntimeError: operator torchvision::nms
  does not exist`); transformers' image processors (Gemma4Processor, which
  tpu-inference's gemma4_mm imports) need it importable. Stands in: that
  registration module (torchvision._meta_registrations) is an empty one:
  torchvision imports, without its C++ ops (calling one raises).
- maxtext-py311-aliases: MaxText 0.2.4 says Requires-Python >=3.12 (the
  bundle installs it on the host's 3.11 with that check relaxed, a named
  deviation); of what train_rl imports, only two lines are not Python 3.11:
  the PEP 695 aliases `type KernelContext = ...` (maxtext/kernels/mhc/
  common.py) and `type Implementation = ...` (api.py), a SyntaxError there,
  imported through maxtext.layers.decoders. Stands in: those two modules
  (only they) are compiled from their source with each `type X = Y` line read
  as `X = Y` (an alias evaluated at once, not lazily: both right-hand sides
  name what the module has already imported); no bytecode is written.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import re
import sys
import threading
from collections.abc import Callable
from typing import Any

NAMES = ("no-inet-sockets", "torch-2.13-torchax", "torchvision-no-ops", "maxtext-py311-aliases")
#: maxtext-py311-aliases: the modules whose PEP 695 aliases are rewritten (only these).
MAXTEXT_ALIAS_MODULES = ("maxtext.kernels.mhc.common", "maxtext.kernels.mhc.api")
#: A PEP 695 alias without type parameters, at the start of a line: `type X = Y`.
TYPE_ALIAS = re.compile(r"^(\s*)type\s+([A-Za-z_]\w*)\s*=", re.MULTILINE)
ASKED = [n for n in os.environ.get("MRL_HOST_STAND_INS", "").split(",") if n]
#: The port get_open_port answers without binding (no inet socket can be made here).
FIXED_PORT = int(os.environ.get("MRL_HOST_STAND_IN_PORT", "29511"))
#: The stand-ins active in this process, by name: what each replaces.
ACTIVE: dict[str, str] = {}


class _Empty(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Named modules found as empty ones, never executed."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.machinery.ModuleSpec(name, self) if name in self.names else None

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: Any) -> None:
        pass


_empty = _Empty()


#: The (finder, module) lookups under way in this thread: a finder that asks
#: every other finder (the train_rl run's import snapshots do too) is asked
#: back while it asks, and answers nothing then, rather than recursing.
_asking = threading.local()


def _spec_from_the_others(me: importlib.abc.MetaPathFinder, name: str, path: Any, target: Any) -> importlib.machinery.ModuleSpec | None:
    """The spec the other finders would give `name` (the first with a loader): what the stand-in's finder wraps."""
    asking: set[tuple[int, str]] = _asking.__dict__.setdefault("lookups", set())
    if (id(me), name) in asking:
        return None
    asking.add((id(me), name))
    try:
        for finder in sys.meta_path:
            if finder is me or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                return spec
        return None
    finally:
        asking.discard((id(me), name))


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a function on a module right after it is executed."""

    def __init__(self) -> None:
        self.hooks: dict[str, Callable[[Any], None]] = {}

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        hook = self.hooks.get(name)
        spec = None if hook is None else _spec_from_the_others(self, name, path, target)
        if spec is None or spec.loader is None:
            return None
        execute = spec.loader.exec_module

        def exec_module(module: Any, execute: Any = execute, hook: Any = hook) -> None:
            execute(module)
            hook(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


_hooks = _AfterImport()


def rewrite_aliases(source: str) -> str:
    """`type X = Y` lines read as `X = Y` (maxtext-py311-aliases)."""
    return TYPE_ALIAS.sub(r"\1\2 =", source)


class _RewrittenSource(importlib.abc.MetaPathFinder):
    """Named modules compiled from their source rewritten (never from, nor to, bytecode)."""

    def __init__(self) -> None:
        self.rewrites: dict[str, Callable[[str], str]] = {}

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        rewrite = self.rewrites.get(name)
        spec = None if rewrite is None else _spec_from_the_others(self, name, path, target)
        if spec is None or rewrite is None or not isinstance(spec.loader, importlib.machinery.SourceFileLoader):
            return None  # not named, or not compiled from a source file: left as it is
        spec.loader = _RewritingLoader(name, spec.loader.path, rewrite)
        return spec


class _RewritingLoader(importlib.machinery.SourceFileLoader):
    def __init__(self, fullname: str, path: str, rewrite: Callable[[str], str]) -> None:
        super().__init__(fullname, path)
        self.rewrite = rewrite

    def get_code(self, fullname: str) -> Any:
        source = self.get_source(fullname)
        if source is None:
            raise ImportError(f"maxtext-py311-aliases: no source for {fullname}", name=fullname)
        return compile(self.rewrite(source), self.path, "exec", dont_inherit=True)


_rewritten = _RewrittenSource()


def _activate(name: str, what: str) -> None:
    ACTIVE[name] = what


def _network_utils(module: Any) -> None:
    module.get_open_port = lambda: FIXED_PORT


def _distributed(module: Any) -> None:
    init, new_group = module.init_process_group, module.new_group

    def fake_if_alone(kwargs: dict[str, Any]) -> dict[str, Any]:
        if str(kwargs.get("backend") or "").lower() == "gloo" and kwargs.get("world_size", 1) == 1:
            from torch.testing._internal.distributed.fake_pg import FakeStore

            kwargs = dict(kwargs, backend="fake")
            kwargs.pop("init_method", None)
            kwargs.setdefault("store", FakeStore())
            kwargs.setdefault("rank", 0)
        return kwargs

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        return init(*args, **fake_if_alone(kwargs))

    def new_group_(*args: Any, **kwargs: Any) -> Any:
        if str(kwargs.get("backend") or "").lower() == "gloo" and module.get_world_size() == 1:
            kwargs = dict(kwargs, backend="fake")
        return new_group(*args, **kwargs)

    targets: tuple[Any, ...] = (module, sys.modules.get("torch.distributed"))
    for where in targets:
        if where is not None:
            where.init_process_group, where.new_group = init_process_group, new_group_


def _torch_distributed(module: Any) -> None:
    _distributed(sys.modules["torch.distributed.distributed_c10d"])


def _torchax_overloads() -> None:
    """torch 2.13's OpOverloadPacket raises AttributeError for an overload it
    dropped; torchax 0.0.13 reads 22 such while it imports. Read them as absent."""
    import torch

    packet = type(torch.ops.aten.prod)
    getattr_ = packet.__getattr__

    def lenient(self: Any, key: str) -> Any:
        try:
            return getattr_(self, key)
        except AttributeError:
            if key.startswith("__") or not sys._getframe(1).f_globals.get("__name__", "").startswith("torchax"):
                raise
            return _Absent(f"{self}.{key}")

    packet.__getattr__ = lenient


class _Absent:
    """An overload torch no longer has: registering it does nothing."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __hash__(self) -> int:
        return hash(self.name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Absent) and other.name == self.name

    def __repr__(self) -> str:
        return f"<absent overload {self.name}>"


def _install() -> None:
    unknown = [n for n in ASKED if n not in NAMES]
    if unknown:
        raise SystemExit(f"MRL_HOST_STAND_INS: unknown stand-in(s) {', '.join(unknown)}; known: {', '.join(NAMES)}")
    if "no-inet-sockets" in ASKED:
        _hooks.hooks["vllm.utils.network_utils"] = _network_utils
        _hooks.hooks["torch.distributed"] = _torch_distributed
        _activate("no-inet-sockets", f"vLLM's get_open_port answers {FIXED_PORT} unbound; a world-size-1 gloo group is torch's fake backend")
    if "torch-2.13-torchax" in ASKED:
        _hooks.hooks["torchax"] = lambda module: None
        _hooks.hooks["torch"] = lambda module: _torchax_overloads()
        _activate("torch-2.13-torchax", "aten overloads torch 2.13 dropped read as absent while torchax imports")
    if "torchvision-no-ops" in ASKED:
        _empty.names.add("torchvision._meta_registrations")
        _activate("torchvision-no-ops", "torchvision imports without its C++ ops (its meta registrations skipped)")
        sys.meta_path.insert(0, _empty)
    if "maxtext-py311-aliases" in ASKED:
        for module in MAXTEXT_ALIAS_MODULES:
            _rewritten.rewrites[module] = rewrite_aliases
        _activate("maxtext-py311-aliases", "MaxText's two PEP 695 aliases (maxtext.kernels.mhc.common, .api) read as plain assignments on "
                                           "Python 3.11")
        sys.meta_path.insert(0, _rewritten)
    if _hooks.hooks:
        sys.meta_path.insert(0, _hooks)


_install()
