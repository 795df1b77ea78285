"""The progress lines' old name: `step` is output.step.

Kept so that code not yet moved to `output` (smoke/) goes on working; new
code imports `output`, the one channel for the lines a person reads."""

from __future__ import annotations

from .output import step

__all__ = ["step"]
