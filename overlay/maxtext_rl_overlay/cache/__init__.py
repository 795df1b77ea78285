"""The build cache (buildcache: its kinds, entries and locks) and what a kept
result is keyed by (cachekeys). It imports core/ and probes/ alone."""
