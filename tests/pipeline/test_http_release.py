"""A release served over HTTP: the index folder the build writes, served as
it is by a real HTTP server on 127.0.0.1 (python's http.server, in a thread),
installed with the user's command, and served wrong: a replaced wheel, a
missing wheel, a server that stops in the middle of the install."""

from __future__ import annotations

import contextlib
import functools
import html
import http.server
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import threading
import tomllib
import urllib.request
import uuid
import zipfile
from collections.abc import Callable

import pytest

from maxtext_rl_overlay.stages import indexpages
from support.pipeline import ALL, ROOT, build_standins

pytestmark = pytest.mark.slow

ENV = dict(os.environ, UV_PYTHON_DOWNLOADS="never")
# Every wheel of the index; the overlay alone installs all but MaxText's plugin.
OURS = ("google-tunix", "maxtext-rl-overlay", "maxtext-vllm-adapter", "tpu-inference", "vllm")
ALONE = tuple(name for name in OURS if name != "maxtext-vllm-adapter")


class _HTTPServer(http.server.ThreadingHTTPServer):
    """The server, with what its handler reads: the paths asked, the stall
    rule, and the events of a stalled download."""

    def __init__(self, handler: functools.partial[_Handler], stall: Callable[[str], bool] | None) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        self.daemon_threads = True
        self.block_on_close = False
        self.requests: list[str] = []
        self.stall = stall
        self.stalled = threading.Event()
        self.stopping = threading.Event()


class _Handler(http.server.SimpleHTTPRequestHandler):
    server: _HTTPServer

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        self.server.requests.append(self.path)

    def do_GET(self):
        stall = self.server.stall
        if stall and not self.server.stalled.is_set() and stall(self.path.split("?")[0]):
            # Send the headers and half the wheel, then hang until the test
            # stops the server: a server going away in the middle of a download.
            path = pathlib.Path(self.translate_path(self.path))
            data = path.read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.server.stalled.set()
            self.server.stopping.wait(120)
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        super().do_GET()


class Server:
    """http.server over `root` on 127.0.0.1, an ephemeral port, in a thread."""

    def __init__(self, root: pathlib.Path, *, stall=None):
        """stall(path) -> bool: the first GET it says yes to gets half the file,
        then the connection hangs until stop()."""
        self.httpd = _HTTPServer(functools.partial(_Handler, directory=str(root)), stall)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def requests(self) -> list[str]:
        return self.httpd.requests

    def stop(self) -> None:
        if not self.httpd.stopping.is_set():
            self.httpd.stopping.set()
            self.httpd.shutdown()
            self.httpd.server_close()
            self.thread.join(10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


@pytest.fixture(scope="module")
def release(built) -> pathlib.Path:
    """The session's stand-in build, vLLM included (relative links, no
    --base-url): the folder any static server can serve as a release."""
    return built[0]


def _site(release: pathlib.Path, tmp_path: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """A web root with a copy of the release below a path unique to the test
    (uv caches by URL: a wheel another test fetched is not fetched again)."""
    root = tmp_path / "www"
    rel = f"releases/{uuid.uuid4().hex[:8]}/v0.1.0"
    shutil.copytree(release, root / rel)
    return root, root / rel


@pytest.fixture
def venv(tmp_path):
    path = tmp_path / "venv"
    subprocess.run(["uv", "venv", "-q", "-p", sys.executable, str(path)], check=True, env=ENV)
    yield path
    shutil.rmtree(path, ignore_errors=True)  # the whole stack: GBs of hard links


def _install(venv: pathlib.Path, constraints: str, *extra: str, cwd: pathlib.Path | None = None) -> subprocess.CompletedProcess:
    """The user's command: uv pip install -c <constraints> maxtext-rl-overlay."""
    cmd = ["uv", "pip", "install", "-p", str(venv / "bin" / "python"), "-c", constraints, "maxtext-rl-overlay", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=cwd or venv.parent, timeout=900)


def _verify(venv: pathlib.Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / "maxtext-rl-overlay"), "verify", *flags], capture_output=True, text=True, cwd=venv.parent)


def _installed(venv: pathlib.Path) -> set[str]:
    names = {p.name.split("-")[0].replace("_", "-").lower() for p in venv.glob("lib/python3.*/site-packages/*.dist-info")}
    return names


