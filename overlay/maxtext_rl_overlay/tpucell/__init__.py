"""The TPU cell (docs/tpu-cell.md): a release carried to a TPU host that has
its own JAX, its own package index and no network, installed there offline
and run. bundle (here, in a checkout), hostindex (what the host's index
holds), host (there: run.sh runs it as the bundle's cell.py)."""
