"""Helpers of the test suites, one module (or subpackage) per suite.

Importable as `support` because pyproject.toml's [tool.pytest.ini_options]
`pythonpath` puts tests/ on sys.path for every pytest run (the tool venv's
and the matrix's); no test or conftest edits sys.path.

- support.project: project copies, pins set in them, the real tool run on
  them; for tests/unit, tests/pipeline and tests/rebase (tool venv).
- support.pipeline: the build-pipeline tests, tests/pipeline (tool venv).
- support.rebase: the rebase tests, tests/rebase (tool venv).
- support.fixes: the patched-behaviour suite, tests/fixes (matrix venvs: it
  imports jax and the installed overlay wheels).
- support.programs: the child programs those tests start
  (`python -m support.programs.NAME`), each a main() and what only it needs.

tests/unit keeps its own helpers beside it (unit/unit_support.py).
"""

import pathlib

#: tests/ and the project root, for the suites that read the project's files
#: (patches/, pyproject.toml) or start a process that imports this package.
TESTS = pathlib.Path(__file__).resolve().parent.parent
ROOT = TESTS.parent
