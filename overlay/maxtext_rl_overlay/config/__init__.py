"""What the tool reads before any work: the schema (every setting once, read
from resources/settings.toml), the reader (pyproject's table, MRL_*), the
pins, the target (MaxText's release and torch), and release files from the
package index (registry, which keeps them in the cache). It imports
cache/ and core/ alone."""
