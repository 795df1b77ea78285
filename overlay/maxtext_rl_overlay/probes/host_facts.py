"""The TPU cell's question to its host, run with the host's python3 and a
step's PYTHONPATH: what is installed where, and (argv[1] == "1") jax's
devices. Prints one JSON line, {"python": version, "distributions": {name:
[version, location]}, "devices": {...}}. With `deviations CLOSURE [NAMES]`, what
this environment runs that differs from the release's closure instead:
{"deviations": [...]} (`deviations`, which verify --host-deviations calls
in its own process: the one account of a host's deviations).

Standard library only, Python 3.11: the bundle carries it beside cell.py
(tpucell/bundle.py) and the host runs it before anything is installed."""

import importlib
import importlib.metadata as md
import json
import re
import sys
from collections.abc import Callable
from typing import Any


def normal(name: str) -> str:
    """A distribution's name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def release_pins(text: str) -> dict[str, str]:
    """The `name==version` lines of a closure file (comments, options and
    extras' brackets aside), by normal name."""
    pins = {}
    for line in text.splitlines():
        line = line.split("#")[0].strip()
        if "==" in line and not line.startswith("-"):
            name, version = line.split("==", 1)
            pins[normal(name.split("[")[0])] = version.strip()
    return pins


def release_python(text: str) -> str:
    """The release's Python, as a closure file's header names it ("not said" where it does not)."""
    said = re.search(r"^#.*\bPython (\d+\.\d+)\b", text, re.MULTILINE)
    return said.group(1) if said else "not said"


def deviations(closure_text: str, excludes: Callable[[str, str, str], bool] | None = None) -> list[str]:
    """What this environment runs that differs from the release's closure
    (`closure_text`: its `name==version` lines, its header naming the
    release's Python): the Python, each distribution at another version,
    those not installed; and, where `excludes(name, requires_python,
    python)` says so, those installed although their Requires-Python
    excludes this Python (MaxText 0.2.4's >=3.12 on a 3.11 host: verify
    asks packaging's specifiers; the TPU cell names those its bundle
    installed with that check relaxed)."""
    python = ".".join(map(str, sys.version_info[:3]))
    release = release_python(closure_text)
    lines = [] if python.startswith(release + ".") else [f"Python {python} (the release's: {release})"]
    installed: dict[str, md.Distribution] = {}
    for dist in md.distributions():
        installed.setdefault(normal(dist.metadata["Name"] or ""), dist)
    absent, below = [], []
    for name, version in sorted(release_pins(closure_text).items()):
        found = installed.get(name)
        if found is None:
            absent.append(name)
            continue
        if found.version != version:
            lines.append(f"{name} {found.version} (the release's: {version})")
        wanted = (found.metadata.get_all("Requires-Python") or [""])[0]
        if wanted and excludes is not None and excludes(name, wanted, python):
            below.append(f"{name} {found.version} says Requires-Python {wanted}: installed on Python {python} regardless")
    lines += below
    if absent:
        lines.append(f"not installed ({len(absent)}): {', '.join(absent)}")
    return lines


def main() -> None:
    if sys.argv[1] == "deviations":  # deviations CLOSURE [NAME,...: installed with Requires-Python relaxed]
        relaxed = set(sys.argv[3].split(",")) if len(sys.argv) > 3 else set()
        with open(sys.argv[2], encoding="utf-8") as closure:
            print(json.dumps({"deviations": deviations(closure.read(), lambda name, _wanted, _python: name in relaxed)}))
        return
    out: dict[str, Any] = {"python": sys.version.split()[0], "distributions": {}}
    for d in md.distributions():
        name = (d.metadata["Name"] or "").lower()
        if name and name not in out["distributions"]:
            out["distributions"][name] = [d.version, str(d.locate_file(""))]
    if sys.argv[1] == "1":
        try:
            jax = importlib.import_module("jax")
            devices = jax.devices()
            out["devices"] = {"backend": jax.default_backend(), "count": len(devices), "kind": devices[0].device_kind}
        except Exception as error:
            out["devices"] = {"error": f"{type(error).__name__}: {error}"[:300]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