def _nothing_installed(venv: pathlib.Path) -> None:
    """Nothing of the release, and nothing at all: uv installs only once
    every wheel is downloaded and checked. And no verify that could say yes."""
    assert _installed(venv) == set(), _installed(venv)
    assert not (venv / "bin" / "maxtext-rl-overlay").exists()


def _wheel(folder: pathlib.Path, dist: str) -> pathlib.Path:
    (wheel,) = folder.glob(dist.replace("-", "_") + "-*.whl")
    return wheel


def test_served_release_installs_with_the_users_command(release, tmp_path, venv):
    root, folder = _site(release, tmp_path)
    with Server(root) as server:
        url = f"{server.url}/{folder.relative_to(root).as_posix()}/constraints.txt"
        proc = _install(venv, url)
        assert proc.returncode == 0, proc.stderr
    assert _installed(venv) >= set(ALONE)
    ok = _verify(venv)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "verify: yes" in ok.stdout
    # Every wheel came from the server, by its relative link.
    # (MaxText and its plugin are installed only with the `maxtext` extra.)
    fetched = {p.rsplit("/", 1)[-1] for p in server.requests if p.endswith(".whl")}
    assert fetched == {urllib.request.pathname2url(w.name) for w in release.glob("*.whl")
                       if not w.name.startswith(("maxtext_vllm_adapter-", "maxtext-"))}


