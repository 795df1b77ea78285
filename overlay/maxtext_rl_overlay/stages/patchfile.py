"""What a `git format-patch --full-index` file says: its header, its
trailers, and for each file it touches the pre- and post-image blob ids."""

from __future__ import annotations

import dataclasses
import email.parser
import email.policy
import pathlib
import re
from collections.abc import Iterator
from typing import Any

from ..core.errors import OverlayError
from ..core.git import git

UPSTREAM_STATUSES = ("Pending", "Submitted", "Backport", "Inappropriate")
# A backport names the upstream commit it carries: "Backport [<commit URL or id>]".
_BACKPORT_COMMIT = re.compile(r"^Backport \[(?:\S*/commit/)?([0-9a-f]{7,40})\]$")
#: A backport of a change known here only by the release that carries it
#: (its commit is in no repository at hand): `Backport [release VERSION]`.
_BACKPORT_RELEASE = re.compile(r"^Backport \[release (\d[\w.+!-]*)\]$")
_DIFF = re.compile(r"^diff --git a/(.+?) b/(.+)$")
_INDEX = re.compile(r"^index ([0-9a-f]+)\.\.([0-9a-f]+)(?: (\d{6}))?$")
_TRAILER = re.compile(r"^([A-Za-z][A-Za-z0-9-]*): (.+)$")
ZERO = "0" * 40
#: A patch of code that an unpinned stand-in release predates says so, and
#: why: "Unpinned-Source: left out [<why>]". The build leaves it out of an
#: unpinned source (never the pin's), and says so wherever the stand-in is named.
UNPINNED_SOURCE = "Unpinned-Source"
_LEFT_OUT = re.compile(r"^left out \[(.+)\]$")


@dataclasses.dataclass(frozen=True)
class FileChange:
    path: str  # the post-image path (b/...)
    old_path: str
    pre: str  # 40-hex blob id, ZERO for a new file
    post: str  # 40-hex blob id, ZERO for a deleted file
    binary: bool
    mode_change: bool
    has_hunks: bool
    new_mode: str = ""  # the mode of a created file ("100644", "100755")


@dataclasses.dataclass(frozen=True)
class PatchFile:
    path: pathlib.Path
    subject: str
    trailers: dict[str, str]
    files: tuple[FileChange, ...]

    @property
    def name(self) -> str:
        return self.path.name


def parse(path: pathlib.Path) -> PatchFile:
    text = path.read_text(errors="surrogateescape")
    head, sep, diff = text.partition("\n---\n")
    if not sep or "\ndiff --git " not in "\n" + diff:
        raise OverlayError(f"{path} is not a git format-patch file (no '---' separator or no 'diff --git').")
    msg = email.parser.Parser(policy=email.policy.default).parsestr(head)
    subject = re.sub(r"^\[PATCH[^\]]*\]\s*", "", " ".join(str(msg.get("Subject", "")).split()))
    if not subject or msg.get("From") is None:
        raise OverlayError(f"{path} has no From: or Subject: header; re-export it with git format-patch.")
    body = msg.get_payload() if not msg.is_multipart() else ""
    trailers: dict[str, str] = {}
    for line in reversed(str(body).strip().splitlines()):
        m = _TRAILER.match(line.strip())
        if not m:
            break
        trailers.setdefault(m.group(1), m.group(2).strip())
    return PatchFile(path, subject, trailers, tuple(_file_changes(path, diff)))


def _file_changes(path: pathlib.Path, diff: str) -> Iterator[FileChange]:
    current: dict[str, Any] | None = None
    for line in diff.splitlines():
        m = _DIFF.match(line)
        if m:
            if current:
                yield _finish(path, current)
            current = dict(old_path=m.group(1), path=m.group(2), pre=None, post=None, binary=False, mode_change=False, has_hunks=False, new_mode="")
            continue
        if current is None:
            continue
        if (m := _INDEX.match(line)) and current["pre"] is None:
            current["pre"], current["post"] = m.group(1), m.group(2)
        elif line.startswith("new file mode "):
            current["new_mode"] = line.split()[-1]
        elif line.startswith(("old mode ", "new mode ")):
            current["mode_change"] = True
        elif line.startswith(("Binary files ", "GIT binary patch")):
            current["binary"] = True
        elif line.startswith("@@ "):
            current["has_hunks"] = True
    if current:
        yield _finish(path, current)


