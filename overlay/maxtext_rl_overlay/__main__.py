"""The maxtext-rl-overlay command line.

Each subcommand parses its flags into the options of one stage module (its
`from_args`) and calls that stage's one command function, which prints the
stage's answer and returns the exit status; the stages hold all the logic
and the reports' shapes. Exit statuses are ExitCode (errors.py), the same for
every subcommand and documented in --help: a failure's is the one its error
carries."""

from __future__ import annotations

import argparse
import errno
import math
import os
import pathlib
import sys
import traceback
from collections.abc import Callable
from typing import Any

# Every stage at module level: none imports jax, torch or transformers at
# import time (smoke's engine and references import them in the processes
# they start), so --help stays fast.
from . import __version__
from .cache import buildcache
from .checks import verify
from .config.pins import DISTRIBUTIONS, load_project, set_resolution_cutoff
from .config.reader import cache_dir, cutoff_now, cutoff_value, named_source, project_root
from .core import interrupts, output, staging
from .core.errors import ExitCode, OverlayError, UsageError
from .maintain import lint, testmatrix
from .maintain.testmatrix import PLATFORMS, MatrixOptions
from .rebase.command import command as rebase_command
from .rebase.options import request_from_args
from .smoke import configurations as smoke_configurations
from .smoke import report as smoke_report
from .smoke.run import SmokeOptions
from .stages import run as build
from .stages.indexpages import base_url
from .stages.patching import ENGINES
from .tpucell import bundle

DESCRIPTION = """\
MaxText RL's vLLM/Tunix stack on TPU: the pinned upstreams (google-tunix,
tpu-inference, vllm) with their fixes carried as patch series, built into
wheels and published with a constraints file.

On a TPU VM, after `uv pip install -c constraints.txt maxtext-rl-overlay`
(or "maxtext-rl-overlay[maxtext]"), run `maxtext-rl-overlay verify`, then
`maxtext-rl-overlay smoke` (a real rollout on the machine's chips, checked).
In a checkout of the project, `build`, `lint`, `rebase` and `test-matrix`
make and test the release; `clean` empties the build cache."""


EPILOG = f"""\
exit status:
  {ExitCode.OK:<3}  success
  {ExitCode.CHECK_FAILED:<3}  a check said no: verify found differences, smoke a failed check, lint found problems, the matrix
       or the rebase's fast tests failed, or a rebase stopped at a conflict
  {ExitCode.USAGE:<3}  the command line was wrong
  {ExitCode.ERROR:<3}  the command could not do its work (the message says why and what to do)
  {ExitCode.INTERNAL:<3}  an unexpected error: a bug in the tool, please report it (-v shows the traceback)
  {ExitCode.INTERRUPTED:<3}  interrupted (SIGINT, SIGTERM, SIGHUP, SIGQUIT): the programs it ran stopped, staging
       folders removed, nothing published (or, once publishing had begun, all of it: the message says which)
"""


