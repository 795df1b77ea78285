"""The rebase command's routing: which of the machines a request goes to.
A `--maxtext` move's own state wraps a distribution's, so --continue and
--abort go to it first, and a distribution's rebase is refused while one is
in progress."""

from __future__ import annotations

from ..core.errors import ExitCode
from . import release
from .findbase import find_base
from .machine import abort, resume, start
from .options import Abort, FindBase, RebaseOptions, ReleaseOptions, Request, Resume
from .render import render, render_base
from .report import Report


def command(request: Request) -> int:
    """`rebase`: the request carried out and what it did printed; the exit
    status (CHECK_FAILED where the person has to act: a conflict, a failed test)."""
    match request:
        case Abort(root):
            print(release.abort(root) if release.in_progress(root) else abort(root))
            return ExitCode.OK
        case Resume(root) if release.in_progress(root):
            moved = release.resume(root)
        case Resume(root):
            return _done(resume(root))
        case ReleaseOptions():
            moved = release.start(request)
        case FindBase(options):
            print(render_base(options.name, find_base(options)))
            return ExitCode.OK
        case RebaseOptions():
            if release.in_progress(request.project_root):  # its moves are this command's too: one at a time
                raise release.in_progress_error(request.project_root)
            return _done(start(request))
    print(moved.text)
    return ExitCode.CHECK_FAILED if moved.needs_action else ExitCode.OK


def _done(report: Report) -> int:
    print(render(report))
    return ExitCode.CHECK_FAILED if report.needs_action else ExitCode.OK
