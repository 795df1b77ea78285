"""Progress lines for long steps: which upstream, which stage, how long.

Written to stderr so that stdout stays for results (tables, paths)."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator


class _Step:
    def __call__(self, who: str, what: str) -> contextlib.AbstractContextManager[None]:
        return self._timed(who, what)

    @contextlib.contextmanager
    def _timed(self, who: str, what: str) -> Iterator[None]:
        start = time.monotonic()
        print(f"[{who}] {what} ...", file=sys.stderr, flush=True)
        try:
            yield
        except BaseException:
            print(f"[{who}] {what}: failed after {time.monotonic() - start:.1f}s", file=sys.stderr, flush=True)
            raise
        print(f"[{who}] {what}: done in {time.monotonic() - start:.1f}s", file=sys.stderr, flush=True)

    @staticmethod
    def note(who: str, what: str) -> None:
        print(f"[{who}] {what}", file=sys.stderr, flush=True)


step = _Step()
