"""What the rebase command was asked to do: the options of one
distribution's rebase, and the request the command line makes (one of five
things, its flags checked against each other by parse_request)."""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
from collections.abc import Sequence
from typing import TypeAlias

from ..config.pins import DISTRIBUTIONS
from ..config.reader import named_source
from ..config.reader import project_root as reader_project_root
from ..core.errors import UsageError


@dataclasses.dataclass
class RebaseOptions:
    project_root: pathlib.Path
    name: str
    new_ref: str
    source: str | None = None  # a local git repository or mirror of the upstream
    build: bool = False  # rebuild the wheels and constraints.txt at the end
    build_sources: dict[str, str] = dataclasses.field(default_factory=dict)  # the other upstreams, for --build
    standins: bool = False  # --build as `build --unpinned --torch-standin`: stand-ins where the real inputs are out of reach
    apply_vllm_lkg: bool = False  # move the pin [rebase] last-known-good names to the commit the upstream verified
    run_tests: bool = True
    cache: pathlib.Path | None = None
    check_clean: bool = True  # False within `--maxtext`: it checked the checkout before its first move


@dataclasses.dataclass
class ReleaseOptions:
    """--maxtext VERSION: every pin moved to the commit a MaxText release names."""
    project_root: pathlib.Path
    version: str
    sources: dict[str, str] = dataclasses.field(default_factory=dict)  # NAME=PATH: where each new commit is
    build: bool = False
    standins: bool = False
    run_tests: bool = True
    cache: pathlib.Path | None = None


@dataclasses.dataclass(frozen=True)
class FindBase:
    """--find-base: report the newest commit before NEW_REF the series applies to; nothing is changed."""
    options: RebaseOptions


@dataclasses.dataclass(frozen=True)
class Resume:
    """--continue: the rebase in progress (a --maxtext move's, or one distribution's) goes on."""
    project_root: pathlib.Path


@dataclasses.dataclass(frozen=True)
class Abort:
    """--abort: the rebase in progress is undone (or an abort cut short finished)."""
    project_root: pathlib.Path


#: What `rebase` does: carry one series onto NEW_REF (RebaseOptions), find
#: its base, move every pin to a MaxText release's (ReleaseOptions), resume or abort.
Request: TypeAlias = RebaseOptions | FindBase | ReleaseOptions | Resume | Abort


def absolute(path: str) -> str:
    """A --source of the rebase as an absolute path, resolved when the
    command is given: the rebase stores it, and --continue may run from
    elsewhere (the work clone its stop message sends the person into), as
    may the build command it suggests. A URL stays as it is."""
    return path if "://" in path else str(pathlib.Path(path).expanduser().resolve())


def request_from_args(args: argparse.Namespace) -> Request:
    """The rebase command line's request (parse_request on its flags)."""
    return parse_request(reader_project_root(args.project), name=args.name, new_ref=args.new_ref, maxtext=args.maxtext,
                         sources=args.source, build=args.build, standins=args.standins, apply_vllm_lkg=args.apply_vllm_lkg,
                         find_base=args.find_base, run_tests=not args.no_tests, resume=args.cont, abort=args.abort)


def parse_request(project_root: pathlib.Path, *, name: str | None, new_ref: str | None, maxtext: str | None,
                  sources: Sequence[str], build: bool, standins: bool, apply_vllm_lkg: bool, find_base: bool,
                  run_tests: bool, resume: bool, abort: bool) -> Request:
    """The rebase command's arguments and flags as the request they make. A
    flag its mode does not take, or a --source that mode cannot read, is a
    UsageError: --continue/--abort take no NAME, NEW_REF or --maxtext;
    --maxtext takes NAME=PATH sources only; otherwise NAME and NEW_REF are
    required, with at most one PATH (the upstream being rebased) and any
    number of NAME=PATH (the other upstreams, for --build)."""
    if resume or abort:
        if name or new_ref or maxtext:
            raise UsageError("--continue and --abort take no NAME, NEW_REF or --maxtext: they act on the rebase in progress.")
        return Abort(project_root) if abort else Resume(project_root)
    if maxtext:
        if name or new_ref or find_base or apply_vllm_lkg:
            raise UsageError("--maxtext VERSION takes no NAME, NEW_REF, --find-base or --apply-vllm-lkg: the release names every commit.")
        try:
            given = {each: absolute(path) for each, path in (named_source(s, DISTRIBUTIONS) for s in sources)}
        except ValueError as exc:
            raise UsageError(f"--source: {exc} (--maxtext takes NAME=PATH only)") from None
        return ReleaseOptions(project_root, maxtext, given, build=build, standins=standins, run_tests=run_tests)
    if not (name and new_ref):
        raise UsageError("NAME and NEW_REF are required (or --continue / --abort).")
    own = [absolute(s) for s in sources if "=" not in s]
    try:
        others = {each: absolute(path) for each, path in (named_source(s, DISTRIBUTIONS) for s in sources if "=" in s)}
    except ValueError as exc:
        raise UsageError(f"--source: {exc}") from None
    if len(own) > 1:
        raise UsageError("--source PATH (the upstream being rebased) given twice.")
    options = RebaseOptions(project_root, name, new_ref, source=own[0] if own else others.pop(name, None), build=build,
                            build_sources=others, apply_vllm_lkg=apply_vllm_lkg, run_tests=run_tests, standins=standins)
    return FindBase(options) if find_base else options
