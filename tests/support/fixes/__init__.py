"""Helpers of tests/fixes, the patched-behaviour suite run in the matrix venvs.

Kept free of imports: tests/fixes/conftest.py imports support.fixes.matrix
to set the XLA flags before jax is first imported, so importing this package
must not import jax.
"""
