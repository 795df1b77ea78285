"""verify's question "where does a plain import find each module?", asked in
a fresh interpreter of the environment verified (its site, its PYTHONPATH, ""
first as for `python -c`), without importing any of the modules it locates.

For each module: the file the overlay's distribution installed and the one a
plain import resolves, found through the import system's own finders without
executing anything; then every .pth and egg-link on the path that belongs to
one of the distributions (by its name or by what it adds) and is not a file of
the overlay's installed distribution. argv[1]: JSON {"modules": [[module,
dist, version, relpath]], "versions": {dist: version}, "packages": {dist:
import package}}. Only the overlay's own build (its version) counts as
installed. Prints one JSON line: {"modules": [[module, installed, resolved]],
"leftovers": [[dist, path, what]]}.

Standard library only (see probes/__init__.py); started by path, never
imported by the tool."""

import importlib.metadata as md
import json
import os
import re
import site
import sys
import types
from typing import Any


def canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def ours(dist: str, version: str) -> md.Distribution | None:
    for d in md.distributions(name=dist):
        if d.version == version:
            return d
    return None


def resolve(module: str) -> str:
    spec: Any = None
    path: Any = None
    parts = module.split(".")
    for i in range(len(parts)):
        name = ".".join(parts[: i + 1])
        loaded = sys.modules.get(name)
        spec = getattr(loaded, "__spec__", None) if loaded is not None else None
        if spec is None:
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                spec = find(name, path) if find else None
                if spec is not None:
                    break
        if spec is None:
            return "not found"
        path = spec.submodule_search_locations
        if path is not None and name not in sys.modules:
            # An inert stand-in for the package, never executed: the path
            # finder reads a namespace package's parent from sys.modules.
            placeholder = types.ModuleType(name)
            placeholder.__path__, placeholder.__spec__ = path, spec
            sys.modules[name] = placeholder
    if spec.origin in (None, "namespace"):
        return "a namespace package: " + ", ".join(spec.submodule_search_locations or ())
    return os.path.realpath(str(spec.origin))


def leftovers(versions: dict[str, str], packages: dict[str, str]) -> list[list[str]]:
    recorded = set()
    for dist, version in versions.items():
        d = ours(dist, version)
        for f in (d.files or ()) if d is not None else ():
            recorded.add(os.path.realpath(str(d.locate_file(f))))  # type: ignore[union-attr]
    folders: list[str] = []
    for entry in [*site.getsitepackages(), site.getusersitepackages(), *sys.path]:
        real = os.path.realpath(entry or ".")
        if os.path.isdir(real) and real not in folders:
            folders.append(real)
    found = []
    for folder in folders:
        for name in sorted(os.listdir(folder)):
            if not name.endswith((".pth", ".egg-link")):
                continue
            path = os.path.join(folder, name)
            if path in recorded or not os.path.isfile(path):
                continue
            try:
                with open(path, encoding="utf-8", errors="replace") as file:
                    lines = [line.strip() for line in file]
            except OSError:
                continue
            stem = name[: -len(".egg-link")] if name.endswith(".egg-link") else name[: -len(".pth")]
            stem = stem.removeprefix("__editable__.").split("-")[0]
            for dist, package in packages.items():
                by_name = canon(stem) == canon(dist)
                adds = [line for line in lines if line and not line.startswith(("#", "import ", "import\t"))
                        and (os.path.isdir(os.path.join(folder, line, package)) or os.path.isfile(os.path.join(folder, line, package + ".py")))]
                hooks = [line for line in lines if line.startswith(("import ", "import\t")) and re.search(
                    r"(__editable___" + re.escape(dist.replace("-", "_")) + r"_|" + re.escape(package) + r")", line)]
                if by_name or adds or hooks:
                    what = "adds " + os.path.realpath(os.path.join(folder, adds[0])) if adds else "runs " + hooks[0] if hooks else "names " + dist
                    found.append([dist, path, what])
    return found


def main() -> None:
    asked = json.loads(sys.argv[1])
    out: dict[str, list[list[str]]] = {"modules": [], "leftovers": []}
    for module, dist, version, relpath in asked["modules"]:
        d = ours(dist, version)
        if d is not None:
            out["modules"].append([module, os.path.realpath(str(d.locate_file(relpath))), resolve(module)])
    out["leftovers"] = leftovers(asked["versions"], asked["packages"])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
