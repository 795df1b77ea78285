"""The whole build: pins + series -> wheels -> index + constraints.txt.

One entry function, `build`, taking plain options and returning what it
made. Everything is made in a staging folder beside the output and moved into
place only at the end, so an interrupted or failed build leaves the previous
index and constraints.txt as they were."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import os
import pathlib
import shutil
import sys
import zipfile

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from ..cache import buildcache, cachekeys
from ..config import reader, target
from ..config.pins import Pin, Project, load_project, select
from ..core import gittree, interrupts, manifest, output, tomledit
from ..core.digest import sha256_file
from ..core.errors import ExitCode, OverlayError
from ..core.output import step
from ..core.staging import check_replaceable, check_replaceable_file, check_writable, recover, scratch_dir, staged_dir, staged_file
from . import buildenv, closures, constraintsfile, indexpages, inputdigests, overlayfiles, sources, wheels
from .patching import Engine, apply_series
from .publication import begin_pair, end_pair, finish_pair


@dataclasses.dataclass
class BuildOptions:
    project_root: pathlib.Path
    sources: dict[str, str]  # distribution -> path given with --source
    only: list[str] | None = None
    out: pathlib.Path | None = None  # default: <project>/dist
    constraints: pathlib.Path | None = None  # default: <project>/constraints.txt
    allow_unpinned: bool = False
    engine: Engine | None = None  # patch engine; default git where installed
    python: str = sys.executable  # the interpreter the builds and the resolver use
    cache: pathlib.Path | None = None
    torch_standin: bool = False  # PyPI's torch X for MaxText's X+cpu, labelled as a stand-in
    # Where the index folder will be served (--base-url): its constraints.txt
    # then names the index by that URL, so a copy of it works from anywhere.
    base_url: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> BuildOptions:
        return cls(project_root=reader.project_root(args.project), sources=reader.named_sources(args.source), only=args.only,
                   out=args.out, constraints=args.constraints, allow_unpinned=args.unpinned, engine=args.engine, python=args.python,
                   torch_standin=args.torch_standin, base_url=args.base_url)


@dataclasses.dataclass
class BuildResult:
    out: pathlib.Path
    constraints: pathlib.Path
    wheels: dict[str, str]  # file name -> sha256
    from_pin: dict[str, bool]
    manifest: manifest.Manifest


def command(opts: BuildOptions) -> int:
    """`build`: the wheels built, each printed with its sha256."""
    result = build(opts)
    for name, sha in result.wheels.items():
        print(f"{sha}  {name}")
    return ExitCode.OK


def build(opts: BuildOptions) -> BuildResult:
    project = load_project(opts.project_root)
    chosen = select(project, opts.only)
    unknown = sorted(set(opts.sources) - set(project.pins))
    if unknown:
        raise OverlayError(f"--source: unknown distribution(s) {', '.join(unknown)}; choose from {', '.join(project.pins)}.")
    unused = [name for name in opts.sources if name not in {pin.distribution for pin in chosen}]
    if unused:  # the user meant to build it, or gave the wrong name: either way not to be ignored
        raise OverlayError(f"--source {unused[0]}={opts.sources[unused[0]]}: --only {','.join(opts.only or [])} leaves {', '.join(unused)} "
                           f"out, so the source would not be used. Add {', '.join(unused)} to --only, or drop the --source.")
    base = indexpages.base_url(opts.base_url) if opts.base_url else None
    out = (opts.out or project.root / "dist").resolve()
    constraints_path = (opts.constraints or project.root / "constraints.txt").resolve()
    cache = reader.cache_dir(opts.cache)
    _check_destinations(project, out, constraints_path, cache)
    # Two builds to one destination take turns, from staging to the last
    # write, so that the index and constraints.txt are one build's. The
    # locks come before the cache's: a build waiting here does not keep
    # `clean` out.
    with contextlib.ExitStack() as locks:
        for path in sorted({out, constraints_path}):  # one order for every build: no deadlock
            locks.enter_context(buildcache.flock(path.parent / f".{path.name}.lock", who="build", what=str(path)))
        with buildcache.using(cache):
            return _build(project, chosen, opts, cache, base, out, constraints_path)


def _check_destinations(project: Project, out: pathlib.Path, constraints: pathlib.Path, cache: pathlib.Path) -> None:
    """Refuse, before any work, a destination the build would destroy or
    could not write: `--out` is replaced whole, so it must not be (or hold)
    a folder the user needs, nor anything but an index the tool made;
    `--constraints` is replaced too, so it must be absent, empty or a
    constraints file the tool wrote, and not inside `--out`."""
    home = pathlib.Path.home()
    kept = {"the project": project.root, "the current folder": pathlib.Path.cwd(), "$HOME": home, "the cache (MRL_CACHE_DIR)": cache}
    for flag, path in (("--out", out), ("--constraints", constraints)):
        for what, folder in kept.items():
            folder = folder.resolve()
            if folder.is_relative_to(path):
                relation = f"is {what}" if folder == path else f"holds {what} ({folder})"
                raise OverlayError(f"{flag} {path} {relation}, which the build would replace: name a folder of its own "
                                   f"for the index (by default {project.root / 'dist'}) and a file for constraints.txt.")
    if constraints.is_relative_to(out):
        raise OverlayError(f"--constraints {constraints} is inside --out {out}, which the build replaces whole (its own "
                           f"constraints.txt names the index as it is served); name a file outside it.")
    check_replaceable(out, indexpages.INDEX_MARKER)
    check_writable(out, folder=True)
    check_writable(constraints)
    check_replaceable_file(constraints, constraintsfile.CONSTRAINTS_FILE, flag="--constraints")


def _build(project: Project, chosen: list[Pin], opts: BuildOptions, cache: pathlib.Path, base: str | None, out: pathlib.Path,
           constraints_path: pathlib.Path) -> BuildResult:
    env = target.resolve(project, torch_standin=opts.torch_standin, cache=cache)
    # Everything is made in a staging folder beside `out` and moved into place
    # at the end (0755: a web server may run as another user); constraints.txt
    # is written beside its place before that (a full disk fails it while the
    # previous build is still whole) and moved into place only once the index
    # is, and an interrupt waits from the start of that publication to its
    # end (both or neither).
    # What a killed build left beside constraints.txt (its staged file) goes
    # first; the index's leftovers go when its staging folder is made.
    finish_pair(out, constraints_path)
    recover(constraints_path)
    with interrupts.publication() as publishing, contextlib.ExitStack() as after_the_index:
        # The constraints file moves into place right after the index, before the old index is removed.
        with staged_dir(out, replace=indexpages.INDEX_MARKER, mode=0o755, then=after_the_index.close) as staging:
            entries: dict[str, manifest.Distribution] = {}
            for pin in chosen:
                entries[pin.distribution] = _build_upstream(project, pin, opts, env, staging, cache)
            not_built = [p for p in project.pins if p not in entries]
            if not_built:
                output.warn(f"not built: {', '.join(not_built)}; the index lacks them, and `verify` fails on them", who="build")
            built_maxtext = [staging / e.wheel.filename for e in entries.values() if e.extra]
            adapter = _build_maxtext_adapter(env, built_maxtext[0] if built_maxtext else env.release, staging, opts.python, cache)
            overlay = overlayfiles.overlay_inputs(project.root)
            record = manifest.Manifest(project.metadata["version"], project.revision, entries, tuple(not_built),
                                       _environment_record(env, adapter, project.resolution_cutoff),
                                       project=overlay.project)
            overlay_wheel = _build_overlay(project, overlay.files, record, adapter, staging, opts.python, cache)
            # What the wheels were made from, for the header (tests/unit finds a stale file by it):
            # read now, after the upstreams' builds (which may rewrite a toolchain file) and the overlay's.
            inputs = inputdigests.input_digests(project, entries, overlay.files)
            sums = indexpages.write_index(staging)
            indexpages.write_simple(staging, sums)
            find_links = _relative(out, constraints_path.parent)
            requirement = f"maxtext-rl-overlay[{env.extra}]=={sources.wheel_file_version(overlay_wheel)}"
            # Against the registry as of the project's cutoff, keeping the committed file's pins where it was
            # resolved against the same cutoff: the same commit, the same closure, on any day.
            ours: set[str] = {parse_wheel_filename(w)[0] for w in sums}
            prefer = constraintsfile.lock_preferences(_read_text(project.root / "constraints.txt"), project.resolution_cutoff, ours)
            if prefer:
                step.note("constraints", f"keeping the pins of {project.root / 'constraints.txt'} where they resolve "
                                         f"(resolved against the same cutoff, {project.resolution_cutoff})")
            closure = closures.resolve(staging, requirement, opts.python, env, cutoff=project.resolution_cutoff, cache=cache,
                                       prefer=prefer)
            standins = [n for n, e in entries.items() if not e.from_pin]
            left_out = [f"{n}'s {', '.join(e.left_out)}" for n, e in entries.items() if e.left_out]
            notes = [
                "Built from the pins in patches/*/pin.toml." if not standins
                else "NOT built from the pins: stand-in sources for " + ", ".join(standins) + " (see verify)"
                + (f"; left out of them, code they lack: {'; '.join(left_out)}." if left_out else "."),
                env.torch.describe() + ".",
            ]
            if env.overrides:
                (staging / indexpages.STANDIN_OVERRIDES).write_text(constraintsfile.overrides_text(env))
            # The index carries its own copy (find-links ".", which uv resolves
            # against the file's own folder or URL) so that the folder alone is a
            # complete release, on disk or served as it is over HTTP:
            # uv pip install -c dist/constraints.txt ... or -c URL/constraints.txt.
            # With --base-url it names the index by that URL instead.
            made_by = _made_by(opts, project, entries, out, constraints_path)
            (staging / "constraints.txt").write_text(constraintsfile.constraints_text(closure, sums, base or ".", notes=notes, env=env,
                                                                                      location=base or "", made_by=made_by, inputs=inputs,
                                                                                      made_from=overlay.project,
                                                                                      cutoff=project.resolution_cutoff))
            text = constraintsfile.constraints_text(closure, sums, find_links, notes=notes, env=env, made_by=made_by, inputs=inputs,
                                                    made_from=overlay.project, cutoff=project.resolution_cutoff)
            _compare_with_previous(constraints_path, text, ours)
            after_the_index.callback(end_pair, constraints_path)  # last: once the file is in place (or removed)
            staged = after_the_index.enter_context(staged_file(constraints_path, text))
            # Again, before the index moves (a refusal after it would leave a mix): the file may have changed meanwhile.
            check_replaceable_file(constraints_path, constraintsfile.CONSTRAINTS_FILE, flag="--constraints")
            # A run killed between the index's swap and the file's rename: the next one completes the pair.
            begin_pair(out, "SHA256SUMS", sha256_file(staging / "SHA256SUMS"), staged, constraints_path)
            publishing.begin()  # the last point where an interrupt leaves the previous build in place
    for name, entry in entries.items():
        step.note("build", _source_line(name, entry, project.pins[name], opts.sources.get(name)))
    for note in notes:
        step.note("build", note)
    step.note("build", f"index {out} ({len(sums)} wheels), constraints {constraints_path}")
    return BuildResult(out, constraints_path, sums, {n: e.from_pin for n, e in entries.items()}, record)


def _made_by(opts: BuildOptions, project: Project, entries: dict[str, manifest.Distribution], out: pathlib.Path,
             constraints: pathlib.Path) -> tuple[str, ...]:
    """How the build was made, for the constraints header: the command (a
    source's path stands as PATH: a machine's paths say nothing elsewhere;
    what was found there is said below it), uv and the tool."""
    cmd = ["maxtext-rl-overlay", "build"]
    for name in opts.sources:
        cmd.append(f"--source {name}=PATH")
    if opts.only:
        cmd.append(f"--only {','.join(opts.only)}")
    for flag, on in (("--unpinned", opts.allow_unpinned), ("--torch-standin", opts.torch_standin)):
        if on:
            cmd.append(flag)
    if opts.engine:
        cmd.append(f"--engine {opts.engine}")
    if opts.base_url:
        cmd.append(f"--base-url {opts.base_url}")
    for flag, path, default in (("--out", out, project.root / "dist"), ("--constraints", constraints, project.root / "constraints.txt")):
        if path != default.resolve():
            shown = path.relative_to(project.root.resolve()) if path.is_relative_to(project.root.resolve()) else pathlib.Path("...", path.name)
            cmd.append(f"{flag} {shown}")
    lines = ["Made by: " + " ".join(cmd)]
    for name, entry in entries.items():
        given = opts.sources.get(name)
        release = project.pins[name].release
        if given is None and release is not None:
            where = f"the package index's {release.wheel}"
        elif given is None:
            where = "fetched with git"
        elif pathlib.Path(given).is_file():
            where = f"--source {pathlib.Path(given).name}"
        else:
            where = "--source a git repository" if entry.source.commit else "--source a source tree"
        what = f"commit {entry.source.commit}, tree {entry.source.tree}" if entry.source.commit else f"tree {entry.source.tree}"
        lines.append(f"  {name}: {where}, {what}" + ("" if entry.from_pin else " (NOT the pin)"))
    lines.append(f"  with {cachekeys.uv_identity(opts.python)['uv']}, the tool's code sha256 {cachekeys.tool_digest()}")
    return tuple(lines)


def _source_line(name: str, entry: manifest.Distribution, pin: Pin, given: str | None) -> str:
    """Where one distribution's wheel came from, for the build output: the
    pinned commit and the source that held it, or the stand-in in its place."""
    got, origin = entry.source, given or got_from(pin)
    if entry.from_pin and pin.release is not None:
        return f"source of {name}: the pin, the release wheel {pin.release.wheel} (tree {got.tree[:12]}; tag commit {pin.commit[:12]}), from {origin}"
    if entry.from_pin:
        what = f"commit {got.commit[:12]}" if got.commit else f"a tree of commit {pin.commit[:12]}"
        return f"source of {name}: the pin, {what} (tree {got.tree[:12]}), from {origin}"
    version = f", version {got.upstream_version}" if got.upstream_version else ""
    return f"source of {name}: a STAND-IN, not the pin {pin.commit[:12]}: {origin} (tree {got.tree[:12]}{version})"


def got_from(pin: Pin) -> str:
    """Where a source no --source named came from."""
    return "the package index" if pin.release is not None else f"{pin.repository} (fetched with git)"


def _relative(target: pathlib.Path, start: pathlib.Path) -> str:
    rel = os.path.relpath(target, start)
    return rel if rel.startswith(".") else "./" + rel


def _build_upstream(project: Project, pin: Pin, opts: BuildOptions, env: target.Target, staging: pathlib.Path,
                    cache: pathlib.Path) -> manifest.Distribution:
    source = sources.obtain(pin, opts.sources.get(pin.distribution), allow_unpinned=opts.allow_unpinned, cache=cache)
    if source.from_pin:
        version = wheels.wheel_version(pin.version, project.local_label)
    else:
        # A stand-in tree is built as what it is (its own version when it is
        # an sdist), and its local label says it is not the pin.
        version = wheels.wheel_version(source.upstream_version or pin.version, f"{project.local_label}.unpinned.{source.tree[:8]}")
    with scratch_dir(f"mrl-{pin.distribution}-") as tmp:
        tree = tmp / "tree"
        applied = apply_series(pin, source, tree, engine=opts.engine, cache=cache)
        if not pin.series:
            step.note(pin.distribution, "empty series: nothing to apply")
        if source.release is not None:
            # No source distribution to build: the release's own metadata, our version.
            wheel = wheels.repack_release(tree, source.release, staging, version=version, epoch=wheels.commit_epoch(pin.date),
                                          who=pin.distribution)
            return _checked_record(pin, source, version, wheel, applied, None, env)
        wheels.set_static_version(tree, version)
        wheels.override_requirements(tree, pin.requirement_overrides, pin.distribution, pin.requirement_files)
        build_env = (buildenv.prepare(pin.distribution, tree, env.torch, opts.python, cache, pin.directory / buildenv.TOOLCHAIN_FILE,
                                     project.resolution_cutoff)
                     if pin.needs_torch else None)
        variables = {k: v.replace("{version}", version) for k, v in pin.build_env.items()}
        date = pin.date or source.date
        wheel = wheels.build_wheel(tree, staging, who=pin.distribution, env=variables, epoch=wheels.commit_epoch(date),
                                   python=opts.python, build_env=build_env, cache=cache)
    against = manifest.BuiltAgainst(build_env.torch, build_env.cuda) if build_env is not None else None
    return _checked_record(pin, source, version, wheel, applied, against, env)


def _checked_record(pin: Pin, source: sources.Source, version: str, wheel: pathlib.Path, applied: list[manifest.PatchRecord],
                    against: manifest.BuiltAgainst | None, env: target.Target) -> manifest.Distribution:
    name, got = (str(x) for x in parse_wheel_filename(wheel.name)[:2])
    if got != version or name != canonicalize_name(pin.distribution):
        raise OverlayError(
            f"{pin.distribution}: the build made {name} {got}, expected {pin.distribution} {version}; "
            f"check the build settings in {pin.pin_file}."
        )
    step.note(pin.distribution, f"built {wheel.name}")
    # MaxText itself is installed by the `maxtext` extra alone, not by the plain form.
    extra = env.extra if canonicalize_name(pin.distribution) == manifest.maxtext_name(env.maxtext) else ""
    return dataclasses.replace(_distribution_record(pin, source, version, wheel, applied, against), extra=extra)


def _distribution_record(pin: Pin, source: sources.Source, version: str, wheel: pathlib.Path, applied: list[manifest.PatchRecord],
                         built_against: manifest.BuiltAgainst | None) -> manifest.Distribution:
    """What the manifest says of one build: its pin and source, its series,
    and the sha256 of each file the series touches that the wheel installs
    (a touched test or build file is not installed: nothing to verify)."""
    touched = sorted({f for p in applied for f in p.files})
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        files = {f: hashlib.sha256(zf.read(f)).hexdigest() for f in touched if f in names}
    return manifest.Distribution(
        version=version,
        import_package=pin.import_package,
        from_pin=source.from_pin,
        pin=manifest.PinRecord(pin.repository, pin.commit, pin.tree, pin.date),
        source=manifest.SourceRecord(source.tree, source.commit, source.upstream_version),
        wheel=manifest.WheelFile(wheel.name, sha256_file(wheel)),
        series=tuple(applied),
        files=files,
        built_against=built_against,
        left_out=tuple(p.name for p in pin.series if p.name not in {a.name for a in applied}),
    )


def _environment_record(env: target.Target, adapter: manifest.Adapter | None, cutoff: str) -> manifest.EnvironmentRecord:
    torch = env.torch
    return manifest.EnvironmentRecord(env.maxtext, env.extra, manifest.TorchRecord(torch.version, torch.wanted, torch.standin, torch.torchvision),
                                      adapter, cutoff)


def _read_text(path: pathlib.Path) -> str:
    """A file's text; "" where there is none to read."""
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return ""