def _source_arg(text: str) -> tuple[str, str]:
    try:
        return named_source(text, DISTRIBUTIONS)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _only_arg(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in DISTRIBUTIONS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown distribution(s) {', '.join(unknown) or repr(text)}; choose from {', '.join(DISTRIBUTIONS)}")
    return names


def _base_url_arg(text: str) -> str:
    try:
        base_url(text)
    except OverlayError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--base-url ")) from None
    return text


def _python_arg(text: str) -> str:
    # An empty PYTHON once fell back to this interpreter unsaid; the default
    # is BuildOptions' now, so an empty one is refused rather than run.
    if not text.strip():
        raise argparse.ArgumentTypeError("an interpreter is needed (leave --python out for this one)")
    return text


def _seconds_arg(text: str) -> float:
    """A positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive, finite number of seconds, not {text!r}")
    return value


# Each command: its options, parsed by the parser's `options` (the stage's
# from_args), then its stage's one function.


def _cmd_cutoff(opts: tuple[pathlib.Path, str | None]) -> int:
    root, moved_to = opts
    if moved_to is None:
        print(f"resolution-cutoff: {load_project(root).resolution_cutoff}")
        return ExitCode.OK
    old = set_resolution_cutoff(root, moved_to)
    print(f"resolution-cutoff: {old} -> {moved_to} in {root / 'pyproject.toml'}. Commit it, then rebuild constraints.txt from that "
          "commit (scripts/build-wheels.sh, with the sources it names) and commit it: the build lists the pins that moved.")
    return ExitCode.OK


def _cutoff_options(args: argparse.Namespace) -> tuple[pathlib.Path, str | None]:
    return project_root(args.project), cutoff_now() if args.now else args.set


def _cutoff_arg(text: str) -> str:
    try:
        return cutoff_value(text, "--set")
    except OverlayError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--set: ")) from None


def _project_root(args: argparse.Namespace) -> pathlib.Path:
    return project_root(args.project)


def _cache_root(args: argparse.Namespace) -> pathlib.Path:
    return cache_dir()


def _parser() -> argparse.ArgumentParser:
    # The defaults a flag shares with its stage are the stage's options' own.
    # -v on the command or after it; SUPPRESS keeps a subcommand's default
    # from overwriting a -v given before the subcommand.
    verbose = argparse.ArgumentParser(add_help=False)
    verbose.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                         help="echo every command the tool runs, and stream the output of builds, installs and tests")
    project = argparse.ArgumentParser(add_help=False)
    project.add_argument("--project", type=pathlib.Path, metavar="DIR",
                         help="the maxtext-rl-overlay checkout (default: the one holding the current folder)")
    names = ", ".join(DISTRIBUTIONS)

    parser = argparse.ArgumentParser(prog="maxtext-rl-overlay", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", default=False,
                        help="echo every command the tool runs, and stream the output of builds, installs and tests")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str, *parents: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".", epilog=EPILOG,
                           parents=[verbose, *parents], formatter_class=argparse.RawDescriptionHelpFormatter)
        p.set_defaults(parser=p)  # for the usage line of a UsageError
        return p

    def runs(p: argparse.ArgumentParser, func: Callable[[Any], int], options: Callable[[argparse.Namespace], Any]) -> None:
        """`func` runs the command on what `options` parses its flags into."""
        p.set_defaults(func=func, options=options)

    v = command("verify", "check that the installed stack is the overlay's builds, intact, and that it imports")
    v.add_argument("--require-pinned", action="store_true",
                   help="also fail on stand-ins: wheels built from unpinned sources, PyPI's torch for the CPU build")
    v.add_argument("--no-imports", action="store_true", help="check files and versions only; skip importing the stack in a fresh process")
    v.add_argument("--files-only", action="store_true",
                   help="check the overlay's own distributions only (versions, patched files, where a plain import finds them, "
                        "leftovers); skip the closure's torch and the imports (an image layer over a base whose closure is "
                        "checked otherwise: a stand-in base without jax and torch)")
    v.add_argument("--host-deviations", type=pathlib.Path, metavar="CLOSURE",
                   help="a host that cannot hold the release's closure (the TPU cell, docs/tpu-cell.md): CLOSURE is the release's "
                        "(the bundle's release-closure.txt); every difference from it is named in the verdict, and torch at the "
                        "host's version is accepted as one")
    v.add_argument("--json", type=pathlib.Path, metavar="FILE",
                   help="also write the findings and the verdict as JSON to FILE (docs/reports.md), on a NO too")
    runs(v, verify.command, verify.VerifyOptions.from_args)

    s = command("smoke", "start the installed engine on a tiny model made here, generate, and check it against transformers")
    s.add_argument("--cpu-simulation", action="store_true",
                   help="run the same checks on 8 CPU devices, the TPU kernels interpreted (not a hardware qualification)")
    s.add_argument("--json", type=pathlib.Path, metavar="FILE", help="also write the results as JSON to FILE (docs/reports.md)")
    s.add_argument("--timeout", type=_seconds_arg, default=SmokeOptions.timeout, metavar="SECONDS",
                   help="for each engine process, start and generates (default: %(default).0f); past it the check names the step")
    s.add_argument("--configuration", action="append", default=[], choices=[c.name for c in smoke_configurations.SMOKE], metavar="NAME",
                   help="run this configuration only (repeat for more; default: every one: "
                        f"{', '.join(c.name for c in smoke_configurations.SMOKE)}); the others are reported as not selected")
    runs(s, smoke_report.command, SmokeOptions.from_args)

    b = command("build", "build the overlay wheels, the index and constraints.txt from the pins", project)
    b.add_argument("--source", action="append", default=[], type=_source_arg, metavar="NAME=PATH",
                   help=f"where to take upstream NAME ({names}) from: a git repository holding the pinned commit, "
                        "or a source tree or archive (default: fetch the pinned commit with git)")
    b.add_argument("--only", type=_only_arg, metavar="NAME[,NAME...]", help=f"build only these upstreams, of {names} (maxtext-rl-overlay is always built)")
    b.add_argument("--out", type=pathlib.Path, metavar="DIR", help="where the index goes (default: dist/ in the project)")
    b.add_argument("--constraints", type=pathlib.Path, metavar="FILE", help="where constraints.txt goes (default: the project's); an existing file is replaced "
                        "only if it is empty or a constraints file the tool wrote")
    b.add_argument("--unpinned", action="store_true", help="accept source trees that are not the pinned tree, labelled as stand-ins")
    b.add_argument("--torch-standin", action="store_true",
                   help="resolve with PyPI's build of MaxText's torch version (a CUDA build) where the PyTorch CPU index "
                        "is out of reach; labelled as a stand-in")
    b.add_argument("--engine", choices=ENGINES, help="how to apply the patches (default: git where installed)")
    b.add_argument("--python", type=_python_arg, default=build.BuildOptions.python, metavar="PYTHON",
                   help="interpreter for the builds and the resolver (default: this one)")
    b.add_argument("--base-url", type=_base_url_arg, metavar="URL",
                   help="where the index folder will be served: its constraints.txt then names the index by this URL")
    runs(b, build.command, build.BuildOptions.from_args)

    li = command("lint", "check every patch of every series for its trailers and format", project)
    runs(li, lint.command, _project_root)

    cut = command("cutoff", "print the resolution cutoff (pyproject.toml's resolution-cutoff: every resolution sees the registry as of it), "
                            "or move it", project)
    moves = cut.add_mutually_exclusive_group()
    moves.add_argument("--set", type=_cutoff_arg, metavar="WHEN", help="move it to WHEN, a UTC time written YYYY-MM-DDTHH:MM:SSZ")
    moves.add_argument("--now", action="store_true", help="move it to this moment")
    runs(cut, _cmd_cutoff, _cutoff_options)

    r = command("rebase", "carry a patch series onto a new upstream commit, or every pin onto a MaxText release's (stops at a conflict)", project)
    r.add_argument("name", nargs="?", metavar="NAME", choices=DISTRIBUTIONS, help=f"the upstream: {names}")
    r.add_argument("new_ref", nargs="?", metavar="NEW_REF", help="a commit, tag or branch of the upstream")
    r.add_argument("--maxtext", metavar="VERSION",
                   help="move every pin to the commit MaxText VERSION's wheel names, and the maxtext extra to that release")
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
    runs(r, rebase_command, request_from_args)

    t = command("test-matrix", "install the wheels into a fresh venv per cell, verify, and run tests/fixes", project)
    t.add_argument("--wheels", type=pathlib.Path, required=True, metavar="DIR", help="the index folder (with its constraints.txt)")
    t.add_argument("--work", type=pathlib.Path, required=True, metavar="DIR", help="where the cells' venvs and JUnit XML go")
    t.add_argument("--platform", choices=PLATFORMS, default="cpu",
                   help="cpu: 8 simulated devices; tpu: a real v6e-8 (default: %(default)s)")
    t.add_argument("--quick", action="store_true", help="the subset every CI run takes")
    t.add_argument("--keep", action="store_true", help="keep the venvs")
    t.add_argument("--json", type=pathlib.Path, metavar="FILE", help="also write the results as JSON to FILE (docs/reports.md)")
    runs(t, testmatrix.command, MatrixOptions.from_args)

    cell = command("tpu-cell", "the TPU cell: a release bundled for a TPU host with its own JAX and no network (docs/tpu-cell.md)")
    cell_sub = cell.add_subparsers(dest="cell_command", required=True, metavar="COMMAND")
    cb = cell_sub.add_parser("bundle", help="make the bundle (here, with the registry in reach)", parents=[verbose, project],
                             description="Make the TPU cell's bundle from a release: the closure resolved for the host, the wheels "
                                         "its index lacks, the tests, the stand-ins and run.sh.")
    cb.set_defaults(parser=cb)
    runs(cb, bundle.command, bundle.BundleOptions.from_args)
    cb.add_argument("--release", type=pathlib.Path, required=True, metavar="DIST", help="the release (a build's --out, with its constraints.txt)")
    cb.add_argument("--out", type=pathlib.Path, required=True, metavar="BUNDLE", help="the bundle's folder (replaced if it is a bundle)")
    cb.add_argument("--host-index", action="append", default=[], required=True, metavar="URL_OR_DIR",
                    help="the host's package index: a simple index (folder or file:// URL) or a folder of wheels, as the same path "
                         "exists on the host (repeat for each)")
    cb.add_argument("--host-python", default=bundle.BundleOptions.host_python, metavar="X.Y", help="the host's Python (default: %(default)s)")
    cb.add_argument("--host-platform", default=bundle.BundleOptions.host_platform, metavar="ARCH-manylinux_2_N",
                    help="the host's platform, its glibc as a manylinux tag (default: %(default)s, the release's; run.sh checks it)")
    cb.add_argument("--host-jax", metavar="VERSION", help="the host's JAX (default: the one version the host's index holds)")
    cb.add_argument("--host-keep", default=",".join(bundle.BundleOptions.host_keep), metavar="NAME,...",
                    help="what the host has installed of its own and keeps (default: %(default)s)")
    cb.add_argument("--host-override", action="append", default=[], metavar="NAME==VERSION",
                    help="a distribution the host takes at another version than the release's (a deviation, named as one)")
    cb.add_argument("--form", choices=sorted(bundle.FORMS), default=bundle.BundleOptions.form,
                    help="the form to install on the host: plain (maxtext-rl-overlay) or maxtext (maxtext-rl-overlay[maxtext], "
                         "MaxText's RL environment) (default: %(default)s)")
    cb.add_argument("--leave-out", action="append", default=[], metavar="NAME,...[:REASON]",
                    help="distributions of the closure not to install on the host, with what only they need, and why (what one call "
                         "can carry is limited); recorded with the reason in bundle.json and the cell's report, named as deviations "
                         "(repeat for each reason)")
    cb.add_argument("--leave-out-file", type=pathlib.Path, metavar="FILE",
                    help="more --leave-out, one NAME,...:REASON a line (# comments)")
    cb.add_argument("--part-size", type=float, default=bundle.PART_SIZE / 2**20, metavar="MIB",
                    help="a bundle larger than this is also written in parts of at most this size, BUNDLE/parts/ (default: "
                         "%(default)g: one call to the host carries 64 MiB with the checkout's tracked files)")
    cb.add_argument("--source", action="append", default=[], type=_source_arg, metavar="NAME=PATH",
                    help="as build's: the pin's source (tpu-inference's tests; vLLM where it is rebuilt for the host's Python)")
    cb.add_argument("--python", type=_python_arg, metavar="PYTHON", help="an interpreter of the host's Python here (vLLM's rebuild)")
    cb.add_argument("--unpinned", action="store_true", help="as build's (the release was built with it)")
    cb.add_argument("--torch-standin", action="store_true", help="as build's (the release was built with it)")

    c = command("clean", "empty the build cache (MRL_CACHE_DIR, by default ~/.cache/maxtext-rl-overlay); refused while a build uses it")
    runs(c, buildcache.command, _cache_root)
    return parser


def main(argv: list[str] | None = None) -> int:
    # Before anything else: a terminated run must clean up like an
    # interrupted one (every stage removes its staging folder on the way
    # out), and no signal may go unseen.
    with interrupts.installed():
        return _run(argv)


def _run(argv: list[str] | None) -> int:
    args = _parser().parse_args(argv)  # a wrong command line exits here, with USAGE
    try:
        output.set_verbose(args.verbose)
        code = int(args.func(args.options(args)))
        interrupts.check()  # one that came during the last cleanup
        return code
    except UsageError as exc:
        args.parser.print_usage(sys.stderr)
        output.emit(f"{args.parser.prog}: error: {exc}")  # argparse's own form, after its usage line
        return exc.status
    except OverlayError as exc:
        output.say(f"error: {exc}")
        return exc.status
    except KeyboardInterrupt:
        if interrupts.published():
            output.say("interrupted after the results were published, whole.")
        else:
            output.say("interrupted; nothing was published.")
        return ExitCode.INTERRUPTED
    except Exception as exc:
        if isinstance(exc, OSError) and exc.errno in staging.NO_SPACE:
            # A full filesystem is the user's to fix, wherever the write was (the stages name their own destinations: this is the rest).
            where = exc.filename2 if exc.filename2 is not None else exc.filename
            why = "disk quota exceeded" if exc.errno == errno.EDQUOT else "no space left on device"
            path = os.fsdecode(where) if where is not None else "the output, the cache (MRL_CACHE_DIR) or the temporary folder (TMPDIR)"
            output.say(f"error: {why}: cannot write {path}. Free space on its filesystem, or name another place.")
            return ExitCode.ERROR
        # Anything else is a bug: said so, in one line unless -v.
        if args.verbose:
            traceback.print_exc()
        said = str(exc).strip().splitlines()
        output.say(f"unexpected error: {type(exc).__name__}" + (f": {said[0]}" if said else ""))
        output.say("this is a bug in maxtext-rl-overlay; please report it, with the output of the same "
                   "command run with -v (which shows the traceback).")
        return ExitCode.INTERNAL

if __name__ == "__main__":
    sys.exit(main())
