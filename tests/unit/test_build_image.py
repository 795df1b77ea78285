"""scripts/build-image.sh's argument checks, exit statuses and what it hands
the container engine, with no container: a fake PATH without podman or
docker for the exit-3 case, and a recording stand-in `podman` for the rest
(the real build over a stand-in base: tests/pipeline/test_image.py)."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import zipfile

import pytest

from support import ROOT
from unit.unit_support import served

SCRIPT = ROOT / "scripts" / "build-image.sh"
CONTAINERFILE = ROOT / "image" / "Containerfile"
DIGEST = "sha256:" + "ab" * 32
COMMIT = "f" * 40
VERSION = "0.1.0+mrl.3.eae9b30369cb"

# The stand-in engine: records its arguments and CONTAINERS_CONF's text, and
# answers `build` (an image id in --iidfile) and `image inspect` (a digest).
FAKE_ENGINE = r"""#!/bin/bash
log=$(dirname "$0")/calls.jsonl
python3 - "$@" >>"$log" <<'PY'
import json, os, sys
conf = os.environ.get("CONTAINERS_CONF")
release = os.path.join(sys.argv[-1], "release")
print(json.dumps({"argv": sys.argv[1:], "conf": conf, "conf_text": open(conf).read() if conf else None,
                  "release": sorted(os.listdir(release)) if sys.argv[1] == "build" else None}))
PY
case "$1" in
  build) while [ $# -gt 0 ]; do [ "$1" = --iidfile ] && echo "sha256:$(printf 1%.0s {1..64})" > "$2"; shift; done ;;
  image) echo "sha256:$(printf 2%.0s {1..64})" ;;
esac
"""


def _bin(tmp_path: pathlib.Path, engine: str | None) -> pathlib.Path:
    """A PATH of its own: the tools the script uses, and `engine` (a
    recording stand-in) or neither podman nor docker."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for tool in ("bash", "dirname", "sed", "mktemp", "rm", "mkdir", "cp", "ls", "head", "basename", "cut", "sha256sum",
                 "python3", "cat", "printf", "env", "curl", "awk", "uv"):
        found = shutil.which(tool)
        assert found, tool
        (folder / tool).symlink_to(found)
    if engine:
        (folder / engine).write_text(FAKE_ENGINE)
        (folder / engine).chmod(0o755)
    return folder


def _release(tmp_path: pathlib.Path) -> pathlib.Path:
    release = tmp_path / "dist"
    release.mkdir()
    (release / "constraints.txt").write_text("--find-links .\nmaxtext-rl-overlay==0.1.0\n")
    manifest = {"project": {"commit": COMMIT, "dirty": []}, "distributions": {"x": {"pin": {"commit": "c" * 40}}}}
    with zipfile.ZipFile(release / f"maxtext_rl_overlay-{VERSION}-py3-none-any.whl", "w") as zf:
        zf.writestr("maxtext_rl_overlay/manifest.json", json.dumps(manifest, sort_keys=True, indent=2))
    (release / "google_tunix-0.1.8+mrl.3-py3-none-any.whl").write_bytes(b"wheel")
    return release


def _run(tmp_path: pathlib.Path, *args: str, engine: str | None = "podman", env: dict[str, str] | None = None):
    path = _bin(tmp_path, engine)
    full = {"PATH": str(path), "HOME": str(tmp_path), "TMPDIR": str(tmp_path), **(env or {})}
    return subprocess.run(["/bin/bash", str(SCRIPT), *args], capture_output=True, text=True, env=full, cwd=tmp_path, timeout=60)


def _calls(tmp_path: pathlib.Path) -> list[dict]:
    log = tmp_path / "bin" / "calls.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_neither_podman_nor_docker_exits_3_in_one_line(tmp_path):
    done = _run(tmp_path, "--base", f"maxtext@{DIGEST}", "--release", str(_release(tmp_path)), engine=None)
    assert done.returncode == 3
    assert done.stderr.splitlines() == ["build-image.sh: neither podman nor docker is on PATH: install one of them to build the image"]


