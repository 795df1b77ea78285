"""Helpers of the fast tests (tests/unit), run in the tool venv; imported as
`unit.unit_support` (pyproject's pythonpath puts tests/ on sys.path). The
project copies and the tool's run they share with the other suites are
support.project's (a rebase's project copy holds tests/support too: the
rebase runs the fast tests on it)."""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import http.server
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator

import pytest

from maxtext_rl_overlay.core import interrupts
from support.project import project_copy, set_pin

#: The tool venv's uv (scripts/setup.sh installs it there).
UV = shutil.which("uv") or str(pathlib.Path(sys.executable).parent / "uv")


def default_signals() -> None:
    """`preexec_fn` of a test that starts the tool and signals it: the
    signals the tool stops on (`interrupts.SIGNALS`) at their defaults in the
    child. A child inherits ignored signals, and a background job of a
    non-interactive shell starts its children with SIGINT and SIGQUIT
    ignored; the tool rightly keeps an ignored signal ignored, so without
    this such a test would hang, or its build run on, depending on how the
    suite was started. (Runs in the child, after the fork: it imports
    nothing.)"""
    for sig in interrupts.SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


def fake_wheel(folder: pathlib.Path, name: str, version: str, requires_python: str | None = ">=3.12", extra: str = "") -> pathlib.Path:
    """A minimal wheel: a package and its METADATA."""
    dist = name.replace("-", "_")
    wheel = folder / f"{dist}-{version}-py3-none-any.whl"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + (f"Requires-Python: {requires_python}\n" if requires_python else "")
    with zipfile.ZipFile(wheel, "w") as zf:  # fixed dates: the same arguments give the same bytes
        zf.writestr(zipfile.ZipInfo(f"{dist}/__init__.py", (1980, 1, 1, 0, 0, 0)), extra)
        zf.writestr(zipfile.ZipInfo(f"{dist}-{version}.dist-info/METADATA", (1980, 1, 1, 0, 0, 0)), meta)
    return wheel


