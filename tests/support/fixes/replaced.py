"""The replaced-functions check of the train_rl run: nothing in google-tunix,
tpu-inference or vLLM was replaced at run time.

`SNAPSHOTS`, put first on sys.meta_path before any upstream module is
imported, remembers what each upstream module holds when its import ends;
`replaced_functions` later names what was rebound since, and the jax.lax
functions the upstreams call that are not jax's. What the run's own CPU
stand-ins replace is reported apart, not hidden.
"""

from __future__ import annotations

import importlib.abc
import sys

UPSTREAMS = ("tunix", "tpu_inference", "vllm")


class ImportSnapshots(importlib.abc.MetaPathFinder):
    """Remembers what each module of the upstreams holds when its import
    ends (its functions and classes, and its classes' functions), so that
    `replaced_functions` can tell what was rebound after that. Delegates the
    finding to the rest of sys.meta_path (installed first in it)."""

    def __init__(self):
        self.snapshots: dict[str, dict] = {}

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] not in UPSTREAMS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_and_snapshot(module):
            exec_module(module)
            self.snapshots[fullname] = _snapshot(module)

        loader.exec_module = exec_and_snapshot  # type: ignore[method-assign]  # wrapped, to snapshot what it leaves
        return spec


def _snapshot(module) -> dict:
    out = {}
    for attr, value in vars(module).items():
        if callable(value):
            out[attr] = value
            if isinstance(value, type) and value.__module__ == module.__name__:
                out[(attr,)] = {k: v for k, v in vars(value).items() if callable(v) or isinstance(v, (staticmethod, classmethod))}
    return out


SNAPSHOTS = ImportSnapshots()


def _origin(value) -> str:
    """The file whose code `value` (a function, method or class) is."""
    value = getattr(value, "__func__", value)
    code = getattr(value, "__code__", None)
    if code is not None:
        return code.co_filename
    module = sys.modules.get(getattr(value, "__module__", "") or "")
    return getattr(module, "__file__", None) or repr(value)[:80]


def replaced_functions(stand_ins: set[str]) -> dict[str, list[str]]:
    """What was rebound in the upstreams' modules after their import ended: a
    function or class of a module, or a function of one of its classes, that
    is no longer the object the import left there (ImportSnapshots); and
    jax.lax functions (which the upstreams call) that are not jax's. Each with
    the file of the code now there. The CPU stand-ins (`stand_ins`: the names
    they replace) apart."""
    import jax

    found = []
    for name, snapshot in sorted(SNAPSHOTS.snapshots.items()):
        module = sys.modules.get(name)
        if module is None:
            continue
        now = vars(module)
        for key, value in snapshot.items():
            if isinstance(key, tuple):
                cls = now.get(key[0])
                if not isinstance(cls, type):
                    continue
                for attr, method in value.items():
                    current = vars(cls).get(attr)
                    if current is not None and current is not method:
                        found.append((f"{name}.{key[0]}.{attr}", _origin(current)))
            elif key in now and now[key] is not value:
                found.append((f"{name}.{key}", _origin(now[key])))
    for attr in ("with_sharding_constraint", "top_k"):
        fn = getattr(jax.lax, attr)
        if not getattr(fn, "__module__", "").startswith("jax"):
            found.append((f"jax.lax.{attr}", _origin(fn)))
    return {"replaced": sorted(f"{n}: {where}" for n, where in found if n not in stand_ins),
            "stand_ins": sorted(f"{n}: {where}" for n, where in found if n in stand_ins)}
