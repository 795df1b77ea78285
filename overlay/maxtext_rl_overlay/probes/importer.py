"""verify's question "does the stack import?": each module named in argv
imported in turn, in a fresh interpreter of the environment verified ("" first
on sys.path, as for `python -c`); each outcome printed as one JSON line,
[module, ""] or [module, "ErrorType: message (file:line)"], as it comes (a
module that kills the interpreter leaves the earlier lines).

Standard library only (see probes/__init__.py); started by path, never
imported by the tool."""

import importlib
import json
import sys
import traceback


def main() -> None:
    for name in sys.argv[1:]:
        try:
            importlib.import_module(name)
            print(json.dumps([name, ""]), flush=True)
        except BaseException as exc:  # what a broken package raises is not ours to choose
            where = traceback.extract_tb(exc.__traceback__)[-1]
            print(json.dumps([name, f"{type(exc).__name__}: {exc} ({where.filename}:{where.lineno})"]), flush=True)


if __name__ == "__main__":
    main()
