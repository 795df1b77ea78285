"""Carry a distribution's patch series onto a new upstream commit.

    scripts/rebase.sh NAME NEW_REF [--source PATH] [--build] [--apply-vllm-lkg]
    scripts/rebase.sh NAME NEW_REF --find-base [--source PATH]
    scripts/rebase.sh --continue | --abort

The series is applied with `git am -3`, one patch at a time, in a work clone
of the upstream at build/rebase/<NAME>/ (gitignored). Per patch the outcome
is one of OUTCOMES. On success the series is re-exported in place (same file
names; author, author date and message kept, so an unchanged patch gives no
diff), the pin is moved (commit, tree, date, version: values edited in place,
comments kept), optionally the wheels and constraints.txt are rebuilt, and the
fast tests run. On a conflict the command stops, leaving the work clone at
the conflicting patch; `--continue` resumes once the person has resolved and
`git add`ed there, `--abort` restores every file the rebase may touch from
the backup taken before the first change (build/rebase/state/).

A patch that upstream already contains (it reverse-applies cleanly, or its
3-way merge changes nothing) is dropped: its file is deleted and its line in
`series` becomes a comment recording where upstream has it:

    # Applied-Upstream: 0002-x.patch in <upstream commit> ("subject"); dropped by scripts/rebase.sh onto <new pin commit>

<upstream commit> is the upstream commit with the same `git patch-id` when
there is one between the old and the new pin, else the new pin commit itself.

Git here (work clone, format-patch) runs without the user's or the system's
git configuration, so that exports are the same on every machine.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time
import tomllib

from . import patchfile, sources
from .errors import OverlayError
from .pins import DISTRIBUTIONS, Pin, load_project, set_pin_values
from .progress import step

APPLIED_CLEANLY = "applied cleanly"
APPLIED_3WAY = "applied with 3-way merge"
DROPPED = "dropped: already upstream"
DROPPED_BY_HAND = "dropped: resolved to upstream's version by hand"
CONFLICT = "CONFLICT"
RESOLVED = "conflict resolved by hand"
PENDING = "not reached"
OUTCOMES = (APPLIED_CLEANLY, APPLIED_3WAY, DROPPED, DROPPED_BY_HAND, CONFLICT, RESOLVED, PENDING)

_GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_COMMITTER_NAME": "maxtext-rl-overlay rebase",
    "GIT_COMMITTER_EMAIL": "maxtext-rl-overlay@localhost",
    "GIT_EDITOR": "true",
    # The identity of the work clone's own commits (the stand-in base); the
    # patches keep their authors (git am takes them from the patch).
    "GIT_CONFIG_COUNT": "2",
    "GIT_CONFIG_KEY_0": "user.name",
    "GIT_CONFIG_VALUE_0": "maxtext-rl-overlay rebase",
    "GIT_CONFIG_KEY_1": "user.email",
    "GIT_CONFIG_VALUE_1": "maxtext-rl-overlay@localhost",
}
_EXPORT = ("format-patch", "-1", "--stdout", "--full-index", "--zero-commit", "--no-signature", "--no-numbered")
VLLM_LKG = ".buildkite/vllm_lkg.version"


@dataclasses.dataclass
class RebaseOptions:
    project_root: pathlib.Path
    name: str
    new_ref: str
    source: str | None = None  # a local git repository or mirror of the upstream
    build: bool = False  # rebuild the wheels and constraints.txt at the end
    build_sources: dict[str, str] = dataclasses.field(default_factory=dict)  # the other upstreams, for --build
    standins: bool = False  # --build as `build --unpinned --torch-standin`: stand-ins where the real inputs are out of reach
    apply_vllm_lkg: bool = False
    run_tests: bool = True
    cache: pathlib.Path | None = None


@dataclasses.dataclass
class Report:
    name: str
    old: dict[str, str]  # the pin before: commit, tree, date, version
    new: dict[str, str]  # the pin after (commit known from the start)
    patches: list[dict]  # name, subject, outcome, detail
    stopped: bool = False  # at a conflict: --continue or --abort
    message: str = ""  # what to do next, or notes
    notes: list[str] = dataclasses.field(default_factory=list)
    tests: str = ""  # the fast tests' summary line
    tests_ok: bool = True
    seconds: float = 0.0


# --------------------------------------------------------------- git helpers


def _git(*args: str, cwd: pathlib.Path | None = None, git_dir: pathlib.Path | None = None, check: bool = True,
         input: bytes | None = None, text: bool = True) -> subprocess.CompletedProcess:
    cmd = ["git"] + ([f"--git-dir={git_dir}"] if git_dir else []) + list(args)
    proc = subprocess.run(cmd, cwd=cwd, env=dict(os.environ, **_GIT_ENV), capture_output=True, input=input, text=text if input is None else False)
    if check and proc.returncode != 0:
        err = proc.stderr if isinstance(proc.stderr, str) else proc.stderr.decode(errors="replace")
        raise OverlayError(f"git {' '.join(args[:3])} failed in {cwd or git_dir}: {err.strip()}")
    return proc


def _out(*args: str, **kw) -> str:
    return _git(*args, **kw).stdout.strip()


# ----------------------------------------------------------------- state


def _paths(root: pathlib.Path, name: str = "") -> dict[str, pathlib.Path]:
    base = root / "build" / "rebase"
    return {"base": base, "state": base / "state", "work": base / name if name else base, "find": base / f"{name}.find-base"}


def _touched(name: str) -> list[str]:
    """Every project file a rebase of `name` may write (relative to the root);
    patches/<name>/ is backed up whole, as a folder."""
    return [f"patches/{name}", "patches/vllm/pin.toml", "constraints.txt"]


def _save(state_dir: pathlib.Path, state: dict) -> None:
    tmp = state_dir / "state.json.tmp"
    tmp.write_text(json.dumps(state, indent=1))
    os.replace(tmp, state_dir / "state.json")


def _load(root: pathlib.Path) -> dict:
    f = _paths(root)["state"] / "state.json"
    if not f.is_file():
        raise OverlayError(f"no rebase is in progress ({f} does not exist): start one with scripts/rebase.sh NAME NEW_REF.")
    return json.loads(f.read_text())


def _backup(root: pathlib.Path, name: str, state_dir: pathlib.Path) -> None:
    backup = state_dir / "backup"
    for rel in _touched(name):
        src = root / rel
        if src.is_dir():
            shutil.copytree(src, backup / rel, symlinks=True)
        elif src.exists():
            (backup / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, backup / rel)


def _restore(root: pathlib.Path, name: str, state_dir: pathlib.Path) -> None:
    backup = state_dir / "backup"
    for rel in _touched(name):
        dest, saved = root / rel, backup / rel
        if dest.is_dir():
            shutil.rmtree(dest)
        elif dest.exists() or dest.is_symlink():
            dest.unlink()
        if saved.is_dir():
            shutil.copytree(saved, dest, symlinks=True)
        elif saved.exists():
            shutil.copy2(saved, dest)


def _refuse_dirty(root: pathlib.Path) -> None:
    proc = _git("status", "--porcelain", "--untracked-files=all", "--", "patches", "constraints.txt", cwd=root, check=False)
    if proc.returncode != 0:
        raise OverlayError(
            f"{root} is not a git checkout ({proc.stderr.strip()}): the rebase needs one, so that its result "
            "can be reviewed with git diff and the checkout's state checked first."
        )
    if proc.stdout.strip():
        raise OverlayError(
            f"the checkout {root} has uncommitted changes in patches/ or constraints.txt:\n  "
            + "\n  ".join(proc.stdout.rstrip().splitlines())
            + "\nCommit or stash them first: a rebase rewrites these files."
        )


# ---------------------------------------------------------------- upstream


def _upstream(pin: Pin, new_ref: str, source: str | None, cache: pathlib.Path) -> tuple[pathlib.Path, str]:
    """A git directory holding the old pin and NEW_REF, and NEW_REF's commit."""
    if source:
        path = pathlib.Path(source).expanduser()
        proc = _git("rev-parse", "--absolute-git-dir", cwd=path, check=False) if path.is_dir() else None
        if proc is None or proc.returncode != 0:
            raise OverlayError(f"{pin.distribution}: --source {source} is not a git repository or mirror; a rebase needs the upstream's history.")
        git_dir = pathlib.Path(proc.stdout.strip())
        origin = source
    else:
        git_dir = cache / "git" / f"{pin.distribution}-rebase.git"
        if not git_dir.exists():
            git_dir.parent.mkdir(parents=True, exist_ok=True)
            _git("init", "-q", "--bare", str(git_dir))
        with step(pin.distribution, f"fetching {new_ref} and the pin {pin.commit[:12]} from {pin.repository}"):
            proc = _git("fetch", "-q", "--no-tags", pin.repository, new_ref, "+refs/tags/*:refs/tags/*", git_dir=git_dir, check=False)
            if proc.returncode != 0:
                raise OverlayError(
                    f"{pin.distribution}: cannot fetch {new_ref} from {pin.repository} ({pin.pin_file}): "
                    f"{proc.stderr.strip().splitlines()[-1:] or ['git fetch failed']}. Pass --source PATH with a local clone or mirror."
                )
            _git("update-ref", "refs/mrl/new", "FETCH_HEAD", git_dir=git_dir)
            if _git("cat-file", "-e", f"{pin.commit}^{{commit}}", git_dir=git_dir, check=False).returncode != 0:
                _git("fetch", "-q", "--no-tags", pin.repository, pin.commit, git_dir=git_dir, check=False)
        new_ref = "refs/mrl/new"
        origin = pin.repository
    proc = _git("rev-parse", "--verify", "--quiet", f"{new_ref}^{{commit}}", git_dir=git_dir, check=False)
    if proc.returncode != 0:
        raise OverlayError(f"{pin.distribution}: {origin} has no commit, tag or branch {new_ref!r}; fetch it there or name another.")
    return git_dir, proc.stdout.strip()


