"""Benchmark: a warm overlay build against plain `uv build --wheel` of the
same unpatched sources, in one run. Prints figures; asserts nothing.

    .venv/bin/python tests/bench/bench_build.py NAME=PATH [NAME=PATH ...]

Each NAME=PATH is a --source of the build (git mirror, tree or sdist). The
overlay build is timed whole (sources from the warm cache, patching, wheels,
overlay wheel, index, closure resolution); the baseline builds the very source
trees the overlay build checked out, unpatched, one `uv build --wheel` each.
The closure is resolved with PyPI's torch (--torch-standin): the PyTorch CPU
index is out of reach where this runs. The load averages before and after
say whether other jobs shared the machine during the run.
"""

from __future__ import annotations

import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

from support import ROOT

RUNS = 3


def timed(cmd: list[str], **kw) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, **kw)
    return time.perf_counter() - start


def main(pairs: list[str]) -> None:
    names = [p.split("=", 1)[0] for p in pairs]
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-build-") as folder:
        tmp = pathlib.Path(folder)
        cache = tmp / "cache"
        env = dict(os.environ, MRL_CACHE_DIR=str(cache), UV_PYTHON_DOWNLOADS="never")
        build = [sys.executable, "-m", "maxtext_rl_overlay", "build", "--project", str(ROOT), "--unpinned", "--torch-standin",
                 "--only", ",".join(names), "--out", str(tmp / "dist"), "--constraints", str(tmp / "constraints.txt")]
        for pair in pairs:
            build += ["--source", pair]
        timed(build, env=env)  # warm-up: fills the source cache and uv's caches
        overlay = [timed(build, env=env) for _ in range(RUNS)]
        trees = sorted((cache / "sources").iterdir())
        plain_env = dict(env, SOURCE_DATE_EPOCH="1785000000", VLLM_VERSION_OVERRIDE="0.0.0")
        for t in trees:  # warm-up of the baseline's build environments
            timed(["uv", "build", "--wheel", "--python", sys.executable, "--out-dir", str(tmp / "plain"), str(t)], env=plain_env)
        plain = [sum(timed(["uv", "build", "--wheel", "--python", sys.executable, "--out-dir", str(tmp / "plain"), str(t)], env=plain_env)
                     for t in trees) for _ in range(RUNS)]
    o, p = statistics.median(overlay), statistics.median(plain)
    print(f"upstreams: {', '.join(names)}; median of {RUNS} warm runs each")
    print(f"overlay build (patch + wheels + overlay wheel + index + constraints): {o:.2f} s")
    print(f"plain uv build --wheel of the same unpatched trees:                  {p:.2f} s")
    load = lambda a: " ".join(f"{x:.2f}" for x in a)  # noqa: E731
    print(f"load average (1, 5, 15 min) before: {load(load_before)}; after: {load(os.getloadavg())}; cpus: {os.cpu_count()}")
    print(f"overhead_ratio={o / p:.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
