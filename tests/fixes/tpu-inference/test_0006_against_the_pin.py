"""tpu-inference 0006 against the pin, property by property: the overlay's
sampler and logprobs on random inputs drawn by hypothesis, compared with the
pin's (support/fixes/runner.py: upstream_sampler, the installed sampling.py
with the series reverse-applied, loaded beside it).

The inputs: batch sizes and vocabularies from a small set (some not divisible
by the shard count), rows of every kind the engine can meet (random, bfloat16
ties, runs of equal values across shards, flat rows, NaN, +inf, NaN with
+inf, only -inf, some -inf, +-FLT_MAX), temperatures from 1e-4 to 10 beside
greedy rows, top-k from 0 to V, top-p from 1e-6 to 1 and at and near the
mass of a prefix of the row, gather_logprobs with k from 0 to 64 on the raw
and on the processed logits. The meshes: every ("data", "model") shape of 8
devices with Auto axes (the engine's: 0006's vocab-sharded path wherever
"model" > 1) and Explicit axes (0001-0004's path), and the vocab-sharded
path forced onto one shard of a (1, 1) mesh (vocab_layout gives None there;
the TPU chip's only way to run it). In the TPU cell (MRL_TPU_CHIPS: a host's
own chips, one v5e included) every ("data", "model") shape of its chips, so
on one chip the (1, 1) meshes and the forced path.

The reference is the pin's code on the Auto mesh of the same shape (at the pin
it fails under Explicit axes: test_0003_sample.py, test_0001_gather_logprobs.py).
What must hold (patch 0006's header and docs/fixes.md say the same):

- bitwise: the greedy program's tokens and logits; each sampled or greedy
  row's token and processed logits (the top-k set, ties included, the
  values, rows holding NaN, +inf or only -inf), except where top-p falls at
  a rounding flip (below);
- top-p, equal up to summation order: where the kept sets differ, they are
  nested value prefixes of the row and either p lies within EPS(V) * p of
  the exact mass of the smaller one, or the values between them tie with the
  smaller set's last one to rounding (probabilities within a factor
  1 + TIE); the overlay's token is then the pin's own draw
  (jax.random.categorical, same key) over the overlay's set;
- logprobs, equal up to summation order: |overlay - pin| <= ulp(value) +
  ulp(ln V) + EPS(V), NaN where the pin has NaN; ids equal except between
  values whose exact logprobs lie within twice that of each other, ranks
  equal except by the number of such near-ties of the token's value.

EPS(V) = 4 * ceil(log2 V) * 2**-24: the two sums of the row's exponentials
(or of a prefix's probabilities) add the same terms in another order.

MRL_QUICK=1 (the quick matrix): fewer examples and meshes, a small fixed set
of shapes and logprob counts, so that jax compiles few programs (about a
minute on 2 cores); otherwise the full profile (several minutes).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from support.fixes.matrix import CHIPS, DEVICES, MAXTEXT_SHIMS
from support.fixes.runner import overlay_sampler, upstream_sampler

#: The TPU cell runs it on its host's chips too, however many (one v5e included).
pytestmark = pytest.mark.tpu_cell

QUICK = os.environ.get("MRL_QUICK") == "1"
#: Relative bound on the difference of two f32 sums of the same V terms in
#: other orders (the top-p masses, the logprobs' log-sum): 4 * ceil(log2 V) ulps.
EPS_ULPS_PER_LOG2V = 4
#: Two probabilities that round to one float in one implementation: their
#: exact ratio is below 1 + TIE.
TIE = 2.0**-21
REPLACE = np.float32(-1e12)  # binary_search's replace_val, as sampling.py passes it
F32_MAX = np.finfo(np.float32).max


def unit(dtype) -> float:
    """The unit roundoff of the dtype logprobs are computed in (2**-24 for float32, 2**-8 for bfloat16)."""
    return 2.0 ** -(jnp.finfo(dtype).nmant + 1)


def eps(vocab: int, dtype=np.float32) -> float:
    return EPS_ULPS_PER_LOG2V * math.ceil(math.log2(vocab)) * unit(dtype)


def ulp(values, dtype) -> np.ndarray:
    """The spacing of `dtype`'s floats at |values| (0 where not finite)."""
    a = np.abs(np.asarray(values, np.float64))
    exponent = np.floor(np.log2(np.where(np.isfinite(a) & (a > 0), a, 1.0)))
    return np.where(np.isfinite(a), 2.0 ** (np.maximum(exponent, jnp.finfo(dtype).minexp) - jnp.finfo(dtype).nmant), 0.0)


