"""The TPU cell's question to its host, run with the host's python3 and a
step's PYTHONPATH: what is installed where, and (argv[1] == "1") jax's
devices. Prints one JSON line, {"python": version, "distributions": {name:
[version, location]}, "devices": {...}}.

Standard library only, Python 3.11: the bundle carries it beside cell.py
(tpucell/bundle.py) and the host runs it before anything is installed."""

import importlib
import importlib.metadata as md
import json
import sys
from typing import Any


def main() -> None:
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