def _has_commit(git_dir: pathlib.Path, commit: str) -> bool:
    return _git("cat-file", "-e", f"{commit}^{{commit}}", git_dir=git_dir, check=False).returncode == 0


def _missing_blobs(git_dir: pathlib.Path, commit: str) -> list[str]:
    listing = _git("ls-tree", "-r", "-z", commit, git_dir=git_dir, text=False).stdout.split(b"\0")
    entries = [item.split(b"\t", 1) for item in listing if item]
    blobs = [(meta.split()[2].decode(), name.decode()) for meta, name in entries if meta.split()[1] == b"blob"]
    out = _git("cat-file", "--batch-check", git_dir=git_dir, input="".join(oid + "\n" for oid, _ in blobs).encode()).stdout.decode()
    return [name for (_, name), line in zip(blobs, out.splitlines()) if line.endswith(" missing")]


def _work_clone(pin: Pin, git_dir: pathlib.Path, commit: str, work: pathlib.Path, old: str) -> list[str]:
    """A fresh work clone at `commit` that borrows the upstream's objects
    (git alternates: nothing is copied). Returns the notes."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    _git("init", "-q", cwd=work)
    objects = (git_dir / "objects").resolve()
    (work / ".git" / "objects" / "info" / "alternates").write_text(f"{objects}\n")
    _git("update-ref", "refs/mrl/upstream", commit, cwd=work)
    if _has_commit(git_dir, old):
        _git("update-ref", "refs/mrl/old-pin", old, cwd=work)
    return _checkout(pin, git_dir, commit, work)


def _checkout(pin: Pin, git_dir: pathlib.Path, commit: str, work: pathlib.Path) -> list[str]:
    """Check `commit` out in `work`, detached. A mirror may lack some large
    blobs (the tunix mirror: 4 docs images and notebooks). git can neither
    check out nor commit on a tree that names a missing blob, so the work
    clone then stands on a stand-in commit: the upstream tree without those
    files, whose parent is the upstream commit. Patches touching them
    conflict; files of the import package itself must be present."""
    missing = _missing_blobs(git_dir, commit)
    inside = [m for m in missing if m.split("/", 1)[0] == pin.import_package]
    if inside:
        raise OverlayError(
            f"{pin.distribution}: the upstream repository lacks files of the package itself at {commit[:12]}: "
            f"{', '.join(inside)}. Use a complete clone as --source."
        )
    if not missing:
        _git("checkout", "-q", "-f", "--detach", commit, cwd=work)
        return []
    _git("read-tree", commit, cwd=work)
    _git("update-index", "--force-remove", "--", *missing, cwd=work)
    tree = _out("write-tree", cwd=work)
    message = f"upstream {commit} without {len(missing)} file(s) the repository lacks\n\n" + "\n".join(missing) + "\n"
    stand_in = _out("commit-tree", tree, "-p", commit, "-m", message, cwd=work)
    _git("checkout", "-q", "-f", "--detach", stand_in, cwd=work)
    return [
        f"the upstream repository lacks {len(missing)} file(s) outside the package at {commit[:12]}; the work clone "
        f"stands on {stand_in[:12]}, the upstream tree without them (tree and pin are read from {commit[:12]} itself): "
        + ", ".join(missing)
    ]


# ---------------------------------------------------------------- versions


def _daily_build_version(pin: Pin, git_dir: pathlib.Path, commit: str, date: str) -> tuple[str, str]:
    """tpu-inference names its daily builds <release>.dev<YYYYMMDD>, where
    <release> is the newest release (tag vX.Y.Z) at the time: 0.26.0 was
    tagged 2026-07-30, and the builds of 2026-07-31..08-20 are
    0.26.0.devYYYYMMDD. Release tags sit on release branches (git describe on
    main finds only v0.11.1), so: the newest vX.Y.Z tag whose commit is not
    later than the new commit; with no such tag, the previous pin's base.
    YYYYMMDD is the new commit's committer date, as recorded in the pin."""
    when = datetime.datetime.fromisoformat(date)
    refs = _out("for-each-ref", "--format=%(refname:strip=2) %(*committerdate:unix)%(committerdate:unix)", "refs/tags", git_dir=git_dir)
    best: tuple[int, tuple[int, ...], str] | None = None
    for line in refs.splitlines():
        tag, _, stamp = line.partition(" ")
        m = re.fullmatch(r"v?(\d+)\.(\d+)\.(\d+)", tag)
        if m and stamp.isdigit() and int(stamp) <= when.timestamp():
            key = (int(stamp), tuple(int(x) for x in m.groups()), ".".join(m.groups()))
            best = max(best, key) if best else key
    if best:
        base, why = best[2], f"newest release tag v{best[2]} not after the commit"
    else:
        base = re.sub(r"\.dev\d+$", "", pin.version)
        why = f"no release tag found: base {base} kept from the previous pin {pin.version}"
    return f"{base}.dev{when:%Y%m%d}", why