def _compare_with_previous(path: pathlib.Path, text: str, ours: set[str]) -> None:
    """The constraints file a build replaces is a witness: made from the
    same inputs (its header, the project commit aside), its pins must be
    the new ones, or the registry can no longer serve one under the cutoff
    (a file yanked or deleted upstream), which is an error naming each
    package; made otherwise (a moved cutoff, pin or requirement), the pins
    that moved are said. (Only the project's own file is a preference:
    closures.resolve's `prefer`.)"""
    previous = _read_text(path)
    if not previous.startswith(constraintsfile.CONSTRAINTS_HEADER):
        return
    drift = constraintsfile.unexplained_moves(previous, text, ours)
    if drift:
        raise OverlayError(
            f"the registry no longer gives, as of the resolution cutoff {constraintsfile.recorded_cutoff(text)}, the closure that {path} "
            f"was made with from these same inputs: {'; '.join(drift)}. What the cutoff cannot pin has moved upstream (a file yanked "
            "or deleted since); nothing was published. Check those releases on the registry, then move the cutoff on purpose "
            "(maxtext-rl-overlay cutoff --now) and build again.")
    moved = closures.moved_pins(previous, text, ours=ours)
    was, now = constraintsfile.recorded_cutoff(previous), constraintsfile.recorded_cutoff(text)
    said = f"resolution cutoff {was or 'none'} -> {now}" if was != now else f"resolution cutoff {now}"
    step.note("constraints", f"against the file it replaces ({said}): " + (f"{len(moved)} pins moved: {'; '.join(moved)}" if moved
                                                                             else "no pin moved (the overlay's own aside)"))


