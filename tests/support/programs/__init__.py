"""Child programs the tests run with `python -m support.programs.NAME`: each holds a main() and what only it needs."""