def _pyproject_version(pin: Pin, git_dir: pathlib.Path, commit: str, date: str) -> tuple[str, str]:
    """Tunix: pyproject.toml's static [project] version at the new commit."""
    proc = _git("show", f"{commit}:pyproject.toml", git_dir=git_dir, check=False)
    try:
        version = tomllib.loads(proc.stdout)["project"]["version"]
    except (tomllib.TOMLDecodeError, KeyError):
        raise OverlayError(
            f"{pin.distribution}: pyproject.toml at {commit[:12]} has no static [project] version; "
            f"set version in {pin.pin_file} by hand."
        ) from None
    return version, f"pyproject.toml [project] version at {commit[:12]}"


def _kept_version(pin: Pin, git_dir: pathlib.Path, commit: str, date: str) -> tuple[str, str]:
    """vLLM: setuptools-scm from release tags on other branches; not derivable
    from a mirror without them. Kept, and said so."""
    return pin.version, "KEPT from the previous pin: vLLM's version comes from git describe; set it by hand"


VERSION_RULES = {"tpu-inference": _daily_build_version, "google-tunix": _pyproject_version, "vllm": _kept_version}


# ------------------------------------------------------------------- start


def start(opts: RebaseOptions) -> Report:
    began = time.monotonic()
    root = opts.project_root.resolve()
    if opts.name not in DISTRIBUTIONS:
        raise OverlayError(f"unknown distribution {opts.name!r}; choose from {', '.join(DISTRIBUTIONS)}.")
    paths = _paths(root, opts.name)
    if (paths["state"] / "state.json").exists():
        other = json.loads((paths["state"] / "state.json").read_text())
        raise OverlayError(
            f"a rebase of {other['name']} is in progress ({paths['state']}): finish it with scripts/rebase.sh --continue "
            "or undo it with scripts/rebase.sh --abort."
        )
    _refuse_dirty(root)
    pin = load_project(root).pins[opts.name]
    patches = [patchfile.parse(p) for p in pin.series]
    cache = opts.cache or sources.cache_root()
    git_dir, new_commit = _upstream(pin, opts.new_ref, opts.source, cache)
    notes = []
    if not _has_commit(git_dir, pin.commit):
        notes.append(f"the upstream repository lacks the old pin {pin.commit[:12]}: no 3-way merge base for changed context, no Applied-Upstream search")
    # The backup comes before any change to the project.
    if paths["state"].exists():
        shutil.rmtree(paths["state"])
    paths["state"].mkdir(parents=True)
    try:
        _backup(root, opts.name, paths["state"])
        with step(opts.name, f"checking out {opts.new_ref} ({new_commit[:12]}) in {paths['work']}"):
            notes += _work_clone(pin, git_dir, new_commit, paths["work"], pin.commit)
    except BaseException:
        shutil.rmtree(paths["state"], ignore_errors=True)  # nothing was changed yet
        raise
    state = {
        "name": opts.name,
        "new_ref": opts.new_ref,
        "new_commit": new_commit,
        "git_dir": str(git_dir),
        "source": opts.source,
        "build": opts.build,
        "build_sources": opts.build_sources,
        "standins": opts.standins,
        "apply_vllm_lkg": opts.apply_vllm_lkg,
        "run_tests": opts.run_tests,
        "cache": str(cache),
        "phase": "applying",
        "old": {"commit": pin.commit, "tree": pin.tree, "date": pin.date, "version": pin.version},
        "patches": [{"name": p.name, "subject": p.subject, "outcome": PENDING, "detail": "", "commit": ""} for p in patches],
        "notes": notes,
        "seconds": 0.0,
    }
    for note in notes:
        step.note(opts.name, note)
    return _run(root, state, began)


