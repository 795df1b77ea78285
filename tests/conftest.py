"""Marker policy for the whole suite: a test that needs what CI cannot have
(a TPU, the upstream git repositories) is selected by a marker and, where that
is absent, skipped with a reason that says what it would have checked
(pytest's -ra lists every reason at the end of the run)."""
