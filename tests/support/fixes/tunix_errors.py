"""The report's exact IndexErrors of upstream Tunix's `transfer_state_directly`."""

from __future__ import annotations

import linecache

#: The failing statements at the pin (utils.py lines 1257 and 1702; 12 more in 0.1.7).
STACKED_RNG = ("_bulk_align_and_unstack", "+ (arr.shape[scan_axis],)")
SCALAR_RNG = ("intersect_trees", "sliced_val = unstacked_cache[cache_key][layer_idx]")


def assert_report_error(excinfo, where: tuple[str, str]) -> str:
    """`excinfo` is the report's IndexError, raised by the statement `where[1]`
    in the function `where[0]` of the upstream module (support/fixes/unpatched.py).
    Returns the error and its line, in words."""
    function, statement = where
    assert excinfo.type is IndexError
    assert str(excinfo.value) == "tuple index out of range"
    last = excinfo.traceback[-1]
    assert last.frame.code.name == function
    assert "__unpatched" in str(last.path)
    # The failing line itself, not the statement around it.
    lineno = last.lineno + 1  # pytest counts from 0
    line = linecache.getline(str(last.path), lineno).strip()
    assert line == statement, (lineno, line)
    said = f"upstream {last.path.name}:{lineno} in {function}: {line}: IndexError: {excinfo.value}"
    print(said)
    return said
