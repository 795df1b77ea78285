"""Command line: a thin layer over the stage modules.

    maxtext-rl-overlay build [--source NAME=PATH]... [--only NAMES] [--out DIR] [--base-url URL] ...
    maxtext-rl-overlay verify [--require-pinned]
    maxtext-rl-overlay lint
    maxtext-rl-overlay rebase NAME NEW_REF [--source PATH] [--build] | --continue | --abort
"""

from __future__ import annotations

import argparse
import pathlib
import signal
import sys

from .errors import OverlayError


def _find_project(start: pathlib.Path) -> pathlib.Path:
    for path in (start, *start.parents):
        if (path / "patches").is_dir() and (path / "pyproject.toml").is_file():
            return path
    raise OverlayError(f"{start} is not inside a maxtext-rl-overlay checkout (no patches/ and pyproject.toml above it); pass --project.")


def _source_arg(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, got {text!r}")
    return name, path


def _cmd_build(args: argparse.Namespace) -> int:
    from .build import BuildOptions, build

    given: dict[str, str] = {}
    for name, path in args.source:
        if name in given:
            raise OverlayError(f"--source {name} given twice.")
        given[name] = path
    result = build(
        BuildOptions(
            project_root=args.project or _find_project(pathlib.Path.cwd()),
            sources=given,
            only=[n.strip() for n in args.only.split(",") if n.strip()] if args.only else None,
            out=args.out,
            constraints=args.constraints,
            allow_unpinned=args.unpinned,
            engine=args.engine,
            python=args.python or sys.executable,
            torch_standin=args.torch_standin,
            base_url=args.base_url,
        )
    )
    for name, sha in result.wheels.items():
        print(f"{sha}  {name}")
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from . import manifest, verify

    doc = manifest.load_installed()
    findings = verify.check(doc, require_pinned=args.require_pinned)
    if not args.no_imports:
        findings += verify.check_imports(doc)
    print(verify.render(findings))
    bad = [f for f in findings if not f.ok]
    if bad:
        print(f"\nverify: NO - {len(bad)} check(s) failed.", file=sys.stderr)
        for line in verify.explain(findings, doc):
            print(f"  {line}", file=sys.stderr)
        return 1
    what = "the installed distributions are the overlay builds, patched files intact"
    print(f"\nverify: yes - {what}" + ("." if args.no_imports else "; the stack imports."))
    return 0


def _cmd_lint(args: argparse.Namespace) -> int:
    from . import patchfile
    from .pins import load_project

    project = load_project(args.project or _find_project(pathlib.Path.cwd()))
    problems = [problem for pin in project.pins.values() for path in pin.series for problem in patchfile.lint(patchfile.parse(path))]
    for problem in problems:
        print(problem)
    count = sum(len(p.series) for p in project.pins.values())
    print(f"lint: {count} patch(es), {len(problems)} problem(s)")
    return 1 if problems else 0


def _cmd_test_matrix(args: argparse.Namespace) -> int:
    from . import testmatrix

    root = args.project or _find_project(pathlib.Path.cwd())
    results = testmatrix.run(root, args.wheels.resolve(), args.work.resolve(), platform=args.platform, quick=args.quick, keep=args.keep)
    print(testmatrix.render(results))
    return 0 if results and all(r.ok for r in results) else 1


def _cmd_rebase(args: argparse.Namespace) -> int:
    from . import rebase

    root = args.project or _find_project(pathlib.Path.cwd())
    if args.cont or args.abort:
        if args.name or args.new_ref:
            raise OverlayError("--continue and --abort take no NAME or NEW_REF: they act on the rebase in progress.")
        if args.abort:
            print(rebase.abort(root))
            return 0
        report = rebase.resume(root)
    else:
        if not (args.name and args.new_ref):
            raise OverlayError("usage: rebase NAME NEW_REF [--source PATH] [--build] [--apply-vllm-lkg] [--find-base]; or --continue / --abort.")
        own = [s for s in args.source if "=" not in s]
        others = dict(_source_arg(s) for s in args.source if "=" in s)
        if len(own) > 1:
            raise OverlayError("--source PATH (the upstream being rebased) given twice.")
        opts = rebase.RebaseOptions(root, args.name, args.new_ref, source=own[0] if own else others.pop(args.name, None),
                                    build=args.build, build_sources=others, apply_vllm_lkg=args.apply_vllm_lkg,
                                    run_tests=not args.no_tests, standins=args.standins)
        if args.find_base:
            print(rebase.render_base(args.name, rebase.find_base(opts)))
            return 0
        report = rebase.start(opts)
    print(rebase.render(report))
    return 1 if report.stopped or not report.tests_ok else 0


def _interrupt(signum, frame):  # noqa: ARG001 - signal handler signature
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="maxtext-rl-overlay", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    b = sub.add_parser("build", help="build the overlay wheels, the index and constraints.txt")
    b.add_argument("--source", action="append", default=[], type=_source_arg, metavar="NAME=PATH",
                   help="a git repository holding the pinned commit, or a source tree or archive")
    b.add_argument("--only", metavar="NAME[,NAME...]", help="build only these upstreams (maxtext-rl-overlay is always built)")
    b.add_argument("--out", type=pathlib.Path, help="where the index goes (default: dist/)")
    b.add_argument("--constraints", type=pathlib.Path, help="where constraints.txt goes (default: the project's)")
    b.add_argument("--unpinned", action="store_true", help="accept source trees that are not the pinned tree, labelled as such")
    b.add_argument("--torch-standin", action="store_true",
                   help="resolve with PyPI's build of MaxText's torch version (a CUDA build) where the PyTorch CPU index is out of reach; labelled as a stand-in")
    b.add_argument("--engine", choices=("git", "patch-ng"), help="patch engine (default: git where installed)")
    b.add_argument("--python", help="interpreter for the builds and the resolver (default: this one)")
    b.add_argument("--project", type=pathlib.Path, help="the maxtext-rl-overlay checkout (default: found from the current folder)")
    b.add_argument("--base-url", metavar="URL", help="where the index folder will be served: its constraints.txt then names the index by this URL")
    b.set_defaults(func=_cmd_build)

    v = sub.add_parser("verify", help="check that the installed distributions are the overlay builds")
    v.add_argument("--require-pinned", action="store_true", help="also fail on stand-ins: wheels built from unpinned sources, PyPI's torch for the CPU build")
    v.add_argument("--no-imports", action="store_true", help="check files and versions only; skip importing the stack in a fresh process")
    v.set_defaults(func=_cmd_verify)

    lint = sub.add_parser("lint", help="check every patch of every series for its trailers and format")
    lint.add_argument("--project", type=pathlib.Path)
    lint.set_defaults(func=_cmd_lint)

    t = sub.add_parser("test-matrix", help="install the wheels into a fresh venv per cell, verify, and run tests/fixes")
    t.add_argument("--wheels", type=pathlib.Path, required=True, help="the index folder (with its constraints.txt)")
    t.add_argument("--work", type=pathlib.Path, required=True, help="where the cells' venvs and JUnit XML go")
    t.add_argument("--platform", choices=("cpu", "tpu"), default="cpu")
    t.add_argument("--quick", action="store_true", help="the subset every CI run takes")
    t.add_argument("--keep", action="store_true", help="keep the venvs")
    t.add_argument("--project", type=pathlib.Path)
    t.set_defaults(func=_cmd_test_matrix)

    r = sub.add_parser("rebase", help="carry a patch series onto a new upstream commit (stops at a conflict)")
    r.add_argument("name", nargs="?", metavar="NAME", help="google-tunix, tpu-inference or vllm")
    r.add_argument("new_ref", nargs="?", metavar="NEW_REF", help="a commit, tag or branch of the upstream")
    r.add_argument("--source", action="append", default=[], metavar="PATH|NAME=PATH",
                   help="a local git repository or mirror of the upstream; NAME=PATH: another upstream's source for --build")
    r.add_argument("--build", action="store_true", help="rebuild the wheels and constraints.txt from the new pins")
    r.add_argument("--standins", action="store_true",
                   help="--build with stand-ins where the real inputs are out of reach: build --unpinned --torch-standin")
    r.add_argument("--apply-vllm-lkg", action="store_true", help="tpu-inference: move the vLLM pin to the one its CI verified")
    r.add_argument("--find-base", action="store_true", help="report the newest commit before NEW_REF the series applies to")
    r.add_argument("--no-tests", action="store_true", help="skip the fast tests (tests/unit) at the end")
    r.add_argument("--continue", dest="cont", action="store_true", help="resume after resolving a conflict in the work clone")
    r.add_argument("--abort", action="store_true", help="undo the rebase in progress: every file restored from its backup")
    r.add_argument("--project", type=pathlib.Path)
    r.set_defaults(func=_cmd_rebase)

    args = parser.parse_args(argv)
    # A terminated build must clean up like an interrupted one: every stage
    # removes its staging folder on the way out.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        return args.func(args)
    except OverlayError as exc:
        print(f"maxtext-rl-overlay: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("maxtext-rl-overlay: interrupted; nothing was published.", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