def resume(root: pathlib.Path) -> Report:
    """--continue: take the person's resolution of the stopped patch, go on."""
    began = time.monotonic()
    root = root.resolve()
    state = _load(root)
    work = _paths(root, state["name"])["work"]
    if state["phase"] == "applying":
        entry = next(p for p in state["patches"] if p["outcome"] == CONFLICT)
        in_am = (work / ".git" / "rebase-apply").exists()
        if in_am:
            unmerged = sorted(set(_out("diff", "--name-only", "--diff-filter=U", cwd=work).splitlines()))
            if unmerged:
                raise OverlayError(
                    f"{entry['name']}: {len(unmerged)} file(s) in {work} are still unmerged: {', '.join(unmerged)}. "
                    "Resolve the conflict markers there, `git add` each file, then run scripts/rebase.sh --continue "
                    "(or scripts/rebase.sh --abort)."
                )
            if _git("diff", "--cached", "--quiet", "HEAD", cwd=work, check=False).returncode == 0:
                _git("am", "--skip", cwd=work)
                entry.update(outcome=DROPPED_BY_HAND, detail=f"resolved to the content of {state['new_commit'][:12]}")
            else:
                proc = _git("am", "--continue", cwd=work, check=False)
                if proc.returncode != 0:
                    raise OverlayError(f"{entry['name']}: git am --continue failed in {work}:\n{(proc.stdout + proc.stderr).strip()}")
                entry.update(outcome=RESOLVED, commit=_out("rev-parse", "HEAD", cwd=work))
        else:
            head = _out("rev-parse", "HEAD", cwd=work)
            if head == entry["commit"]:  # the HEAD before the patch: git am was ended by hand
                raise OverlayError(
                    f"{entry['name']}: git am is no longer in progress in {work} and HEAD did not move. Apply it again "
                    f"(git am -3 {_paths(root)['state'] / 'backup' / 'patches' / state['name'] / entry['name']}), "
                    "resolve and git add, then --continue; or --abort."
                )
            entry.update(outcome=RESOLVED, commit=head)  # the person ran git am --continue
        entry["detail"] = entry["detail"] or "resolved in the work clone"
    return _run(root, state, began)