def _build_maxtext_adapter(env: target.Target, release: pathlib.Path, staging: pathlib.Path, python: str,
                           cache: pathlib.Path) -> manifest.Adapter | None:
    """MaxText's vLLM plugin, as a wheel made from the folder of `release`
    (the overlay's MaxText wheel, with its series; MaxText's own release
    where that was not built): what install_tpu_post_train_extra_deps
    installs from it."""
    if not env.vllm_adapter:
        return None
    folder = env.vllm_adapter.strip("/") + "/"
    with scratch_dir("mrl-adapter-") as tmp:
        tree = tmp / "adapter"
        with zipfile.ZipFile(release) as zf:
            members = [n for n in zf.namelist() if n.startswith(folder) and not n.endswith("/")]
            if not any(n == folder + "setup.py" for n in members):
                raise OverlayError(f"{release.name} has no {folder}setup.py: fix vllm-adapter in [tool.maxtext-rl-overlay.maxtext].")
            for name in members:
                dest = tree / name[len(folder):]
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(zf.read(name))
            # The folder has no licence file of its own: it is MaxText's code under
            # MaxText's licence, so the wheel carries the release's licence files.
            licences = [n for n in zf.namelist() if n.split("/")[0].endswith(".dist-info") and "/licenses/" in n and not n.endswith("/")]
            if not licences:
                raise OverlayError(f"{release.name} carries no licence files (.dist-info/licenses/): cannot redistribute its vLLM plugin.")
            for name in licences:
                (tree / name.rsplit("/", 1)[-1]).write_bytes(zf.read(name))
        wheel = wheels.build_wheel(tree, staging, who="maxtext-vllm-adapter", env={}, epoch=wheels.commit_epoch(None), python=python,
                                   cache=cache)
    name, version = (str(x) for x in parse_wheel_filename(wheel.name)[:2])
    step.note("maxtext-vllm-adapter", f"built {wheel.name} from {release.name}:{folder}")
    return manifest.Adapter(name, version, manifest.WheelFile(wheel.name, sha256_file(wheel)), f"{release.name}:{folder}")