def _finish(path: pathlib.Path, c: dict[str, Any]) -> FileChange:
    if c["pre"] is None and (c["has_hunks"] or c["binary"]):
        raise OverlayError(f"{path}: the change to {c['path']} has no 'index' line.")
    pre, post = c["pre"] or "", c["post"] or ""
    if (pre or post) and (len(pre) != 40 or len(post) != 40):
        raise OverlayError(
            f"{path}: the 'index' line of {c['path']} has abbreviated blob ids; "
            "re-export the series with git format-patch --full-index."
        )
    return FileChange(c["path"], c["old_path"], pre, post, c["binary"], c["mode_change"], c["has_hunks"], c["new_mode"])


def new_file_content(patch: PatchFile, relpath: str) -> bytes:
    """The whole content of a file the patch creates (from /dev/null): the
    + lines of its hunk, honouring "\\ No newline at end of file"."""
    lines = patch.path.read_bytes().split(b"\n")
    header = f"diff --git a/{relpath} b/{relpath}".encode()
    try:
        i = lines.index(header)
    except ValueError:
        raise OverlayError(f"{patch.path}: it does not create {relpath}.") from None
    while not lines[i].startswith(b"@@ "):
        i += 1
    out: list[bytes] = []
    for line in lines[i + 1 :]:
        if line.startswith(b"+"):
            out.append(line[1:] + b"\n")
        elif line.startswith(b"\\") and out:
            out[-1] = out[-1][:-1]
        else:
            break
    return b"".join(out)


def lint(patch: PatchFile) -> list[str]:
    """What a patch of the series must carry (DEP-3 style), as problems found."""
    problems = []
    status = patch.trailers.get("Upstream-Status", "")
    if status.split(" ", 1)[0] not in UPSTREAM_STATUSES:
        problems.append(
            f"{patch.path}: trailer 'Upstream-Status:' must be one of {', '.join(UPSTREAM_STATUSES)} "
            f"(got {status or 'none'})."
        )
    if status.startswith("Backport") and not (backport_commit(patch) or backport_release(patch)):
        problems.append(
            f"{patch.path}: a backport must name the upstream commit it carries: "
            f"'Upstream-Status: Backport [<commit URL or id>]', or 'Backport [release VERSION]' for a change "
            f"known only by the release that has it (got {status})."
        )
    unpinned = patch.trailers.get(UNPINNED_SOURCE)
    if unpinned is not None and not _LEFT_OUT.match(unpinned):
        problems.append(f"{patch.path}: trailer '{UNPINNED_SOURCE}:' must be 'left out [<why an unpinned stand-in lacks the code it "
                        f"changes>]' (got {unpinned}).")
    if not patch.files:
        problems.append(f"{patch.path}: changes no file.")
    return problems


def left_out_of_unpinned(patch: PatchFile) -> str | None:
    """Why the build leaves `patch` out of an unpinned source, or None: it applies to every source."""
    m = _LEFT_OUT.match(patch.trailers.get(UNPINNED_SOURCE, ""))
    return m.group(1) if m else None


def lint_file(path: pathlib.Path) -> list[str]:
    """The problems of the patch file at `path`; one that cannot be parsed
    is a problem too (lint reports every patch, it does not stop at one)."""
    try:
        patch = parse(path)
    except OverlayError as exc:
        return [str(exc)]
    except (OSError, UnicodeError) as exc:
        return [f"{path}: cannot be read: {exc}"]
    return lint(patch)


def backport_commit(patch: PatchFile) -> str | None:
    """The upstream commit id (7 to 40 hex digits) a backport names, else None."""
    m = _BACKPORT_COMMIT.match(patch.trailers.get("Upstream-Status", ""))
    return m.group(1) if m else None


def backport_release(patch: PatchFile) -> str | None:
    """The upstream release a backport names (`Backport [release VERSION]`), else None."""
    m = _BACKPORT_RELEASE.match(patch.trailers.get("Upstream-Status", ""))
    return m.group(1) if m else None


def patch_id(path: pathlib.Path) -> str:
    """`git patch-id --stable`: the same for the same change wherever it applies."""
    out = git("patch-id", "--stable", input=path.read_bytes(), text=False, what=f"git patch-id of {path.name}").stdout.split()
    if not out:
        raise OverlayError(f"{path}: git patch-id found no diff in it.")
    return bytes(out[0]).decode()