def abort(root: pathlib.Path) -> str:
    root = root.resolve()
    state = _load(root)
    paths = _paths(root, state["name"])
    _restore(root, state["name"], paths["state"])
    for folder in (paths["work"], paths["find"]):
        shutil.rmtree(folder, ignore_errors=True)
    shutil.rmtree(paths["state"])
    return (
        f"rebase of {state['name']} onto {state['new_ref']} aborted: patches/{state['name']}/, "
        "patches/vllm/pin.toml and constraints.txt restored from the backup; work clone removed."
    )


# ------------------------------------------------------------ the main loop


def _run(root: pathlib.Path, state: dict, began: float) -> Report:
    name = state["name"]
    paths = _paths(root, name)
    work = paths["work"]
    backup = paths["state"] / "backup" / "patches" / name
    if state["phase"] == "applying":
        for entry in state["patches"]:
            if entry["outcome"] != PENDING:
                continue
            patch = backup / entry["name"]
            with step(name, f"applying {entry['name']}"):
                _apply_one(work, patch, entry, state)
            if entry["outcome"] == CONFLICT:
                state["seconds"] += time.monotonic() - began
                _save(paths["state"], state)
                return _stopped_report(root, state, patch)
        state["phase"] = "write"
        _save(paths["state"], state)
    if state["phase"] == "write":
        _write(root, state)
        state["phase"] = "written"
        _save(paths["state"], state)
    if state["build"]:
        from .build import BuildOptions, build

        given = dict(state["build_sources"])
        if state["source"]:
            given[name] = state["source"]
        with step(name, "building the wheels and constraints.txt from the new pins"):
            try:
                build(BuildOptions(project_root=root, sources=given, cache=pathlib.Path(state["cache"]),
                                   torch_standin=state.get("standins", False), allow_unpinned=state.get("standins", False)))
            except OverlayError as exc:
                raise OverlayError(
                    f"{exc}\nThe rebased series and pin are written; the build failed, so constraints.txt is unchanged. "
                    "Fix the cause and run scripts/rebase.sh --continue (builds again), or scripts/rebase.sh --abort."
                ) from None
    shutil.rmtree(paths["state"])
    report = _report(root, state)
    if not state["build"]:
        report.notes.append("constraints.txt not regenerated (no --build): run scripts/build-wheels.sh with the sources, then commit it")
    if state["run_tests"]:
        report.tests_ok, report.tests = _fast_tests(root)
    report.seconds = state["seconds"] + time.monotonic() - began
    report.message = (
        f"Review with `git diff -- patches constraints.txt` in {root} and commit; "
        "undo with `git checkout -- patches constraints.txt` (the checkout was clean when the rebase began)."
    )
    return report