@dataclasses.dataclass(frozen=True)
class Variant:
    """A mesh the overlay runs on: ("data", "model") of `shape`, its axes
    Auto, Explicit, or Auto with the vocab-sharded path forced onto one shard."""

    shape: tuple[int, int]
    axes: str  # "auto", "explicit", "one-shard"

    @property
    def id(self) -> str:
        return f"{self.shape[0]}x{self.shape[1]}-{self.axes}"


def variants() -> list[Variant]:
    """The meshes of this run's devices: the matrix's 8 (a v6e-8 or its CPU
    simulation), or the TPU cell's chips (counted by the cell: this process
    must not open them while it collects)."""
    if CHIPS != DEVICES:
        shapes = [(d, CHIPS // d) for d in range(1, CHIPS + 1) if CHIPS % d == 0]
        return [Variant(s, a) for s in shapes for a in ("auto", "explicit")] + [Variant((1, 1), "one-shard")]
    if QUICK:
        # The vocab over every device (Auto), rows and vocab both split (Auto,
        # as the engine's tiny MoE), 0001-0004's path (Explicit), one shard.
        return [Variant((1, 8), "auto"), Variant((2, 4), "auto"), Variant((4, 2), "explicit"), Variant((1, 1), "one-shard")]
    return [Variant(s, a) for s in ((1, 8), (2, 4), (4, 2), (8, 1)) for a in ("auto", "explicit")] + [Variant((1, 1), "one-shard")]


#: (batch, vocab): 1002 splits over 2 shards only (the others keep upstream's
#: programs); 520 leaves a shard of 8 just over the 64 candidates.
SHAPES = [(8, 1024), (8, 1002)] if QUICK else [(8, 1024), (16, 1024), (8, 1002), (8, 520), (16, 4096)]
#: gather_logprobs' k (static: each one compiles).
LOGPROB_K = st.sampled_from([0, 20, 64]) if QUICK else st.integers(0, 64)
EXAMPLES = 12 if QUICK else 30
#: The logits' dtype: a bfloat16 model's logits are bfloat16 (sample() casts
#: them to float32 after the greedy argmax; the logprobs stay bfloat16).
DTYPES = ["float32"] if QUICK else ["float32", "bfloat16"]


def make_mesh(shape, axes: str) -> Mesh:
    kind = AxisType.Explicit if axes == "explicit" else AxisType.Auto
    devices = np.array(jax.devices()[: shape[0] * shape[1]]).reshape(shape)
    return Mesh(devices, ("data", "model"), axis_types=(kind, kind))


# ---------------------------------------------------------------- the inputs

KINDS = ("normal", "bf16", "ties", "flat", "nan", "posinf", "nan_posinf", "neginf_only", "neginf_some", "huge")


@dataclasses.dataclass(frozen=True)
class Row:
    kind: str
    scale: float
    temperature: float
    top_k: int
    top_p: tuple  # ("p", value) or ("prefix", j, relative offset)


@dataclasses.dataclass(frozen=True)
class Example:
    batch: int
    vocab: int
    dtype: str
    seed: int
    key: int
    k: int
    rows: tuple


@st.composite
def rows(draw, vocab: int, kind: str) -> Row:
    scale = draw(st.sampled_from([0.01, 1.0, 3.0, 30.0]))
    temperature = draw(st.one_of(st.just(0.0), st.sampled_from([1e-4, 1e-3, 0.1, 1.0, 10.0]),
                                 st.floats(1e-4, 10.0)))
    top_k = draw(st.one_of(st.just(0), st.integers(1, 64), st.integers(65, vocab), st.just(vocab)))
    top_p = draw(st.one_of(st.just(("p", 1.0)), st.tuples(st.just("p"), st.floats(1e-6, 1.0, exclude_max=True)),
                           st.tuples(st.just("prefix"), st.integers(1, 200),
                                     st.sampled_from([0.0, 1e-7, -1e-7, 2e-7, -2e-7, 1e-6, -1e-6])),
                           st.sampled_from([("p", 1e-6), ("p", 0.5), ("p", 0.9), ("p", 0.95), ("p", 0.999999)])))
    return Row(kind, scale, temperature, top_k, top_p)


@st.composite
def examples(draw) -> Example:
    batch, vocab = draw(st.sampled_from(SHAPES))
    # Every kind of row in every example (a few examples must show them all).
    kinds = draw(st.permutations(KINDS))
    return Example(batch, vocab, draw(st.sampled_from(DTYPES)), draw(st.integers(0, 2**32 - 1)), draw(st.integers(0, 2**31 - 1)), draw(LOGPROB_K),
                   tuple(draw(rows(vocab, kinds[i % len(kinds)])) for i in range(batch)))


def build_row(rng: np.random.Generator, row: Row, vocab: int) -> np.ndarray:
    x = rng.normal(size=vocab) * row.scale
    where = rng.choice(vocab, size=3, replace=False)
    if row.kind == "bf16":
        x = np.asarray(jnp.asarray(x, jnp.bfloat16), np.float64)
    elif row.kind == "ties":
        # Runs of one value spread over the shards, at the top and further down.
        order = np.argsort(-x)
        for rank in (0, int(rng.integers(1, 80))):
            x[rng.choice(vocab, size=int(rng.integers(2, 100)), replace=False)] = x[order[rank]]
    elif row.kind == "flat":
        x = np.full(vocab, rng.normal()) + (rng.normal(size=vocab) * 1e-6 if rng.integers(2) else 0.0)
    elif row.kind == "nan":
        x[where[: 1 + int(rng.integers(3))]] = np.nan
    elif row.kind == "posinf":
        x[where[: 1 + int(rng.integers(3))]] = np.inf
    elif row.kind == "nan_posinf":
        x[where[:2]] = np.nan, np.inf
    elif row.kind == "neginf_only":
        x[:] = -np.inf
    elif row.kind == "neginf_some":
        x[rng.random(vocab) < 0.5] = -np.inf
    elif row.kind == "huge":
        x[where[:2]] = F32_MAX, -F32_MAX
    return x.astype(np.float32)


def prefix_mass_p(x: np.ndarray, row: Row) -> float:
    """A top-p at (or a relative offset from) the exact mass of the row's
    j-th prefix by value after temperature and top-k: where the two
    implementations' sums may round to opposite sides."""
    _, j, offset = row.top_p
    if row.temperature <= 0 or not np.isfinite(x).all():
        return 0.9
    z = x.astype(np.float64) / np.float64(np.float32(row.temperature))
    if row.top_k > 0:
        z = np.where(z >= np.sort(z)[::-1][min(row.top_k, len(z)) - 1], z, -np.inf)
    q = np.exp(z - z.max())
    q /= q.sum()
    values = np.unique(q[q > 0])[::-1]
    mass = q[q >= values[min(j, len(values)) - 1]].sum()
    return float(np.clip(np.float32(mass * (1 + offset)), 1e-6, np.nextafter(np.float32(1), np.float32(0))))


def host_inputs(ex: Example):
    rng = np.random.default_rng(ex.seed)
    x = np.stack([build_row(rng, row, ex.vocab) for row in ex.rows])
    if ex.dtype == "bfloat16":
        x = np.asarray(jnp.asarray(x, jnp.bfloat16))
    temperature = np.array([row.temperature for row in ex.rows], np.float32)
    top_k = np.array([row.top_k for row in ex.rows], np.int32)
    top_p = np.array([row.top_p[1] if row.top_p[0] == "p" else prefix_mass_p(x[i], row) for i, row in enumerate(ex.rows)],
                     np.float32)
    return x, temperature, top_k, top_p


# ----------------------------------------------------------- the two samplers


@pytest.fixture(scope="module")
def pin():
    return upstream_sampler().sampling


@pytest.fixture(scope="module")
def ours():
    return overlay_sampler().sampling


class Side:
    """One sampler on one mesh: sample(), the greedy program and
    compute_and_gather_logprobs as the runner calls them."""

    def __init__(self, module, mesh: Mesh, takes_mesh: bool, one_shard: bool = False):
        from tpu_inference.layers.common.sharding import ShardingAxisName

        self.module, self.mesh, self.takes_mesh = module, mesh, takes_mesh
        self.rows = P(ShardingAxisName.ATTN_DATA)
        self.logits = P(ShardingAxisName.MLP_DATA, ShardingAxisName.MLP_TENSOR)
        self.rows_only = P(ShardingAxisName.MLP_DATA, None)
        self._sample, self._logprobs = module.sample, module.compute_and_gather_logprobs
        if one_shard:
            self._sample, self._logprobs = forced_one_shard(module, mesh)

    def put(self, a, spec):
        return jax.device_put(a, NamedSharding(self.mesh, spec))

    def put_logits(self, x):
        model = self.mesh.shape["model"]
        return self.put(x, self.logits if x.shape[1] % model == 0 else self.rows_only)  # jax cannot place an uneven split

    def metadata(self, do_sampling, temperature=None, top_k=None, top_p=None):
        from tpu_inference.layers.jax.sample.sampling_metadata import TPUSupportedSamplingMetadata

        dummy = self.put(np.zeros((2,), np.int32), P())
        if not do_sampling:
            return TPUSupportedSamplingMetadata(do_sampling=False, _cache_collision_dummy=dummy)
        return TPUSupportedSamplingMetadata(temperature=self.put(temperature, self.rows), top_k=self.put(top_k, self.rows),
                                            top_p=self.put(top_p, self.rows), _cache_collision_dummy=dummy, do_sampling=True)

    def sample(self, key, x, meta):
        tokens, logits = self._sample(jax.random.key(key), self.mesh, self.put_logits(x), meta)
        return np.asarray(tokens), np.asarray(logits)

    def logprobs(self, x, ids, k):
        args = (self.mesh,) if self.takes_mesh else ()
        out = self._logprobs(self.put_logits(x), self.put(ids, P()), k, *args)
        return [np.asarray(a) for a in out[:3]]


def forced_one_shard(module, mesh: Mesh):
    """sample() and compute_and_gather_logprobs with 0006's vocab-sharded
    branch taken on one shard: vocab_layout is None on a (1, 1) mesh, so the
    layout is made here, and each function runs what the installed one runs
    once it has a layout (sampling._sample_vocab_sharded; the candidates or
    the full-vocabulary path, as uses_candidates says)."""
    from tpu_inference.layers.jax.sample import vocab_sharded

    layout = vocab_sharded.VocabLayout(mesh, (), ("model",), 1)

    @functools.partial(jax.jit, static_argnames=("mesh",))
    def sample(rng, mesh, logits, meta):
        logits = logits + 0 * jnp.sum(meta._cache_collision_dummy)  # as sample() does
        return module._sample_vocab_sharded(layout, rng, mesh, logits, meta)

    @functools.partial(jax.jit, static_argnames=("k",))
    def logprobs(logits, token_ids, k):
        if vocab_sharded.uses_candidates(layout, logits.shape[-1], k):
            return vocab_sharded.compute_and_gather_logprobs(layout, logits, token_ids, k)
        return module.gather_logprobs(module.compute_logprobs(logits), token_ids, k)

    return sample, logprobs


# -------------------------------------------------------------- what must hold


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def exact_probs(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    q = np.exp(z - z.max())
    return q / q.sum()


def exact_logprobs(x: np.ndarray) -> np.ndarray:
    """jax.nn.log_softmax in float64, NaN rows where it gives NaN rows."""
    x = x.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        shifted = x - x.max(axis=-1, keepdims=True)
        return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


class Seen:
    """The largest departures seen within the stated bounds (JUnit properties)."""

    def __init__(self):
        self.rows = self.flips = self.tie_flips = self.id_swaps = self.rank_moves = 0
        self.flip_mass = 0.0  # max |mass - p| / p at a flip, in EPS(V)
        self.flip_rel = 0.0  # the same, relative to p
        self.logprob = 0.0  # max |overlay - pin| over its bound
        self.logprob_abs = 0.0


def check_topp_flip(r, vocab, p, z_k, want, got, seen: Seen, where: str) -> None:
    """Row r's processed logits differ: only a top-p rounding flip may do that."""
    assert p < 1.0, f"{where}: row {r}: processed logits differ without top-p (p={p})"
    assert np.isfinite(z_k.max()), f"{where}: row {r}: a non-finite row must be upstream's bit for bit"
    kept_want, kept_got = want != REPLACE, got != REPLACE
    both = kept_want & kept_got
    assert (bits(want[both]) == bits(got[both])).all() and (bits(got[both]) == bits(z_k[both])).all(), \
        f"{where}: row {r}: kept values differ"
    only = kept_want ^ kept_got
    assert not ((kept_got & ~kept_want).any() and (kept_want & ~kept_got).any()), f"{where}: row {r}: kept sets not nested"
    assert both.any() and z_k[only].max() < z_k[both].min(), f"{where}: row {r}: the sets are not prefixes by value"
    q = exact_probs(z_k)
    mass = q[both].sum()
    off = abs(mass - p) / p / eps(vocab)  # the processed logits are float32 whatever the logits' dtype
    tie = q[both].min() / q[only].min() - 1
    assert off <= 1 or tie <= TIE, (
        f"{where}: row {r}: top-p {p} kept {kept_want.sum()} (pin) vs {kept_got.sum()} (overlay); the smaller set's exact "
        f"mass {mass!r} is {off:.3g} EPS(V) from p, and its last value's probability {tie:.3g} above the next's (TIE {TIE:.3g})"
    )
    seen.flips += 1
    if off <= 1:
        seen.flip_mass = max(seen.flip_mass, off)
        seen.flip_rel = max(seen.flip_rel, abs(mass - p) / p)
    else:
        seen.tie_flips += 1


def check_logprobs(got, want, x: np.ndarray, vocab: int, seen: Seen, where: str) -> None:
    dtype = x.dtype
    ids, values, ranks = got
    want_ids, want_values, want_ranks = want
    np.testing.assert_array_equal(ids[:, 0], want_ids[:, 0], err_msg=f"{where}: token ids")
    assert values.dtype == want_values.dtype, f"{where}: logprobs of {values.dtype}, the pin's {want_values.dtype}"
    values, want_values = values.astype(np.float64), want_values.astype(np.float64)
    assert (np.isnan(values) == np.isnan(want_values)).all(), f"{where}: NaN logprobs where the pin's are not (or not where they are)"
    finite = np.isfinite(want_values)
    assert (values[~finite & ~np.isnan(want_values)] == want_values[~finite & ~np.isnan(want_values)]).all(), f"{where}: infinite logprobs"
    bound = ulp(want_values, dtype) + ulp(np.float64(math.log(vocab)), dtype) + eps(vocab, dtype)
    diff = np.abs(values - want_values)
    assert (diff[finite] <= bound[finite]).all(), (
        f"{where}: logprobs differ by {diff[finite].max()!r}, over the bound (ratio {(diff[finite] / bound[finite]).max():.3g})")
    if finite.any():
        seen.logprob = max(seen.logprob, float((diff[finite] / bound[finite]).max()))
        seen.logprob_abs = max(seen.logprob_abs, float(diff[finite].max()))
    exact = exact_logprobs(x)
    rows = np.arange(len(x))[:, None]
    a, b = exact[rows, ids[:, 1:]], exact[rows, want_ids[:, 1:]]
    swapped = ids[:, 1:] != want_ids[:, 1:]
    near = np.isfinite(a) & np.isfinite(b) & (a != b) & (np.abs(a - b) <= 2 * bound[:, 1:])
    assert (near | ~swapped).all(), f"{where}: top-k ids differ at {np.argwhere(swapped & ~near).tolist()}, not between near-ties"
    seen.id_swaps += int(swapped.sum())
    token = exact[np.arange(len(x)), want_ids[:, 0]][:, None]
    ties = ((exact != token) & (np.abs(exact - token) <= 2 * bound[:, :1])).sum(axis=-1)
    moved = np.abs(ranks.astype(np.int64) - want_ranks)
    assert (moved <= ties).all(), f"{where}: ranks {ranks.tolist()} vs the pin's {want_ranks.tolist()} (near-ties {ties.tolist()})"
    seen.rank_moves += int((moved > 0).sum())


def run_example(ex: Example, pin_side: Side, our_side: Side, seen: Seen) -> None:
    x, temperature, top_k, top_p = host_inputs(ex)
    where = f"{dict(our_side.mesh.shape)}, {ex.dtype}{list(x.shape)}, seed {ex.seed}, key {ex.key}"
    eps_sampling = pin_side.module._SAMPLING_EPS

    # The greedy program: bit for bit.
    want = pin_side.sample(ex.key, x, pin_side.metadata(False))
    got = our_side.sample(ex.key, x, our_side.metadata(False))
    np.testing.assert_array_equal(got[0], want[0], err_msg=f"{where}: greedy tokens")
    assert (bits(got[1]) == bits(want[1])).all(), f"{where}: greedy logits"

    # The sampling program, greedy and sampled rows mixed.
    want_tokens, want_logits = pin_side.sample(ex.key, x, pin_side.metadata(True, temperature, top_k, top_p))
    got_tokens, got_logits = our_side.sample(ex.key, x, our_side.metadata(True, temperature, top_k, top_p))
    # The pin's logits after temperature and top-k only; its own draw over the overlay's sets.
    _, topk_only = pin_side.sample(ex.key, x, pin_side.metadata(True, temperature, top_k, np.ones_like(top_p)))
    ones = np.ones_like(temperature)
    draws, _ = pin_side.sample(ex.key, got_logits, pin_side.metadata(True, ones, np.zeros_like(top_k), np.ones_like(top_p)))
    for r in range(ex.batch):
        seen.rows += 1
        at = f"{where}, row {r} ({ex.rows[r]}, p={top_p[r]!r})"
        if temperature[r] < eps_sampling or (bits(got_logits[r]) == bits(want_logits[r])).all():
            assert got_tokens[r] == want_tokens[r], f"{at}: token {got_tokens[r]}, the pin's {want_tokens[r]}"
            assert (bits(got_logits[r]) == bits(want_logits[r])).all(), f"{at}: logits"
        else:
            check_topp_flip(r, ex.vocab, float(top_p[r]), topk_only[r], want_logits[r], got_logits[r], seen, at)
        if temperature[r] >= eps_sampling:
            assert got_tokens[r] == draws[r], f"{at}: token {got_tokens[r]} is not the key's draw over its set ({draws[r]})"

    # gather_logprobs on the raw and the processed logits (the pin's: both sides get the same input).
    ids = got_tokens.astype(np.int32)
    for what, logits in (("raw", x), ("processed", want_logits)):
        check_logprobs(our_side.logprobs(logits, ids, ex.k), pin_side.logprobs(logits, ids, ex.k), logits, ex.vocab, seen,
                       f"{where}: {what} logprobs, k={ex.k}")


@pytest.mark.timeout(300 if QUICK else 1800)
@pytest.mark.parametrize("variant", variants(), ids=lambda v: v.id)
def test_overlay_is_the_pins_sampler(pin, ours, variant, record_property):
    if QUICK and MAXTEXT_SHIMS:
        pytest.skip("the quick matrix runs this property in py312: MaxText's session-wide shims only catch exceptions, "
                    "which neither sampler raises here (the pin runs on Auto axes); the full matrix runs it under them too")
    if variant.axes == "explicit" and not hasattr(jax.sharding, "reshard"):
        pytest.skip(f"jax {jax.__version__} has no jax.sharding.reshard: Explicit axes as the overlay uses them need a newer jax")
    pin_side = Side(pin, make_mesh(variant.shape, "auto"), takes_mesh=False)
    our_side = Side(ours, make_mesh(variant.shape, variant.axes), takes_mesh=variant.axes != "one-shard",
                    one_shard=variant.axes == "one-shard")
    seen = Seen()

    # Seeded per mesh (other inputs on each), no example database: the same examples every run.
    @seed(zlib.crc32(variant.id.encode()))
    @settings(max_examples=EXAMPLES, deadline=None, database=None, print_blob=True,
              phases=(Phase.explicit, Phase.generate, Phase.shrink), suppress_health_check=list(HealthCheck))
    @given(examples())
    def prop(ex):
        run_example(ex, pin_side, our_side, seen)

    prop()
    for name, value in vars(seen).items():
        record_property(name, float(value))
    print(f"{variant.id}: {vars(seen)}")
