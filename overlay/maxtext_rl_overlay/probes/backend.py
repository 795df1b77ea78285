"""smoke's first question, in a fresh interpreter of the environment it runs
in: does each module of argv[2:] import (each alone), and (argv[1] == "1")
which backend does jax pick? Prints one JSON line, {"errors": {module:
"ErrorType: message"}, "backend": name or null, "backend_error": what
jax raised instead of picking one, or null}: where another process holds
the chip, jax 0.10.2 with libtpu 0.0.42 on a v5e raises ("Unable to
initialize backend 'tpu': ABORTED: The TPU is already in use by process
with pid N") rather than falling back to the CPU. jax picks its backend once
per process, and a package that fails to import must be named, not mistaken
for a missing TPU: hence a process of its own.

Standard library only (see probes/__init__.py); started by path, never
imported by the tool."""

import importlib
import json
import sys


def main() -> None:
    errors: dict[str, str] = {}
    backend = backend_error = None
    for name in sys.argv[2:]:
        try:
            __import__(name)
        except BaseException as error:  # what a broken package raises is not ours to choose
            errors[name] = f"{type(error).__name__}: {error}".strip().splitlines()[0][:300]
    if "jax" not in errors and sys.argv[1] == "1":
        try:
            backend = importlib.import_module("jax").default_backend()
        except Exception as error:  # the runtime's refusal, said in its own words
            backend_error = f"{type(error).__name__}: {error}".strip().splitlines()[0][:300]
    print(json.dumps({"errors": errors, "backend": backend, "backend_error": backend_error}))


if __name__ == "__main__":
    main()