def _build_overlay(project: Project, files: tuple[str, ...], record: manifest.Manifest, adapter: manifest.Adapter | None,
                   staging: pathlib.Path, python: str, cache: pathlib.Path) -> pathlib.Path:
    """The maxtext-rl-overlay wheel: our code (`files`, project-relative),
    the manifest, and exact dependencies on the overlay builds just made."""
    root = project.root
    meta = project.metadata
    with scratch_dir("mrl-overlay-") as tmp:
        tree = tmp / "maxtext-rl-overlay"
        tree.mkdir()
        for name in files:
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / name, tree / name)
        text = (root / "pyproject.toml").read_text()
        where = str(root / "pyproject.toml")
        deps = list(meta.get("dependencies", [])) + [f"{name}=={e.version}" for name, e in record.distributions.items() if not e.extra]
        text = tomledit.set_value(text, ("project",), "dependencies", deps, where=where)
        name = record.environment.extra
        extra = [_exact_if_built(req, record) for req in meta["optional-dependencies"][name]]
        if adapter:
            extra.append(f"{adapter.name}=={adapter.version}")
        text = tomledit.set_value(text, ("project", "optional-dependencies"), name, extra, where=where)
        (tree / "overlay" / "maxtext_rl_overlay" / manifest.RESOURCE).write_text(record.dumps())
        # The version's local label is the git tree id of everything the wheel
        # is made of but the version (our code, the manifest with every overlay
        # wheel's sha256, the dependencies), so that two builds never share
        # one name and version: uv's cache or an index holding both cannot mix them.
        (tree / "pyproject.toml").write_text(text)
        label = gittree.tree_id(tree)[:12]
        text = tomledit.set_value(text, ("project",), "version", f"{meta['version']}+{project.local_label}.{label}", where=where)
        (tree / "pyproject.toml").write_text(text)
        # The newest pinned commit date: the same on every machine.
        epoch = max((wheels.commit_epoch(e.pin.date) for e in record.distributions.values() if e.pin.date), key=int,
                    default=wheels.commit_epoch(None))
        return wheels.build_wheel(tree, staging, who="maxtext-rl-overlay", env={}, epoch=epoch, python=python, cache=cache)


