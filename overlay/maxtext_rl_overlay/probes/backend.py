"""smoke's first question, in a fresh interpreter of the environment it runs
in: does each module of argv[2:] import (each alone), and (argv[1] == "1")
which backend does jax pick? Prints one JSON line, {"errors": {module:
"ErrorType: message"}, "backend": name or null}. jax picks its backend once
per process, and a package that fails to import must be named, not mistaken
for a missing TPU: hence a process of its own.

Standard library only (see probes/__init__.py); started by path, never
imported by the tool."""

import importlib
import json
import os
import sys


def as_python_c() -> None:
    """sys.path as `python -c` has it: "" (the current directory) first in
    place of this file's folder, which running a file by path puts there."""
    if sys.path and os.path.realpath(sys.path[0] or ".") == os.path.dirname(os.path.realpath(__file__)):
        sys.path[0] = ""


def main() -> None:
    as_python_c()
    errors: dict[str, str] = {}
    backend = None
    for name in sys.argv[2:]:
        try:
            __import__(name)
        except BaseException as error:  # what a broken package raises is not ours to choose
            errors[name] = f"{type(error).__name__}: {error}".strip().splitlines()[0][:300]
    if "jax" not in errors and sys.argv[1] == "1":
        backend = importlib.import_module("jax").default_backend()
    print(json.dumps({"errors": errors, "backend": backend}))


if __name__ == "__main__":
    main()