def installable_wheel(folder: pathlib.Path, name: str, version: str, requires: tuple[str, ...] = (),
                      package: dict[str, bytes] | None = None) -> pathlib.Path:
    """An installable wheel: a package, METADATA, WHEEL and RECORD.
    `package`: the wheel's files other than its metadata (by default an
    empty `__init__.py` of the distribution's name)."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = {
        **(package if package is not None else {f"{dist}/__init__.py": b""}),
        f"{info}/METADATA": (f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                             + "".join(f"Requires-Dist: {r}\n" for r in requires)).encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}\n"
                     for n, d in files.items()) + f"{info}/RECORD,,\n"
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for n, d in {**files, f"{info}/RECORD": record.encode()}.items():
            zf.writestr(zipfile.ZipInfo(n, (1980, 1, 1, 0, 0, 0)), d)
    return path


def uv_offline_env(tmp_path: pathlib.Path) -> dict[str, str]:
    # Only the find-links folders (the index is an empty folder: no registry), no user settings; the tool runs this uv.
    (tmp_path / "no-index").mkdir(exist_ok=True)
    return dict(os.environ, UV_DEFAULT_INDEX=(tmp_path / "no-index").as_uri(), UV_PYTHON_DOWNLOADS="never", UV_NO_CONFIG="1",
                UV_CACHE_DIR=str(tmp_path / "uv-cache"),
                PATH=f"{pathlib.Path(UV).parent}{os.pathsep}{os.environ['PATH']}")


def assert_refuses_an_unpinned_base(steps: list[dict], says: str) -> None:
    """The steps' check of MRL_MAXTEXT_IMAGE (a workflow building the image
    over MaxText's): unset or a tag fails the job saying `says`; a base pinned
    by digest goes on."""
    (declared,) = [s for s in steps if "run" in s and "case" in s["run"] and "MAXTEXT_IMAGE" in s["run"]]
    assert declared["env"] == {"MAXTEXT_IMAGE": "${{ vars.MRL_MAXTEXT_IMAGE }}"}
    for value, status in (("", 1), ("gcr.io/p/tpu_post_training:latest", 1), ("gcr.io/p/tpu_post_training@sha256:" + "a" * 64, 0)):
        done = subprocess.run(["bash", "-e", "-c", declared["run"]], env=dict(os.environ, MAXTEXT_IMAGE=value), capture_output=True, text=True)
        assert done.returncode == status and ((says in done.stdout) == bool(status)), (value, done.stdout)


def assert_uploads_every_junit(job: dict, root: pathlib.Path) -> None:
    """`job` (a workflow job running scripts/test-matrix.sh) uploads the
    JUnit XML of every run of every cell the matrix declares, and fails when
    there is none."""
    import fnmatch

    from maxtext_rl_overlay.config.pins import load_project
    from maxtext_rl_overlay.maintain.testmatrix import junit_name, load_matrix

    (upload,) = [s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact") and "junit" in s["with"]["name"]]
    assert upload.get("if") == "always()", "kept when the matrix fails too"
    assert upload["with"].get("if-no-files-found") == "error", "a matrix that wrote no report must not pass unseen"
    path = upload["with"]["path"]
    project = load_project(root)
    matrix = load_matrix(project.options.matrix, where="pyproject.toml", quick=False)
    written = [f"build/test-matrix/cells/{cell.name}/{junit_name(run)}" for cell in matrix.cells for run in cell.runs]
    assert "build/test-matrix/cells/maxtext-0.2.4/junit-maxtext-shims.xml" in written
    missed = [w for w in written if not fnmatch.fnmatch(w, path)]
    assert not missed, f"the upload's path {path!r} misses {missed}"


@contextlib.contextmanager
def served(folder: pathlib.Path) -> Iterator[str]:
    """`folder` served over HTTP on 127.0.0.1 for the block: its URL."""

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kw):
            super().__init__(*args, directory=str(folder), **kw)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


#: Where a MaxText release names its upstream commits (rebase --maxtext reads it).
MAXTEXT_DEPS = "dependencies/extra_deps/post_train_github_deps.txt"


def maxtext_deps(commits: dict[str, str]) -> str:
    """A post_train_github_deps.txt in MaxText's own format (as 0.2.4's wheel has it)."""
    urls = {"google-tunix": "https://github.com/google/tunix/archive/{}.zip",
            "tpu-inference": "https://github.com/vllm-project/tpu-inference/archive/{}.zip",
            "vllm": "git+https://github.com/vllm-project/vllm@{}"}
    return "".join(f"{name} @ {urls[name].format(commit)}\n" for name, commit in commits.items())


def maxtext_release(folder: pathlib.Path, version: str, commits: dict[str, str], base: pathlib.Path | None = None) -> pathlib.Path:
    """A MaxText release wheel of `version` whose deps file names `commits`:
    `base` (a real release wheel) with its dist-info renamed, its Version and
    its deps file rewritten (RECORD is not: the tool reads files from the
    wheel, nothing installs it); without `base`, a wheel holding the deps file."""
    if base is None:
        wheel = fake_wheel(folder, "maxtext", version)
        with zipfile.ZipFile(wheel, "a") as zf:
            zf.writestr(zipfile.ZipInfo(MAXTEXT_DEPS, (1980, 1, 1, 0, 0, 0)), maxtext_deps(commits))
        return wheel
    wheel = folder / f"maxtext-{version}-py3-none-any.whl"
    with zipfile.ZipFile(base) as src, zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as dest:
        old_info = next(n for n in src.namelist() if n.endswith(".dist-info/METADATA")).split("/")[0]
        for info in src.infolist():
            data = src.read(info)
            name = info.filename.replace(old_info, f"maxtext-{version}.dist-info", 1)
            if name == MAXTEXT_DEPS:
                data = maxtext_deps(commits).encode()
            elif name.endswith(".dist-info/METADATA"):
                data = b"".join(f"Version: {version}\n".encode() if line.startswith(b"Version: ") else line
                                for line in data.splitlines(keepends=True))
            dest.writestr(zipfile.ZipInfo(name, info.date_time), data)
    return wheel


class PackageIndex:
    """The wheels of `folder`, served on 127.0.0.1 as a package index's JSON
    simple API (PEP 691: what registry.files reads), in a thread; `url` is
    the index to name in UV_DEFAULT_INDEX. `uploaded` (file name: an RFC 3339
    time) serves each file's PEP 700 `upload-time`, as the registry does
    (what uv's --exclude-newer reads); `yanked`: the files served as yanked.
    Both are read at each request: a test may change them meanwhile."""

    def __init__(self, folder: pathlib.Path, uploaded: dict[str, str] | None = None, yanked: set[str] | None = None):
        self.uploaded = uploaded if uploaded is not None else {}
        self.yanked = yanked if yanked is not None else set()
        index = self
        import http.server
        import json
        import threading

        from packaging.utils import canonicalize_name, parse_wheel_filename

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format, *args):  # noqa: A002 - the base class's name
                pass

            def do_HEAD(self):  # uv asks before it reads a wheel's metadata
                self.do_GET(body=False)

            def do_GET(self, body: bool = True):
                parts = [p for p in self.path.split("?")[0].split("/") if p]
                if len(parts) == 2 and parts[0] == "simple":
                    wheels = [w for w in sorted(folder.glob("*.whl")) if canonicalize_name(parse_wheel_filename(w.name)[0]) == parts[1]]
                    files = [{"filename": w.name, "url": f"/files/{w.name}", "hashes": {"sha256": hashlib.sha256(w.read_bytes()).hexdigest()},
                              **({"upload-time": index.uploaded[w.name]} if w.name in index.uploaded else {}),
                              **({"yanked": True} if w.name in index.yanked else {})} for w in wheels]
                    data = json.dumps({"meta": {"api-version": "1.1" if index.uploaded else "1.0"}, "name": parts[1], "files": files}).encode()
                    kind = "application/vnd.pypi.simple.v1+json"
                elif len(parts) == 2 and parts[0] == "files" and (folder / parts[1]).is_file():
                    data, kind = (folder / parts[1]).read_bytes(), "application/octet-stream"
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if body:
                    self.wfile.write(data)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def __enter__(self) -> PackageIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def maxtext_version(root: pathlib.Path) -> str:
    """The MaxText release pyproject's `maxtext` extra names (0.2.4 today): the
    tests that stand in for its wheel follow it, so that they hold after a
    `rebase --maxtext` move too."""
    from maxtext_rl_overlay.config.pins import load_project

    (text,) = load_project(root).metadata["optional-dependencies"]["maxtext"]
    return text.rsplit("==", 1)[1]


# -- small upstream git repositories and git-tracked project copies ----------

#: A git identity, and no user or system git configuration.
GIT_ENV = {"GIT_AUTHOR_NAME": "u", "GIT_AUTHOR_EMAIL": "u@u", "GIT_COMMITTER_NAME": "u", "GIT_COMMITTER_EMAIL": "u@u",
           "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}


def git(repo: pathlib.Path, *args: str, date: str = "2026-07-27T09:44:06+00:00", **kw) -> str:
    env = dict(os.environ, **GIT_ENV, GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True, **kw).stdout.strip()


def commit_files(repo: pathlib.Path, files: dict[str, str], message: str, date: str) -> str:
    """Write `files` (path: text) in `repo` and commit everything: the commit id."""
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", message, date=date)
    return git(repo, "rev-parse", "HEAD")


def patch_of(repo: pathlib.Path, base: str, files: dict[str, str], message: str, dest: pathlib.Path) -> pathlib.Path:
    """A series' patch: `files` changed on top of `base` (on a branch `patch`,
    left checked out), as git format-patch writes it (--full-index, no commit
    id), with an Upstream-Status trailer."""
    git(repo, "checkout", "-q", "-B", "patch", base)
    commit = commit_files(repo, files, f"{message}\n\nUpstream-Status: Pending", "2026-07-28T00:00:00+00:00")
    dest.write_bytes(subprocess.run(["git", "format-patch", "-1", "--stdout", "--full-index", "--zero-commit", commit], cwd=repo,
                                    check=True, capture_output=True, env=dict(os.environ, **GIT_ENV)).stdout)
    return dest


def pin_series(project: pathlib.Path, dist: str, repo: pathlib.Path, pin: str, patches: list[pathlib.Path]) -> None:
    """Pin `dist` of the project copy to commit `pin` of `repo`, its series `patches` alone."""
    series = project / "patches" / dist
    for old in series.glob("*.patch"):
        old.unlink()
    for patch in patches:
        shutil.copy2(patch, series / patch.name)
    (series / "series").write_text("".join(p.name + "\n" for p in patches))
    set_pin(project, dist, repository=str(repo), commit=pin, tree=git(repo, "rev-parse", f"{pin}^{{tree}}"),
            date=git(repo, "log", "-1", "--format=%cI", pin))


#: The code file of the small tpu-inference upstream below.
SMALL_CODE = "tpu_inference/__init__.py"


def small_upstream(repo: pathlib.Path) -> str:
    """A small tpu-inference upstream in `repo`: the pin (A = 1) on main, and
    a branch `moved` that changes the line the series' patch changes (A = 2).
    The pin's commit."""
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    pin = commit_files(repo, {SMALL_CODE: "A = 1\n", "README.md": "upstream\n"}, "the pin", "2026-07-27T09:44:06+00:00")
    git(repo, "checkout", "-q", "-b", "moved")
    commit_files(repo, {SMALL_CODE: "A = 2\n"}, "A is 2 upstream", "2026-08-01T00:00:00+00:00")
    git(repo, "checkout", "-q", "main")
    return pin


