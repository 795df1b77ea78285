"""Stage 3: build a patched tree into a wheel, reproducibly.

The wheel's version is the upstream version plus our local label
(`0.25.0.dev20260727+mrl.1`; `+mrl.1.unpinned.<tree>` for a stand-in tree).
Reproducible bytes come from SOURCE_DATE_EPOCH (the pinned commit's date) and
pinned build backends (resources/build-constraints.txt)."""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import tomllib
import zipfile
from importlib import resources
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from ..cache import buildcache, cachekeys
from ..core import gittree, tomledit
from ..core.digest import sha256_file
from ..core.errors import OverlayError
from ..core.output import step
from ..core.proc import run
from ..core.staging import scratch_dir
from .buildenv import BUILD_CONSTRAINTS, BuildEnv

#: Bumped when what a kept wheel's record says changes.
WHEEL_CACHE_FORMAT = 1


def wheel_version(upstream_version: str, local_label: str) -> str:
    return f"{upstream_version}+{local_label}"


def set_static_version(tree: pathlib.Path, version: str) -> bool:
    """Write `version` into a static [project] version of pyproject.toml.

    Returns False when the project's version is dynamic (then the pin's build
    env must carry it, as VLLM_VERSION_OVERRIDE does for tpu-inference)."""
    pyproject = tree / "pyproject.toml"
    if not pyproject.is_file():
        return False
    text = pyproject.read_text()
    project = tomllib.loads(text).get("project", {})
    if "version" not in project:
        return False
    pyproject.write_text(tomledit.set_value(text, ("project",), "version", version, where=str(pyproject)))
    return True


def override_requirements(tree: pathlib.Path, overrides: dict[str, str], who: str, files: tuple[str, ...]) -> None:
    """Replace upstream requirements, by name, where the pin says so.

    Looks in `files` (quoted requirements of a pyproject.toml, lines of a
    requirements file). Each override must match exactly one requirement, so
    a stale override fails."""
    for name, replacement in overrides.items():
        want = canonicalize_name(name)
        hits = 0
        for path in (tree / f for f in files):
            if not path.is_file():
                continue
            lines = path.read_text().splitlines(keepends=True)
            for i, line in enumerate(lines):
                req_text = line.split("#", 1)[0].strip().strip(",").strip()
                quoted = req_text.startswith(('"', "'"))
                try:
                    req = Requirement(req_text.strip("\"'"))
                except InvalidRequirement:
                    continue
                if canonicalize_name(req.name) != want or (path.suffix == ".toml" and not quoted):
                    continue
                new = f'"{replacement}"' if quoted else replacement
                lines[i] = line.replace(req_text, new + ("," if req_text.endswith(",") else ""), 1)
                hits += 1
            path.write_text("".join(lines))
        if hits != 1:
            raise OverlayError(
                f"{who}: the requirement override for {name!r} matched {hits} requirements (want 1); "
                "update [build.requirements] in the pin file."
            )


def commit_epoch(commit_date_iso: str | None) -> str:
    import datetime

    if not commit_date_iso:
        return "315532800"  # 1980-01-01, the earliest a zip file can say
    return str(int(datetime.datetime.fromisoformat(commit_date_iso).timestamp()))


def build_wheel(tree: pathlib.Path, out_dir: pathlib.Path, *, who: str, env: dict[str, str], epoch: str, python: str,
                build_env: BuildEnv | None = None, cache: pathlib.Path | None = None) -> pathlib.Path:
    """`uv build --wheel` of `tree` into `out_dir`; returns the wheel's path.

    With `build_env`, the build runs without isolation in that prepared
    environment (a distribution whose extensions link the closure's torch).
    With `cache`, a wheel built before from the same tree with the same
    settings is reused (buildcache: keyed by the tree's git id, not its path)."""
    uv = shutil.which("uv")
    if uv is None:
        raise OverlayError("uv is not installed; install it (pip install uv) to build wheels.")
    if cache is None:
        return _build(uv, tree, out_dir, who=who, env=env, epoch=epoch, python=python, build_env=build_env)
    inputs = wheel_inputs(tree, env, epoch, python, build_env)
    # Under the entry's lock: a concurrent build of the same wheel waits, then reuses it.
    with _entry(cache, inputs, who).locked():
        kept = kept_wheel(cache, inputs, out_dir, who)
        if kept is not None:
            return kept
        dest = _build(uv, tree, out_dir, who=who, env=env, epoch=epoch, python=python, build_env=build_env)
        keep_wheel(cache, inputs, dest, who)
    return dest


