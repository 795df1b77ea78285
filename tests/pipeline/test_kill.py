"""A real build killed at an instant (SIGKILL to its whole process group: no
cleanup runs, as with the OOM killer or a lost machine), then built again in
the same cache:

- right after the kill, the index and constraints.txt are exactly the
  previous release or exactly the new one (or, killed between the index's
  swap and the file's rename, the new index with the old file and the
  record that lets the next build finish the pair);
- the next build exits 0 and gives, byte for byte, what a build of the same
  project in an empty cache gives, every hash of its constraints.txt naming
  a wheel of the index beside it;
- after it, nothing partial is left beside the index or in the cache.

A build whose index's filesystem fills is status 3, the previous release
whole, and with room the next build is a clean one's.

The release differs from the previous one (its revision is one higher), so
old and new can be told apart. CI runs the kill points of CI_POINTS;
MRL_KILL_POINTS=all runs every one of KILL_POINTS."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from maxtext_rl_overlay.config.pins import load_project
from maxtext_rl_overlay.stages import constraintsfile
from support import ROOT
from support.pipeline import build_standins
from unit.unit_support import SmallFs

pytestmark = pytest.mark.slow

#: Where to kill: a line of the build's output (killed `delay` seconds after
#: it), or "" for the publication: as soon as the record of the
#: index-and-file pair appears, i.e. inside the fsync, the swap and the
#: renames; and in which cache: "cold" (empty: the build makes every entry,
#: and is killed making one) or "warm" (the one the clean build of the same
#: release filled, shared by the warm points: a kill can damage it for the next).
KILL_POINTS = {
    "unpacking the first source": ("[google-tunix] unpacking", 0.0, "cold"),
    "the first wheel's build": ("[google-tunix] building the wheel", 0.5, "cold"),
    "the second wheel's build": ("[tpu-inference] building the wheel", 0.5, "cold"),
    "the overlay wheel's build": ("[maxtext-rl-overlay] building the wheel", 0.2, "cold"),
    "the closure's resolution": ("[constraints] resolving the closure", 2.0, "cold"),
    "the publication": ("", 0.0, "warm"),
}
CI_POINTS = ("the second wheel's build", "the publication")
POINTS = tuple(KILL_POINTS) if os.environ.get("MRL_KILL_POINTS") == "all" else CI_POINTS
ONLY = ("google-tunix", "tpu-inference")


def _snapshot(top: pathlib.Path) -> dict[str, bytes]:
    files = {str(p.relative_to(top)): p.read_bytes() for p in (top / "dist").rglob("*") if p.is_file()} if (top / "dist").is_dir() else {}
    if (top / "constraints.txt").is_file():
        files["constraints.txt"] = (top / "constraints.txt").read_bytes()
    return files


def _args(project: pathlib.Path, top: pathlib.Path, standin: dict[str, pathlib.Path]) -> list[str]:
    args = [sys.executable, "-m", "maxtext_rl_overlay", "build", "--unpinned", "--torch-standin", "--only", ",".join(ONLY),
            "--out", str(top / "dist"), "--constraints", str(top / "constraints.txt"), "--project", str(project)]
    for name in ONLY:
        args += ["--source", f"{name}={standin[name]}"]
    return args


def _env(cache: pathlib.Path) -> dict[str, str]:
    return dict(os.environ, MRL_CACHE_DIR=str(cache), UV_PYTHON_DOWNLOADS="never")


def _default_signals() -> None:
    # A background job starts its children with SIGINT and SIGQUIT ignored: the build gets the defaults.
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def _kill_at(point: str, project: pathlib.Path, top: pathlib.Path, standin, cache: pathlib.Path) -> str:
    """Run the build, SIGKILL its whole process group at `point`; its output."""
    needle, delay, _ = KILL_POINTS[point]
    journal = top / ".constraints.txt.publishing"
    proc = subprocess.Popen(_args(project, top, standin), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env(cache),
                            start_new_session=True, preexec_fn=_default_signals)
    seen: list[str] = []
    hit = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            seen.append(line)
            if needle and line.startswith(needle):
                hit.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    killed = False
    deadline = time.monotonic() + 1500
    while proc.poll() is None and time.monotonic() < deadline:
        if (needle and hit.is_set()) or (not needle and journal.exists()):
            time.sleep(delay)
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the build and every program it runs (uv, its builds)
                killed = True
            except ProcessLookupError:
                pass
            break
        time.sleep(0.001)
    code = proc.wait(timeout=60)
    reader.join(timeout=10)
    assert killed and code == -signal.SIGKILL, f"the build ended (status {code}) before {point}:\n{''.join(seen)}"
    return "".join(seen)


def _hashes_name_the_index(top: pathlib.Path) -> None:
    text = (top / "constraints.txt").read_text()
    sums = dict(line.split()[::-1] for line in (top / "dist" / "SHA256SUMS").read_text().splitlines())
    for name, sha in sums.items():
        assert f"--hash=sha256:{sha}" in text, f"{name} is in the index but constraints.txt does not pin it"
    ours = re.findall(r"^(google-tunix|tpu-inference|maxtext-rl-overlay)==\S+ \\\n    --hash=sha256:([0-9a-f]{64})", text, re.M)
    assert len(ours) == 3 and all(sha in sums.values() for _, sha in ours), ours


def _no_leftovers(top: pathlib.Path, cache: pathlib.Path) -> None:
    beside = sorted(p.name for p in top.iterdir())
    assert beside == [".constraints.txt.lock", ".dist.lock", "constraints.txt", "dist"], beside
    partial = [str(p.relative_to(cache)) for p in cache.glob("*/*") if ".partial-" in p.name or re.search(r"\.[0-9a-f]{8}$", p.name)]
    assert not partial, f"left in the cache: {partial}"


@pytest.fixture(scope="module")
def releases(tmp_path_factory, standin):
    """The previous release (revision N) and the new one (N+1) as a build
    in an empty cache makes it: what a killed build must leave or give."""
    top = tmp_path_factory.mktemp("kill")
    project = top / "project"
    project.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, project / name)
    for name in ("overlay", "patches"):
        shutil.copytree(ROOT / name, project / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "manifest.json"))
    old = top / "old"
    build_standins(project, old / "dist", standin, top / "old-cache")
    text = (project / "pyproject.toml").read_text()
    found = re.search(r"^revision = (\d+)$", text, re.M)
    assert found, "pyproject.toml names its revision"
    revision = int(found.group(1))
    (project / "pyproject.toml").write_text(re.sub(r"^revision = \d+$", f"revision = {revision + 1}", text, flags=re.M))
    new = top / "new"
    build_standins(project, new / "dist", standin, top / "empty-cache")
    before, after = _snapshot(old), _snapshot(new)
    assert before != after
    # Both resolved against the registry as of the project's cutoff: what the registry gets during the run
    # (a release uploaded between the builds) cannot make the build after a kill differ from these.
    cutoff = load_project(project).resolution_cutoff
    for release in (before, after):
        assert constraintsfile.recorded_cutoff(release["constraints.txt"].decode()) == cutoff
    return project, before, after, top / "empty-cache"  # now warm: what the warm points build in


@pytest.mark.timeout(3600)
@pytest.mark.parametrize("point", POINTS)
def test_a_build_killed_at_an_instant_leaves_old_or_new_and_the_next_build_is_a_clean_ones(releases, standin, tmp_path, point,
                                                                                              record_property):
    project, old, new, warm = releases
    cache = warm if KILL_POINTS[point][2] == "warm" else tmp_path / "cold-cache"
    top = tmp_path / "rel"
    (top / "dist").mkdir(parents=True)
    for name, data in old.items():
        (top / name).parent.mkdir(parents=True, exist_ok=True)
        (top / name).write_bytes(data)
    output = _kill_at(point, project, top, standin, cache)
    now = _snapshot(top)
    pending = (top / ".constraints.txt.publishing").exists()
    index_only = {k: v for k, v in now.items() if k != "constraints.txt"}
    mixed = pending and index_only == {k: v for k, v in new.items() if k != "constraints.txt"} and now["constraints.txt"] == old["constraints.txt"]
    assert now in (old, new) or mixed, f"killed at {point}: neither the previous release nor the new one:\n{output}"
    if now in (old, new):
        _hashes_name_the_index(top)
    state = "the previous release" if now == old else "the new release" if now == new else "the new index, the old constraints.txt"
    leftovers = sorted(p.name for p in top.iterdir() if p.name not in (".constraints.txt.lock", ".dist.lock", "constraints.txt", "dist"))
    again = subprocess.run(_args(project, top, standin), capture_output=True, text=True, env=_env(cache), timeout=3000)
    assert again.returncode == 0, again.stderr
    said = [line for line in again.stderr.splitlines() if "stopped" in line or "ignoring a damaged" in line]
    record_property("after_the_kill", f"{state}; beside it: {leftovers}; the next build: {said}")
    print(f"\nkilled at {point}: {state}; beside it: {leftovers}; the next build said: {said}")
    assert _snapshot(top) == new, "the build after the kill is not what a build in an empty cache gives"
    _hashes_name_the_index(top)
    _no_leftovers(top, cache)


def test_a_build_onto_a_full_disk_is_status_3_and_with_room_the_next_one_is_a_clean_ones(releases, standin, tmp_path):
    """The other way a build stops where it stands: the index's filesystem
    fills while the new index is staged beside the previous one."""
    project, old, new, warm = releases
    size = sum(len(v) for v in old.values()) + sum(len(v) for v in new.values()) // 2 + (256 << 10)
    fs = SmallFs(tmp_path / "small", size, 4096)
    try:
        top = fs.path
        for name, data in old.items():
            (top / name).parent.mkdir(parents=True, exist_ok=True)
            (top / name).write_bytes(data)
        full = subprocess.run(_args(project, top, standin), capture_output=True, text=True, env=_env(warm), timeout=3000)
        assert full.returncode == 3, full.stderr
        assert "Traceback" not in full.stderr, full.stderr
        (line,) = [line for line in full.stderr.splitlines() if "error:" in line]
        assert line.startswith(f"maxtext-rl-overlay: error: no space left on device: cannot write {top / 'dist'}. "), line
        print(f"\nthe index's filesystem full: {line}")
        assert _snapshot(top) == old, "the previous release is not whole"
        fs.resize(8 * size, 4096)
        again = subprocess.run(_args(project, top, standin), capture_output=True, text=True, env=_env(warm), timeout=3000)
        assert again.returncode == 0, again.stderr
        assert _snapshot(top) == new, "with room, the build is not what a build in an empty cache gives"
        _no_leftovers(top, warm)
    finally:
        fs.unmount()
