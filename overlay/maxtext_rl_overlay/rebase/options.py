"""What the rebase command was asked to do."""

from __future__ import annotations

import dataclasses
import pathlib


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
