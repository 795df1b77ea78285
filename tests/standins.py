"""Download (once, into the cache) the PyPI sdists that stand in for the pins.

    python tests/standins.py [--dist NAME]...   prints NAME=PATH lines

Each download is checked against the sha256 in tests/standins.toml."""

from __future__ import annotations

import argparse
import pathlib
import tomllib

from maxtext_rl_overlay.cache import buildcache
from maxtext_rl_overlay.config import reader, registry

TABLE = pathlib.Path(__file__).with_name("standins.toml")


def cache_dir() -> pathlib.Path:
    buildcache.claim(reader.cache_dir())  # the tool's cache: tagged before anything goes in
    return reader.cache_dir() / "standins"


def fetch(name: str) -> pathlib.Path:
    spec = tomllib.loads(TABLE.read_text())[name]
    return registry.download(name, spec["sdist"], cache_dir(), kind="standins", sha256=spec["sha256"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dist", action="append", help="only these (default: all)")
    args = parser.parse_args()
    for name in args.dist or list(tomllib.loads(TABLE.read_text())):
        print(f"{name}={fetch(name)}")


if __name__ == "__main__":
    main()
