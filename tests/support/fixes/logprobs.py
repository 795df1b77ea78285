"""What the logprobs tests (patches 0001, 0002) and the logprobs benchmark both need: the same
comparison with the single-device result, and the bytes that collectives move,
read from compiled HLO (deterministic, unlike time)."""

from __future__ import annotations

import re

import numpy as np

COLLECTIVES = ("all-gather", "all-reduce", "all-to-all", "collective-permute", "reduce-scatter")
_COLLECTIVE_LINE = re.compile(r"^\s*\S+ = (.+?) (" + "|".join(COLLECTIVES) + r")(?:-start)?\(", re.M)
_SHAPE = re.compile(r"\b(pred|[su](?:8|16|32|64)|bf16|f16|f32|f64)\[([\d,]*)\]")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2,
          "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8}


def collective_shapes(compiled) -> list[tuple[str, int]]:
    """(dtype, elements) of every array a collective yields in the compiled HLO
    (an async start counted whole)."""
    return [
        (dtype, int(np.prod([int(d) for d in dims.split(",") if d])))
        for m in _COLLECTIVE_LINE.finditer(compiled.as_text())
        for dtype, dims in _SHAPE.findall(m.group(1))
    ]


def collective_results(hlo_text: str) -> list[tuple[str, str, tuple[int, ...]]]:
    """(collective, dtype, dims) of every array a collective yields in
    compiled HLO text: what says whether one moves a vocab-sized tensor."""
    return [
        (m.group(2), dtype, tuple(int(d) for d in dims.split(",") if d))
        for m in _COLLECTIVE_LINE.finditer(hlo_text)
        for dtype, dims in _SHAPE.findall(m.group(1))
    ]


def collective_bytes(compiled) -> int:
    """Bytes of the results of every collective in the compiled HLO."""
    return sum(_BYTES[dtype] * n for dtype, n in collective_shapes(compiled))


def assert_same_result(got, want, dtype: str, what: str) -> None:
    """(token ids, logprobs, ranks) equal to the single-device run's: ids and
    ranks exactly, logprobs to float rounding (a sharded log_softmax reduces
    in another order: f32 a few ulps, bf16 one ulp)."""
    ids, lps, ranks = got
    want_ids, want_lps, want_ranks = want
    np.testing.assert_array_equal(ids, want_ids, err_msg=f"{what}: token ids")
    np.testing.assert_array_equal(ranks, want_ranks, err_msg=f"{what}: ranks")
    rtol = 1e-6 if dtype == "float32" else 2**-8
    np.testing.assert_allclose(lps, want_lps, rtol=rtol, atol=1e-5, err_msg=f"{what}: logprobs")