def _exact_if_built(requirement: str, record: manifest.Manifest) -> str:
    """A requirement of the `maxtext` extra, pinned to the overlay's build of
    it where the release holds one (`maxtext[tpu-post-train]==0.2.4+mrl.N`:
    the release's public version is on the package index too)."""
    req = Requirement(requirement)
    built = record.distributions.get(canonicalize_name(req.name))
    if built is None or not built.extra:
        return requirement
    if not req.specifier.contains(built.version):
        raise OverlayError(f"the `{record.environment.extra}` extra asks for {requirement}, but patches/{req.name}/pin.toml builds "
                           f"{req.name} {built.version}: carry patches/{req.name}/ onto that release's wheel ([release]) first.")
    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
    return f"{req.name}{extras}=={built.version}" + (f"; {req.marker}" if req.marker else "")


def build_one(project_root: pathlib.Path, name: str, source: str | None, out_dir: pathlib.Path, *, python: str, allow_unpinned: bool,
              torch_standin: bool, cache: pathlib.Path | None = None) -> manifest.Distribution:
    """One upstream's wheel, built into `out_dir` as `build` builds it (the
    same source check, series, settings and cache) but for `python`, with no
    index and no closure: the TPU cell's wheel for a host whose Python the
    release's closure cannot serve (tpucell/bundle.py)."""
    project = load_project(project_root)
    if name not in project.pins:
        raise OverlayError(f"unknown distribution {name!r}; choose from {', '.join(project.pins)}.")
    cache = reader.cache_dir(cache)
    opts = BuildOptions(project.root, {name: source} if source else {}, python=python, allow_unpinned=allow_unpinned,
                        torch_standin=torch_standin, cache=cache)
    with buildcache.using(cache):
        env = target.resolve(project, torch_standin=torch_standin, cache=cache)
        return _build_upstream(project, project.pins[name], opts, env, out_dir, cache)