@pytest.mark.parametrize("base", ["maxtext:latest", "gcr.io/p/tpu_post_training", f"maxtext@{DIGEST[:-1]}", "maxtext@sha256:" + "AB" * 32])
def test_a_base_not_pinned_by_digest_exits_3_saying_how_to_get_it(tmp_path, base):
    done = _run(tmp_path, "--base", base, "--release", str(_release(tmp_path)))
    assert done.returncode == 3
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"build-image.sh: --base {base} is not pinned by digest (IMAGE@sha256:<64 hex>)")
    assert f"podman image inspect --format '{{{{.Digest}}}}' {base}" in line and f"docker buildx imagetools inspect {base}" in line
    assert _calls(tmp_path) == [], "nothing was built"


@pytest.mark.parametrize("args", [(), ("--base", f"m@{DIGEST}"), ("--release", "dist"), ("--base",), ("--frob",),
                                  ("--base", f"m@{DIGEST}", "--release", "dist", "--install", "all")],
                         ids=["none", "no-release", "no-base", "no-value", "unknown", "bad-install"])
def test_a_wrong_command_line_exits_2_with_the_usage(tmp_path, args):
    done = _run(tmp_path, *args)
    assert done.returncode == 2
    assert done.stderr.startswith("build-image.sh: ") and "Usage: scripts/build-image.sh --base IMAGE@sha256:DIGEST" in done.stderr
    assert _calls(tmp_path) == []


def test_a_folder_that_is_not_a_release_exits_3(tmp_path):
    (tmp_path / "empty").mkdir()
    done = _run(tmp_path, "--base", f"m@{DIGEST}", "--release", str(tmp_path / "empty"))
    assert done.returncode == 3
    assert done.stderr.splitlines() == [f"build-image.sh: {tmp_path / 'empty'} holds no constraints.txt: give a release folder "
                                        "(scripts/build-wheels.sh's dist/) or its URL"]


def test_podman_gets_the_labels_values_its_own_configuration_and_the_digest_is_printed(tmp_path):
    release = _release(tmp_path)
    base = f"localhost/maxtext-standin@{DIGEST}"
    done = _run(tmp_path, "--base", base, "--release", str(release), "--tag", "overlay:test", "--offline", "--install", "replace")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "sha256:" + "2" * 64 + "\n", "the image's digest, alone on stdout"
    build, inspect = _calls(tmp_path)
    argv = build["argv"]
    build_args = dict(a.split("=", 1) for a in argv[argv.index("build"):] if re.match(r"^[A-Z0-9_]+=", a))
    assert build_args == {
        "BASE_IMAGE": base, "BASE_DIGEST": DIGEST, "OVERLAY_VERSION": VERSION, "PROJECT_COMMIT": COMMIT,
        "CONSTRAINTS_SHA256": hashlib.sha256((release / "constraints.txt").read_bytes()).hexdigest(),
        "INSTALL": "replace", "VERIFY_ARGS": "", "OFFLINE": "1",
    }
    # podman's chroot isolation has the host's network only: --offline is uv's --offline there.
    assert argv[argv.index("--isolation") + 1] == "chroot" and "--network" not in argv
    assert argv[argv.index("--tag") + 1] == "overlay:test"
    # Its own containers.conf, for the build only (then removed); nothing of the machine's.
    assert build["conf"] != "/etc/containers/containers.conf" and not pathlib.Path(build["conf"]).exists()
    assert 'runtime = "runc"' in build["conf_text"] and 'default_ulimits = ["nofile=1024:20000", "nproc=4096:4096"]' in build["conf_text"]
    assert "a containers.conf of its own" in done.stderr and "the machine's configuration is unchanged" in done.stderr
    assert inspect["argv"][:2] == ["image", "inspect"]
    assert not list(tmp_path.glob("mrl-image.*")), "its work folder is removed"


