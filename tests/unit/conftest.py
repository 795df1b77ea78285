"""--import-mode=importlib puts no test folder on sys.path; the fast tests'
helpers (unit_support) live here."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
