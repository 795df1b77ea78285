"""The rebase's optional last step (--build), the same for one
distribution's rebase (machine.py) and a MaxText release's (release.py): the
wheels and constraints.txt built from the new pins."""

from __future__ import annotations

import pathlib

from ..core.errors import OverlayError
from ..core.output import step


def rebuild(root: pathlib.Path, who: str, what: str, sources: dict[str, str], cache: str, standins: bool, *,
            written: str, undo: str = "") -> None:
    """Build the project at `root` from `sources` (NAME=PATH). A failure
    says what the rebase has `written` already, that constraints.txt is
    unchanged, and that --continue builds again (or --abort, which `undo`
    explains, puts everything back)."""
    from ..stages.run import BuildOptions, build

    with step(who, what):
        try:
            build(BuildOptions(project_root=root, sources=dict(sources), cache=pathlib.Path(cache),
                               torch_standin=standins, allow_unpinned=standins))
        except OverlayError as exc:
            raise OverlayError(
                f"{exc}\n{written}; the build failed, so constraints.txt is unchanged. Fix the cause and run "
                f"scripts/rebase.sh --continue (builds again), or scripts/rebase.sh --abort{undo}."
            ) from None
