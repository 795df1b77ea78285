"""Carry a distribution's patch series onto a new upstream commit.

    scripts/rebase.sh NAME NEW_REF [--source PATH] [--build] [--apply-vllm-lkg]
    scripts/rebase.sh NAME NEW_REF --find-base [--source PATH]
    scripts/rebase.sh --continue | --abort

The series is applied with `git am -3`, one patch at a time, in a work clone
of the upstream at build/rebase/<NAME>/ (gitignored). Per patch the outcome
is one of state.Outcome. On success the series is re-exported in place (same
file names; author, author date and message kept, so an unchanged patch gives
no diff), the pin is moved (commit, tree, date, version: values edited in
place, comments kept), optionally the wheels and constraints.txt are rebuilt,
and the fast tests run. On a conflict the command stops, leaving the work
clone at the conflicting patch; `--continue` resumes once the person has
resolved and `git add`ed there, `--abort` restores every file the rebase may
touch from the backup taken before the first change (build/rebase/state/).

A patch that upstream already contains (it reverse-applies cleanly, or its
3-way merge changes nothing) is dropped: its file is deleted and its line in
`series` becomes a comment recording where upstream has it:

    # Applied-Upstream: 0002-x.patch in <upstream commit> ("subject"); dropped by scripts/rebase.sh onto <new pin commit>

<upstream commit> is the upstream commit with the same `git patch-id` when
there is one between the old and the new pin, else the new pin commit itself.

A rebase killed at any instant (SIGKILL, the OOM killer, a preempted
machine: no cleanup runs) leaves nothing the next command takes for a
result: the state record is the commit point of each step (state.py), every
project file is written whole (staging.write_atomically), --continue takes
the run up from its record (the work clone rewound to the last recorded
patch, the series written again), --abort finishes an abort cut short, and a
start clears a state folder without its record, saying so; a refusal says
what it found and what to run (docs/failures.md, "What a failure leaves behind").

What differs between distributions is data, in patches/<NAME>/pin.toml
[rebase] (pins.RebasePolicy): the rule naming the new version, and a file of
the upstream naming the commit of another pin its CI verified.

The modules: options and report (the API's types; options also parses the
command's request: which of its modes, its flags checked), state (what
survives a stop: each run's folder and record), upstream (fetch, work clone),
apply (one patch's outcome), export (writing the series and the pins),
versions, rebuild (--build) and fasttests (the two last steps), findbase,
render, and
machine (start, --continue, --abort); release (`--maxtext VERSION`: every
pin a MaxText release names, one machine run each, and the `maxtext` extra).
"""

from . import release
from .findbase import BaseFound, find_base
from .machine import abort, resume, start
from .options import RebaseOptions
from .render import render, render_base
from .report import Report
from .state import Outcome

__all__ = ["BaseFound", "Outcome", "RebaseOptions", "Report", "abort", "find_base", "release", "render", "render_base", "resume", "start"]
