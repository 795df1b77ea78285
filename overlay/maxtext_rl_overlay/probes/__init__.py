"""The child programs the tool runs in another interpreter: the one of the
environment checked (verify, smoke), the TPU cell host's python3, a build
venv's (its torch), or any interpreter the tool asks its version.

Each is a module of its own, standard library only, so that it runs before
the stack is known to import, and in an environment that may not hold this
package at all (verify's tests ask a bare venv; the TPU cell's host runs its
probe before anything is installed). They are started by their file's path,
never with `-m` (which would need maxtext_rl_overlay importable there), and
through `python -c` (RUN), so that sys.path is what the user's
`python -c "import ..."` sees (the current directory first), not this
folder: a probe's sibling must never shadow a module it asks about."""

from __future__ import annotations

import pathlib

HERE = pathlib.Path(__file__).resolve().parent
#: `python -c RUN FILE ARGS...` runs FILE as __main__ with argv [FILE, ARGS...]
#: and sys.path as `python -c` has it (run_path adds no folder for a file).
#: tpucell/host.py, which must not import this package, says it again.
RUN = "import runpy, sys; sys.argv[:] = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"


def command(python: str, probe: str, *args: str) -> list[str]:
    """The command line that runs the probe module `probe` (its name in this
    package, such as "resolver") with `python`."""
    path = HERE / f"{probe}.py"
    if not path.is_file():
        raise ValueError(f"no probe named {probe!r} in {HERE}")
    return [python, "-c", RUN, str(path), *args]