def test_the_users_containers_conf_is_kept_and_said(tmp_path):
    conf = tmp_path / "mine.conf"
    conf.write_text("[engine]\n")
    done = _run(tmp_path, "--base", f"m@{DIGEST}", "--release", str(_release(tmp_path)), env={"CONTAINERS_CONF": str(conf)})
    assert done.returncode == 0, done.stderr
    assert _calls(tmp_path)[0]["conf"] == str(conf) and f"your CONTAINERS_CONF={conf}" in done.stderr


def test_docker_is_used_where_podman_is_absent_without_podmans_settings(tmp_path):
    done = _run(tmp_path, "--base", f"m@{DIGEST}", "--release", str(_release(tmp_path)), "--offline", engine="docker")
    assert done.returncode == 0, done.stderr
    build = _calls(tmp_path)[0]
    assert "--isolation" not in build["argv"] and build["conf"] is None
    assert build["argv"][build["argv"].index("--network") + 1] == "none" and "OFFLINE=1" in build["argv"]


def test_the_containerfile_refuses_what_the_script_refuses():
    """The Containerfile checks its own arguments too (a build by hand): a
    base pinned by a 64-hex digest, the digest label's claim, the required
    arguments; verify is the gate; the labels the issue asks for."""
    text = CONTAINERFILE.read_text()
    assert "*@sha256:" + "?" * 64 + ")" in text
    assert "podman image inspect --format '{{.Digest}}' IMAGE, or docker buildx imagetools inspect IMAGE" in text
    assert re.search(r"^RUN maxtext-rl-overlay verify \$\{VERIFY_ARGS\}$", text, re.M)
    labels = set(re.findall(r"^\s*(?:LABEL\s+)?([a-z][\w.-]+)=\"", text, re.M))
    assert {"org.opencontainers.image.base.digest", "org.opencontainers.image.version", "org.opencontainers.image.revision",
            "maxtext-rl-overlay.constraints.sha256"} <= labels
    assert os.access(SCRIPT, os.X_OK)


def _sums(release: pathlib.Path) -> None:
    (release / "SHA256SUMS").write_text("".join(f"{hashlib.sha256(w.read_bytes()).hexdigest()}  {w.name}\n"
                                                for w in sorted(release.glob("*.whl"))))


def test_a_release_url_is_downloaded_and_checked_against_its_sha256sums(tmp_path):
    release = _release(tmp_path)
    _sums(release)
    with served(release) as url:
        done = _run(tmp_path, "--base", f"m@{DIGEST}", "--release", f"{url}/")
    assert done.returncode == 0, done.stderr
    build = _calls(tmp_path)[0]
    assert build["release"] == sorted(["constraints.txt", "SHA256SUMS", *(w.name for w in release.glob("*.whl"))])
    assert f"OVERLAY_VERSION={VERSION}" in build["argv"] and f"PROJECT_COMMIT={COMMIT}" in build["argv"]


def test_a_release_url_whose_files_do_not_match_its_sha256sums_exits_3(tmp_path):
    release = _release(tmp_path)
    _sums(release)
    (release / "google_tunix-0.1.8+mrl.3-py3-none-any.whl").write_bytes(b"another wheel")
    with served(release) as url:
        done = _run(tmp_path, "--base", f"m@{DIGEST}", "--release", url)
    assert done.returncode == 3 and done.stdout == "", "stdout is the digest's alone"
    assert "google_tunix-0.1.8+mrl.3-py3-none-any.whl: FAILED" in done.stderr
    assert done.stderr.splitlines()[-1] == f"build-image.sh: the files downloaded from {url} do not match its SHA256SUMS"
    assert _calls(tmp_path) == [], "nothing was built"


def test_help_is_the_scripts_header_and_nothing_else(tmp_path):
    done = _run(tmp_path, "--help")
    assert done.returncode == 0 and done.stderr == ""
    lines = done.stdout.splitlines()
    assert lines[0].startswith("Build the overlay's image over a MaxText image") and lines[-1] == "constraints.txt)."
    assert any(line.lstrip().startswith("--verify-args") for line in lines) and not any("set -e" in line for line in lines)