def small_patch(repo: pathlib.Path, base: str, text: str, dest: pathlib.Path) -> pathlib.Path:
    """The series' patch: `text` as SMALL_CODE on top of `base`."""
    return patch_of(repo, base, {SMALL_CODE: text}, "Set A to 3", dest)


def small_project(tmp_path: pathlib.Path, repo: pathlib.Path, pin: str, patch: pathlib.Path) -> pathlib.Path:
    """A git-tracked copy of the project (tmp_path/project): tpu-inference
    pinned to `pin` of `repo`, its series `patch` alone."""
    return series_project(tmp_path / "project", repo, pin, [patch])


def series_project(project: pathlib.Path, repo: pathlib.Path, pin: str, patches: list[pathlib.Path]) -> pathlib.Path:
    """A git-tracked copy of the project in `project`: tpu-inference pinned
    to `pin` of `repo`, its series `patches`."""
    project_copy(project, "constraints.txt", licence=True)
    pin_series(project, "tpu-inference", repo, pin, patches)
    git(project, "init", "-q", "-b", "main")
    commit_files(project, {}, "project copy", "2026-11-01T00:00:00+00:00")
    return project
def _mount(argv: list[str]) -> subprocess.CompletedProcess:
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    return subprocess.run([*sudo, *argv], capture_output=True, text=True)


class SmallFs:
    """A tmpfs of `size` bytes and `inodes` inodes at `path` (a real small
    filesystem, to fill: mounting needs root or passwordless sudo, as on
    CI's runners; without them the test is skipped, saying so). unmount()
    when done."""

    def __init__(self, path: pathlib.Path, size: int, inodes: int):
        self.path = path
        path.mkdir()
        done = _mount(["mount", "-t", "tmpfs", "-o", f"size={size},nr_inodes={inodes},mode=0777", "tmpfs", str(path)])
        if done.returncode != 0:
            pytest.skip(f"needs a small filesystem to fill (a tmpfs mount, as root or with passwordless sudo): mount said {done.stderr.strip()!r}")

    def resize(self, size: int, inodes: int) -> None:
        done = _mount(["mount", "-o", f"remount,size={size},nr_inodes={inodes}", str(self.path)])
        assert done.returncode == 0, done.stderr

    def fill(self) -> None:
        """Take every block and every inode left."""
        with open(self.path / "ballast", "wb") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
        i = 0
        while True:
            try:
                (self.path / f"ballast-{i}").touch()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                break
            i += 1

    def unmount(self) -> None:
        _mount(["umount", "-l", str(self.path)])