def _apply_one(work: pathlib.Path, patch: pathlib.Path, entry: dict, state: dict) -> None:
    head = _out("rev-parse", "HEAD", cwd=work)
    entry["commit"] = head
    if _git("apply", "--check", "-R", str(patch), cwd=work, check=False).returncode == 0:
        entry.update(outcome=DROPPED, detail=_where_upstream(work, patch, state))
        return
    clean = _git("apply", "--check", str(patch), cwd=work, check=False).returncode == 0
    proc = _git("am", "-3", "--keep-cr", str(patch), cwd=work, check=False)
    if proc.returncode == 0:
        after = _out("rev-parse", "HEAD", cwd=work)
        if after == head:  # "No changes -- Patch already applied.": the 3-way merge changed nothing
            entry.update(outcome=DROPPED, detail=_where_upstream(work, patch, state))
            return
        entry.update(outcome=APPLIED_CLEANLY if clean else APPLIED_3WAY, commit=after)
        return
    unmerged = sorted(set(_out("diff", "--name-only", "--diff-filter=U", cwd=work).splitlines()))
    staged = _git("diff", "--cached", "--quiet", "HEAD", cwd=work, check=False).returncode != 0
    if not unmerged and not staged and (work / ".git" / "rebase-apply").exists() and "already applied" in proc.stdout + proc.stderr:
        _git("am", "--skip", cwd=work)  # the 3-way merge left nothing to change
        entry.update(outcome=DROPPED, detail=_where_upstream(work, patch, state))
        return
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    entry.update(outcome=CONFLICT, detail="; ".join(unmerged) if unmerged else " / ".join(lines[-4:]))


def _where_upstream(work: pathlib.Path, patch: pathlib.Path, state: dict) -> str:
    """The upstream commit with the patch's patch-id between the old and the
    new pin, if any; else the new pin commit (which contains the change)."""
    want = patchfile.patch_id(patch)
    files = [f.path for f in patchfile.parse(patch).files]
    old, new = state["old"]["commit"], state["new_commit"]
    if _git("rev-parse", "--verify", "--quiet", "refs/mrl/old-pin", cwd=work, check=False).returncode == 0:
        log = _git("log", "--no-merges", "-p", "--full-index", f"{old}..{new}", "--", *files, cwd=work, check=False, text=False)
        if log.returncode == 0 and log.stdout:
            ids = _git("patch-id", "--stable", cwd=work, input=log.stdout).stdout.decode().split()
            for pid, commit in zip(ids[::2], ids[1::2]):
                if pid == want:
                    return commit
    return new


def _stopped_report(root: pathlib.Path, state: dict, patch: pathlib.Path) -> Report:
    report = _report(root, state)
    report.stopped = True
    work = _paths(root, state["name"])["work"]
    entry = next(p for p in state["patches"] if p["outcome"] == CONFLICT)
    report.message = (
        f"STOPPED at {entry['name']} ({entry['subject']}): it conflicts with {state['new_ref']} "
        f"({state['new_commit'][:12]}) in {entry['detail'] or 'the files it touches'}.\n"
        f"  1. cd {work}   (git status shows the conflicted files; the patch is {patch})\n"
        "  2. edit the files to resolve the <<<<<<< ======= >>>>>>> markers, then `git add` each one\n"
        "     (to drop the patch because upstream now does the same: restore upstream's version and git add it)\n"
        "  3. scripts/rebase.sh --continue      or, to put everything back:  scripts/rebase.sh --abort\n"
        f"  To find the newest upstream commit the series still applies to: scripts/rebase.sh {state['name']} "
        f"{state['new_ref']} --find-base" + (f" --source {state['source']}" if state["source"] else "")
    )
    return report


def _report(root: pathlib.Path, state: dict) -> Report:
    new = {"commit": state["new_commit"], **state.get("new", {})}
    return Report(state["name"], state["old"], new, [dict(p) for p in state["patches"]], notes=list(state["notes"]), seconds=state["seconds"])