def test_simple_tree_is_pep503_and_usable_as_an_index(release, tmp_path, venv):
    sums = dict(reversed(line.split()) for line in (release / "SHA256SUMS").read_text().splitlines())
    projects = (release / "simple" / "index.html").read_text()
    for project in OURS:
        assert f'<a href="{project}/">{project}</a>' in projects
    for name, sha in sums.items():
        project = name.split("-")[0].replace("_", "-")
        page = (release / "simple" / project / "index.html").read_text()
        assert f'href="../../{urllib.request.pathname2url(name)}#sha256={sha}"' in page
        assert f">{name}</a>" in page
    # The overlay wheel's Requires-Python, as pyproject.toml says it (the tool runs on Python 3.11).
    requires = html.escape(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"])
    assert f'data-requires-python="{requires}"' in (release / "simple" / "maxtext-rl-overlay" / "index.html").read_text()
    root, folder = _site(release, tmp_path)
    with Server(root) as server:
        index = f"{server.url}/{folder.relative_to(root).as_posix()}/simple/"
        proc = subprocess.run(
            ["uv", "pip", "install", "-p", str(venv / "bin" / "python"), "--no-deps", "--index-url", index, *OURS],
            capture_output=True, text=True, env=ENV,
        )
    assert proc.returncode == 0, proc.stderr
    assert _installed(venv) == set(OURS)
    assert any(p.startswith(f"/{folder.relative_to(root).as_posix()}/simple/tpu-inference/") for p in server.requests)


def test_base_url_names_the_index_so_a_copy_of_constraints_works_anywhere(tmp_path, standin, cache_dir, venv):
    """--base-url: the server's URL is known before the build, the build writes
    it into constraints.txt; a downloaded copy of that file, in a folder with
    no wheels, installs from the server. The matrix's local view of the same
    folder installs the local wheels, with the server gone."""
    root = tmp_path / "www"
    root.mkdir()
    with Server(root) as server:
        base = f"{server.url}/rel/v0.1.0"
        out = root / "rel" / "v0.1.0"
        build_standins(ROOT, out, standin, cache_dir, "--base-url", base, only=ALL)
        text = (out / "constraints.txt").read_text()
        assert f"--find-links {base}/\n" in text and "--find-links .\n" not in text
        assert f"uv pip install -c {base}/constraints.txt maxtext-rl-overlay" in text
        # The project's constraints.txt still names the local folder.
        assert "--find-links ./v0.1.0\n" in (out.parent / "constraints.txt").read_text()
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        (elsewhere / "constraints.txt").write_bytes(urllib.request.urlopen(f"{base}/constraints.txt").read())
        proc = _install(venv, "constraints.txt", cwd=elsewhere)
        assert proc.returncode == 0, proc.stderr
        assert any(p.endswith(".whl") for p in server.requests)
    # The release's files, installed (that these wheels import is the served install's test: ~45 s a verify).
    ok = _verify(venv, "--no-imports")
    assert ok.returncode == 0, ok.stdout + ok.stderr

    local = indexpages.local_view(out, tmp_path / "local")
    assert local != out / "constraints.txt" and "--find-links .\n" in local.read_text()
    dry = subprocess.run(["uv", "pip", "install", "--dry-run", "-p", str(venv / "bin" / "python"), "--reinstall",
                          "-c", str(local), "maxtext-rl-overlay"], capture_output=True, text=True, env=ENV)
    assert dry.returncode == 0, dry.stderr  # the server is stopped: these are the local wheels


def _replace_with_other_wheel(wheel: pathlib.Path) -> None:
    """Another valid wheel under the same name: the same files and one more."""
    other = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(other, "w") as dst:
        for item in src.infolist():
            dst.writestr(item, src.read(item))
        dst.writestr("tpu_inference/_replaced.py", "print('not the overlay build')\n")
    other.replace(wheel)


def test_replaced_wheel_fails_on_its_hash_and_installs_nothing(release, tmp_path, venv):
    root, folder = _site(release, tmp_path)
    wheel = _wheel(folder, "tpu-inference")
    _replace_with_other_wheel(wheel)
    with Server(root) as server:
        proc = _install(venv, f"{server.url}/{folder.relative_to(root).as_posix()}/constraints.txt")
    assert proc.returncode != 0
    assert "Hash mismatch" in proc.stderr and "tpu-inference" in proc.stderr, proc.stderr
    assert (release / "SHA256SUMS").read_text().split(wheel.name)[0].split()[-1] in proc.stderr  # the expected sha256
    _nothing_installed(venv)


def test_missing_wheel_is_a_clear_error(release, tmp_path, venv):
    root, folder = _site(release, tmp_path)
    wheel = _wheel(folder, "tpu-inference")
    wheel.unlink()
    with Server(root) as server:
        proc = _install(venv, f"{server.url}/{folder.relative_to(root).as_posix()}/constraints.txt")
    assert proc.returncode != 0
    # uv names the file it could not fetch, by its URL, and the status.
    assert "404" in proc.stderr and f"/{urllib.request.pathname2url(wheel.name)}" in proc.stderr, proc.stderr
    _nothing_installed(venv)


@pytest.mark.parametrize("phase", ["resolving", "downloading"])
def test_server_stopped_mid_install_leaves_nothing_verify_calls_good(release, tmp_path, venv, phase):
    """The server goes away with half a wheel sent: while uv reads the wheels'
    metadata to resolve, or once it has resolved and downloads what it will
    install."""
    root, folder = _site(release, tmp_path)
    wheel = urllib.request.pathname2url(_wheel(folder, "tpu-inference").name)
    rel = folder.relative_to(root).as_posix()
    resolved = threading.Event()
    stall = (lambda path: path.endswith("/" + wheel)) if phase == "resolving" else (lambda path: resolved.is_set() and path.endswith(".whl"))
    lines: list[str] = []
    with Server(root, stall=stall) as server:
        cmd = ["uv", "pip", "install", "-p", str(venv / "bin" / "python"), "-c", f"{server.url}/{rel}/constraints.txt", "maxtext-rl-overlay"]
        proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=ENV, cwd=tmp_path)
        stderr = proc.stderr
        assert stderr is not None

        def read():
            for line in stderr:
                lines.append(line)
                if line.startswith("Resolved "):
                    resolved.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            while not server.httpd.stalled.wait(0.5) and proc.poll() is None:
                pass
            assert server.httpd.stalled.is_set(), f"uv fetched no wheel while {phase}:\n" + "".join(lines)
            server.stop()  # half the wheel sent: the server goes away
            proc.wait(timeout=300)
            reader.join(10)
        finally:
            if proc.poll() is None:
                proc.kill()
    err = "".join(lines)
    assert proc.returncode != 0, err
    assert ".whl" in err and server.url in err, err  # uv names what it could not fetch
    assert resolved.is_set() == (phase == "downloading"), err
    _nothing_installed(venv)
    if (venv / "bin" / "maxtext-rl-overlay").exists():  # belt and braces: whatever is there is not "good"
        assert _verify(venv).returncode != 0
    # The server back (any port: the links are relative): the same command works.
    with Server(root) as again:
        done = _install(venv, f"{again.url}/{rel}/constraints.txt")
        assert done.returncode == 0, done.stderr
    assert _verify(venv).returncode == 0