def _build(uv: str, tree: pathlib.Path, out_dir: pathlib.Path, *, who: str, env: dict[str, str], epoch: str, python: str,
           build_env: BuildEnv | None) -> pathlib.Path:
    # Compiled code records source paths (debug info, __FILE__, also of the
    # headers it includes): map the build's temporary folder and the build
    # environment's (torch's headers) away, so that the bytes depend on neither.
    prefix_map = f"-ffile-prefix-map={tree}=."
    if build_env is not None:
        prefix_map += f" -ffile-prefix-map={build_env.root}=/buildenv"
    flags = {var: f"{os.environ.get(var, '')} {prefix_map}".strip() for var in ("CFLAGS", "CXXFLAGS")}
    if build_env is not None:
        # The linker's build id hashes what it saw of the build environment's
        # path before stripping: without one, the same inputs give the same bytes.
        flags["LDFLAGS"] = f"{os.environ.get('LDFLAGS', '')} -Wl,--build-id=none".strip()
    with scratch_dir("mrl-wheel-") as tmp, resources.as_file(BUILD_CONSTRAINTS) as constraints:
        full_env = dict(flags, **env, SOURCE_DATE_EPOCH=epoch, PYTHONHASHSEED="0", UV_PYTHON_DOWNLOADS="never")
        cmd = [uv, "build", "--wheel", "--no-progress", "--out-dir", str(tmp)]
        if build_env is None:
            cmd += ["--python", python, "--build-constraint", str(constraints)]
        else:
            full_env.update(build_env.env)
            cmd += ["--python", str(build_env.python), "--no-build-isolation"]
        with step(who, "building the wheel"):
            run([*cmd, str(tree)], env=full_env, who=who, what="the wheel build", log=True)
        built = list(tmp.glob("*.whl"))
        if len(built) != 1:
            raise OverlayError(f"{who}: the build made {len(built)} wheels, expected one.")
        check_licences(tree, built[0], who)
        out_dir.mkdir(parents=True, exist_ok=True)
        dest = out_dir / built[0].name
        shutil.move(built[0], dest)
    return dest


#: The licence files a tree's top folder may hold that its wheels must carry
#: (setuptools' default license-files globs; Apache-2.0 section 4 asks for the
#: licence and any NOTICE file with every redistribution).
LICENCE_GLOBS = ("LICEN[CS]E*", "COPYING*", "NOTICE*", "AUTHORS*")


def check_licences(tree: pathlib.Path, wheel: pathlib.Path, who: str) -> None:
    """Refuse a wheel that lacks a licence file of its tree, or has none at all."""
    wanted = {p.name: p.read_bytes() for g in LICENCE_GLOBS for p in tree.glob(g) if p.is_file()}
    with zipfile.ZipFile(wheel) as zf:
        carried = {n.rsplit("/", 1)[-1]: zf.read(n) for n in zf.namelist() if n.split("/")[0].endswith(".dist-info") and "/licenses/" in n}
    missing = sorted(name for name, data in wanted.items() if carried.get(name) != data)
    if missing or not carried:
        raise OverlayError(f"{who}: the wheel {wheel.name} does not carry the licence file(s) {', '.join(missing) or '(none at all)'} "
                           f"of its source; its build must ship them (license-files) before the wheel can be published.")


def wheel_inputs(tree: pathlib.Path, env: dict[str, str], epoch: str, python: str, build_env: BuildEnv | None) -> dict[str, Any]:
    """Everything a wheel's bytes depend on. The tree by its git tree id (so,
    after our edits to it); a build environment by its cache key (the hash of
    what it holds), its torch and CUDA, and the compilers the build finds
    there (the wheels built in one compile: vLLM's); the compiler and linker
    flags the user set; the tool itself, which sets the rest."""
    compiler = None if build_env is None else cachekeys.compiler_identity(dict(os.environ, **build_env.env, **env))
    return {
        "format": WHEEL_CACHE_FORMAT,
        "tree": gittree.tree_id(tree),
        "env": env,
        "epoch": epoch,
        "flags": {var: os.environ.get(var, "") for var in ("CFLAGS", "CXXFLAGS", "LDFLAGS")},
        "build_env": None if build_env is None else {"key": build_env.root.name, "torch": build_env.torch, "cuda": build_env.cuda},
        "compiler": compiler,
        "build_constraints": hashlib.sha256(BUILD_CONSTRAINTS.read_bytes()).hexdigest(),
        "uv": cachekeys.uv_identity(python if build_env is None else str(build_env.python)),
        "tool": cachekeys.tool_digest(),
    }


def _entry(cache: pathlib.Path, inputs: dict[str, Any], who: str) -> buildcache.Entry:
    key = cachekeys.key(inputs)
    return buildcache.KINDS["wheels"].entry(cache, key, key, who=who)