# ---------------------------------------------------------------- writing


def _write(root: pathlib.Path, state: dict) -> None:
    name = state["name"]
    work = _paths(root, name)["work"]
    git_dir = pathlib.Path(state["git_dir"])
    folder = root / "patches" / name
    pin = load_project(root).pins[name]
    new_commit = state["new_commit"]
    dropped = {}
    for entry in state["patches"]:
        if entry["outcome"] in (DROPPED, DROPPED_BY_HAND):
            dropped[entry["name"]] = entry
            (folder / entry["name"]).unlink(missing_ok=True)
            continue
        text = _git("format-patch", *_EXPORT[1:], entry["commit"], cwd=work, text=False).stdout
        (folder / entry["name"]).write_bytes(text)
    if dropped:
        lines = []
        for line in (folder / "series").read_text().splitlines():
            fields = line.split("#", 1)[0].split()
            entry = dropped.get(fields[0]) if fields else None
            if entry:
                where = entry["detail"] if re.fullmatch(r"[0-9a-f]{40}", entry["detail"] or "") else new_commit
                line = (f"# Applied-Upstream: {entry['name']} in {where} (\"{entry['subject']}\"); "
                        f"dropped by scripts/rebase.sh onto {new_commit}")
            lines.append(line)
        (folder / "series").write_text("\n".join(lines) + "\n")
    date = _out("log", "-1", "--format=%cI", new_commit, git_dir=git_dir)
    version, why = VERSION_RULES[name](pin, git_dir, new_commit, date)
    new = {"commit": new_commit, "tree": _out("rev-parse", f"{new_commit}^{{tree}}", git_dir=git_dir), "date": date, "version": version}
    set_pin_values(pin.pin_file, new)
    state["new"] = new
    state["notes"].append(f"version {version}: {why}")
    if name == "tpu-inference":
        _vllm_lkg(root, state, git_dir)


def _vllm_lkg(root: pathlib.Path, state: dict, git_dir: pathlib.Path) -> None:
    new_commit = state["new_commit"]
    proc = _git("show", f"{new_commit}:{VLLM_LKG}", git_dir=git_dir, check=False)
    lkg = proc.stdout.strip() if proc.returncode == 0 else ""
    vllm_pin = root / "patches" / "vllm" / "pin.toml"
    current = tomllib.loads(vllm_pin.read_text())["commit"]
    if not re.fullmatch(r"[0-9a-f]{40}", lkg):
        state["notes"].append(f"vLLM: no commit in {VLLM_LKG} at {new_commit[:12]}; {vllm_pin} left as it is")
    elif lkg == current:
        state["notes"].append(f"vLLM: tpu-inference's CI verified {lkg[:12]} ({VLLM_LKG}), the vLLM pin already")
    elif state["apply_vllm_lkg"]:
        set_pin_values(vllm_pin, {"commit": lkg})
        state["notes"].append(
            f"vLLM: pin moved {current[:12]} -> {lkg[:12]} ({VLLM_LKG} at {new_commit[:12]}); its version and comments "
            f"in {vllm_pin} still describe the old commit: update them (git describe in a vLLM clone)"
        )
    else:
        state["notes"].append(
            f"vLLM: tpu-inference's CI verified vLLM {lkg} ({VLLM_LKG} at {new_commit[:12]}); the vLLM pin is "
            f"{current[:12]}. Pass --apply-vllm-lkg to move it."
        )


