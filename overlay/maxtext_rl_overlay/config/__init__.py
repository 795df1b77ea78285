"""What the tool reads before any work: the schema (every setting once, as
data), the options (pyproject's table, MRL_*), the pins, MaxText's release
and torch (environment), and release files from the package index
(registry, which keeps them in the cache). It imports
cache/ and core/ alone."""