def kept_wheel(cache: pathlib.Path, inputs: dict[str, Any], out_dir: pathlib.Path, who: str) -> pathlib.Path | None:
    """A copy in `out_dir` of the wheel kept for these inputs, if there is a
    whole one (its record names it and its sha256 matches); else None."""
    entry = _entry(cache, inputs, who)

    def check(record: dict[str, Any]) -> pathlib.Path:
        wheel = entry.path / str(record["wheel"])
        if wheel.parent != entry.path or sha256_file(wheel) != record["sha256"]:
            raise buildcache.Damaged
        return wheel

    wheel = entry.reuse(check)
    if wheel is None:
        return None
    out_dir.mkdir(parents=True, exist_ok=True)
    dest = out_dir / wheel.name
    shutil.copyfile(wheel, dest)
    step.note(who, f"tree {inputs['tree'][:12]} and its build settings unchanged: reusing the wheel {wheel.name} (kept as {entry.key[:12]})")
    return dest


def keep_wheel(cache: pathlib.Path, inputs: dict[str, Any], wheel: pathlib.Path, who: str) -> None:
    """Keep `wheel` for these inputs (a full or read-only cache: said, and the build goes on)."""
    _entry(cache, inputs, who).store({"wheel": wheel.name, "sha256": sha256_file(wheel), "inputs": inputs},
                                     lambda staged: shutil.copyfile(wheel, staged / wheel.name))


def repack_release(tree: pathlib.Path, release: pathlib.Path, out_dir: pathlib.Path, *, version: str, epoch: str, who: str) -> pathlib.Path:
    """A wheel of the patched `tree` with the release wheel's own metadata
    (its requirements, extras, entry points, licences: what a PEP 517 build
    of the upstream's source would write, which the release's index does
    not publish) and `version`: the upstream's .dist-info renamed, its
    METADATA's Version line replaced, its RECORD written anew. Entries in
    sorted order, dated `epoch`, mode 0644 (0755 where the tree's file is
    executable): the same inputs give the same bytes."""
    import base64
    import datetime
    import email.parser

    with zipfile.ZipFile(release) as zf:
        infos = [i for i in zf.infolist() if not i.is_dir()]
        folders = {i.filename.split("/", 1)[0] for i in infos if i.filename.split("/", 1)[0].endswith(".dist-info")}
        if len(folders) != 1:
            raise OverlayError(f"{who}: {release.name} has {len(folders)} .dist-info folders, not one.")
        (old_info,) = folders
        meta = {i.filename[len(old_info) + 1:]: zf.read(i) for i in infos if i.filename.startswith(old_info + "/")}
    metadata = meta.get("METADATA", b"").decode()
    parsed = email.parser.Parser().parsestr(metadata)
    name, old_version = parsed.get("Name"), parsed.get("Version")
    if not name or not old_version or f"\nVersion: {old_version}\n" not in metadata:
        raise OverlayError(f"{who}: {release.name}'s METADATA has no Name and Version lines to carry.")
    meta["METADATA"] = metadata.replace(f"\nVersion: {old_version}\n", f"\nVersion: {version}\n", 1).encode()
    meta.pop("RECORD", None)
    stem = f"{canonicalize_name(name).replace('-', '_')}-{version}"
    info_dir = f"{stem}.dist-info"
    files = {p.relative_to(tree).as_posix(): p for p in sorted(tree.rglob("*")) if p.is_file()}
    stray = sorted(f for f in files if f.split("/", 1)[0].endswith((".dist-info", ".data")))
    if stray:
        raise OverlayError(f"{who}: the patched tree holds {stray[0]}: a series must not write wheel metadata.")
    entries = [(rel, path.read_bytes(), 0o755 if os.access(path, os.X_OK) else 0o644) for rel, path in files.items()]
    entries += [(f"{info_dir}/{rel}", data, 0o644) for rel, data in sorted(meta.items())]

    def digest(data: bytes) -> str:
        return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

    record = "".join(f"{rel},{digest(data)},{len(data)}\n" for rel, data, _ in entries) + f"{info_dir}/RECORD,,\n"
    entries.append((f"{info_dir}/RECORD", record.encode(), 0o644))
    stamp = datetime.datetime.fromtimestamp(max(int(epoch), 315532800), datetime.UTC).timetuple()[:6]
    tag = release.name[:-len(".whl")].split("-", 2)[2]  # the release's own tags (py3-none-any)
    out_dir.mkdir(parents=True, exist_ok=True)
    dest = out_dir / f"{stem}-{tag}.whl"
    with scratch_dir("mrl-repack-") as tmp:
        staged = tmp / dest.name
        with step(who, f"packing the wheel from {release.name}'s metadata"), zipfile.ZipFile(staged, "w", zipfile.ZIP_DEFLATED) as out:
            for rel, data, mode in entries:
                info = zipfile.ZipInfo(rel, date_time=stamp)
                info.external_attr = (0o100000 | mode) << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                out.writestr(info, data)
        shutil.move(staged, dest)
    return dest