def _fast_tests(root: pathlib.Path) -> tuple[bool, str]:
    venv = root / ".venv" / "bin" / "python"
    python = str(venv) if venv.exists() else sys.executable
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root / "overlay"), os.environ.get("PYTHONPATH")])))
    with step("tests", "tests/unit (fast)"):
        proc = subprocess.run([python, "-m", "pytest", "tests/unit", "-q", "-p", "no:cacheprovider"], cwd=root, env=env, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    summary = lines[-1] if lines else proc.stderr.strip()[-300:]
    if proc.returncode != 0:
        failed = [line for line in lines if line.startswith("FAILED")]
        summary += "\n    " + "\n    ".join(failed[:10])
    return proc.returncode == 0, summary


# --------------------------------------------------------------- find-base


def find_base(opts: RebaseOptions) -> dict:
    """The newest first-parent commit between the old pin and NEW_REF on which
    every patch of the series applies without conflict (git am -3), by
    bisection. Applying is assumed monotone: once a later upstream change
    conflicts, later commits keep conflicting. That holds in practice (a
    conflicting change is rarely undone); the answer is checked, not trusted:
    the commit found applies, its first-parent successor does not."""
    root = opts.project_root.resolve()
    pin = load_project(root).pins[opts.name]
    git_dir, new_commit = _upstream(pin, opts.new_ref, opts.source, opts.cache or sources.cache_root())
    if not _has_commit(git_dir, pin.commit):
        raise OverlayError(f"{opts.name}: the upstream repository lacks the pin {pin.commit} ({pin.pin_file}); --find-base needs it.")
    chain = _out("rev-list", "--first-parent", "--reverse", f"{pin.commit}..{new_commit}", git_dir=git_dir).split()
    if _git("merge-base", "--is-ancestor", pin.commit, new_commit, git_dir=git_dir, check=False).returncode != 0:
        raise OverlayError(f"{opts.name}: the pin {pin.commit[:12]} is not an ancestor of {opts.new_ref}; --find-base walks first-parent history from the pin.")
    chain = [pin.commit] + chain
    work = _paths(root, opts.name)["find"]
    _work_clone(pin, git_dir, new_commit, work, pin.commit)
    tried: dict[str, bool] = {}

    def ok(i: int) -> bool:
        commit = chain[i]
        if commit not in tried:
            with step(opts.name, f"trying the series on {commit[:12]} ({i}/{len(chain) - 1} first-parent commits after the pin)"):
                tried[commit] = _series_applies(pin, git_dir, work, commit, pin.series)
        return tried[commit]

    try:
        if ok(len(chain) - 1):
            good = len(chain) - 1
        else:
            lo, hi = 0, len(chain) - 1  # ok(lo) assumed (the pin), not ok(hi)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if ok(mid):
                    lo = mid
                else:
                    hi = mid
            good = lo
            if not ok(lo):
                raise OverlayError(f"{opts.name}: the series does not apply even to the pin {pin.commit[:12]}; fix the series first.")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    describe = lambda c: _out("log", "-1", "--format=%H %cI %s", c, git_dir=git_dir)  # noqa: E731
    result = {"base": chain[good], "base_line": describe(chain[good]), "position": good, "commits": len(chain) - 1, "tried": len(tried)}
    if good < len(chain) - 1:
        result["first_conflict"] = describe(chain[good + 1])
    return result


def _series_applies(pin: Pin, git_dir: pathlib.Path, work: pathlib.Path, commit: str, series: tuple[pathlib.Path, ...]) -> bool:
    _checkout(pin, git_dir, commit, work)
    try:
        for patch in series:
            if _git("am", "-3", "--keep-cr", str(patch), cwd=work, check=False).returncode != 0:
                _git("am", "--abort", cwd=work, check=False)
                return False
        return True
    finally:
        _git("am", "--abort", cwd=work, check=False)


# ---------------------------------------------------------------- output


def render(report: Report) -> str:
    width = max([len(p["name"]) for p in report.patches] + [5])
    old, new = report.old, report.new
    lines = [
        f"rebase {report.name}: {old['commit'][:12]} -> {new['commit'][:12]}"
        + (f"   version {old['version']} -> {new['version']}" if new.get("version") else ""),
        "",
        f"  {'patch':<{width}}  outcome",
    ]
    for p in report.patches:
        detail = p["detail"] if p["outcome"] != APPLIED_CLEANLY else ""
        if p["outcome"] in (DROPPED, DROPPED_BY_HAND) and re.fullmatch(r"[0-9a-f]{40}", detail or ""):
            detail = f"Applied-Upstream: {detail[:12]}"
        lines.append(f"  {p['name']:<{width}}  {p['outcome']}" + (f"  ({detail})" if detail else ""))
    if not report.patches:
        lines.append("  (empty series)")
    lines.append("")
    lines += [f"  note: {n}" for n in report.notes]
    if report.tests:
        lines.append(f"  fast tests (tests/unit): {'passed' if report.tests_ok else 'FAILED'}: {report.tests}")
    lines.append(f"  time: {report.seconds:.1f}s")
    if report.message:
        lines += ["", report.message]
    return "\n".join(lines)


def render_base(name: str, result: dict) -> str:
    lines = [
        f"find-base {name}: newest first-parent commit on which the whole series applies (git am -3, no conflict):",
        f"  {result['base_line']}",
        f"  ({result['position']} of {result['commits']} first-parent commits after the pin; {result['tried']} tried by bisection)",
    ]
    if "first_conflict" in result:
        lines.append(f"  the next one conflicts: {result['first_conflict']}")
    lines.append(f"  rebase onto it: scripts/rebase.sh {name} {result['base'][:12]}")
    return "\n".join(lines)
