"""vLLM's engine on the installed stack, as the RL rollout configures it: how
far it gets, upstream and with the overlay, and what it generates.

support/programs/engine_start.py starts `vllm.LLM` (the tool's smoke engine) in a
process of its own per configuration, on a tiny Llama with non-degenerate random weights written
by transformers as a safetensors checkpoint (the tool's maxtext_rl_overlay/smoke/tiny_llama.py) and
loaded by the engine's own weight loader, tensor parallel over the 8
devices, with the report's logprobs settings (`max_logprobs=1`,
`logprobs_mode="processed_logprobs"`). Each process does every generate its
tests check (an engine start costs 20-60 s here). The engines:

- the reported configuration (`device-indexes`: Tunix's `device_indexes`,
  the runner's 2D ("data", "model") mesh), upstream: the engine dies where
  the report says, while `TPUWorker.initialize_from_config` precompiles the
  sampler before allocating the KV caches: `_precompile_gather_logprobs`
  raises the report's ShardingTypeError ("The input should be unsharded over
  the axis along which to compute the top_k values. Got input
  type=float32[8@data,1024@model] and axis=1"). Before it, lowering each of
  the four `sample` variants failed with the AssertionError of
  `with_sharding_constraint` under Explicit axes, which the compilation
  manager logs and leaves to the warm-up call.
- the same, with the overlay: the runner's mesh has Auto axes and the given
  device order (the backport of upstream's 984b29c49), every sampler
  compilation lowers, compiles and warms up, the model is captured, and the
  engine generates: greedy tokens equal transformers' own greedy `generate`
  on the same checkpoint, and each token's logprob agrees with
  transformers' log_softmax within LOGPROB_TOLERANCE.
- `new-model-design` (`NEW_MODEL_DESIGN=1`: the 7-axis mesh, Auto axes even
  at the pin), upstream: it generates the reference tokens too, and the RL
  rollout's batch (prompts of several lengths, greedy and sampled with the
  engine's seed) gives the same tokens as in the overlay's engine (and, in
  each engine, the greedy batch again gives the same tokens again).
- `maxtext` (MaxText cell only): MaxText's own model in the engine, as
  train_rl's `maxtext_on_vllm` runs it (`MaxTextForCausalLM`,
  `NEW_MODEL_DESIGN=1`), a tiny qwen3 that MaxText initialises and writes as
  its checkpoint (support/fixes/maxtext_models.py), restored by the
  adapter's own `load_weights`: on the overlay its greedy tokens equal
  MaxText's own forward of the same weights outside vLLM, logprobs within
  LOGPROB_TOLERANCE; in the full matrix the pin's engine gives the same.
- `moe-tp1-ep8-dp-attention`: the configuration whose warm-up hung
  upstream's vocab-sharded sampler (#3490, reverted in #3584), a tiny MoE
  (support/fixes/tiny_moe.py: tpu-inference's own JAX Llama 4, bfloat16)
  with TP=1, EP=8 and data-parallel attention (the rows split over
  attn_dp_expert, the vocab over "expert"): every program compiles, none
  gathers the vocab, and the pin's engine (its sampler gathering the vocab)
  gives the same greedy and sampled tokens. Its reference is the pin's
  engine, not transformers: see tiny_moe.py.

On the CPU simulation the engine's TPU kernels (the attention) run in Pallas
TPU interpret mode (the tool's maxtext_rl_overlay/smoke/pallas_interpret.py; the test ids say
`pallas-interpret`), and the devices' memory statistics are stood in for (see
support/programs/engine_start.py). The seconds each engine start and generate took are
recorded as JUnit properties: CPU seconds, not a TPU's.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from maxtext_rl_overlay.smoke import tiny_llama
from support.fixes import kernel_mode, maxtext_models, maxtext_shims, tiny_moe
from support.fixes.engine_probe import (
    ENGINE_TIMEOUT,
    describe,
    events_of,
    record_run,
    record_stand_in,
    sampler_programs,
    start_engine,
    started,
)
from support.fixes.meshes import WSC_ASSERT
from support.programs import engine_start

REPORT = (
    "The input should be unsharded over the axis along which to compute the top_k values. "
    "Got input type=float32[8@data,1024@model] and axis=1"
)
SAMPLER_COMPILATIONS = [
    ("sample", {"num_reqs": "8", "do_sampling": "True", "logprobs": "True"}),
    ("sample", {"num_reqs": "8", "do_sampling": "True", "logprobs": "False"}),
    ("sample", {"num_reqs": "8", "do_sampling": "False", "logprobs": "True"}),
    ("sample", {"num_reqs": "8", "do_sampling": "False", "logprobs": "False"}),
    ("gather_logprobs", {"num_reqs": "8"}),
] + [("compute_and_gather_prompt_logprobs", {"num_tokens": str(n)}) for n in (16, 32)]  # up to max_num_batched_tokens
#: The engine's float32 logprobs against transformers' (torch, float32, CPU):
#: a different implementation of the same model (sharded matmuls, the
#: attention kernel), so they agree to rounding, not bit for bit.
LOGPROB_TOLERANCE = 1e-4
# A test may start two engines (the pin's and the overlay's) before it checks.
pytestmark = pytest.mark.timeout(2 * ENGINE_TIMEOUT + 300)
#: Two engines with the same seed, on the same weights: rounding only.
TWO_ENGINE_LOGPROB_TOLERANCE = 1e-4
KERNELS = kernel_mode.kernels_id()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return tiny_llama.write_checkpoint(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def reference(checkpoint):
    return tiny_llama.reference_greedy(checkpoint, tiny_llama.REFERENCE_PROMPTS, tiny_llama.REFERENCE_TOKENS)


@pytest.fixture(scope="module")
def maxtext_model(tmp_path_factory):
    """MaxText's tiny qwen3 (support/fixes/maxtext_models.py): its checkpoint
    folder for the engine, and MaxText's own greedy decoding of it."""
    if not maxtext_models.AVAILABLE:
        pytest.skip("needs MaxText 0.2.4 installed (the matrix's maxtext-0.2.4 cell): would have run MaxText's model "
                    "(MaxTextForCausalLM, NEW_MODEL_DESIGN=1) in the engine and compared its tokens with MaxText's own forward")
    folder = tmp_path_factory.mktemp("tiny-maxtext")
    model, mesh, config = maxtext_models.write_engine_checkpoint(folder)
    reference = maxtext_models.reference_greedy(maxtext_models.Forward(model, mesh, config), tiny_llama.REFERENCE_PROMPTS, tiny_llama.REFERENCE_TOKENS)
    return folder, reference


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory):
    """The tiny MoE's checkpoint folder (support/fixes/tiny_moe.py)."""
    return tiny_moe.write_checkpoint(tmp_path_factory.mktemp("tiny-moe"))


@pytest.fixture(scope="module")
def engines(checkpoint, tmp_path_factory, request):
    """(config, upstream) -> the engine's result; each engine runs once a module."""
    if maxtext_shims.GLOBAL:
        # MRL_MAXTEXT_SHIMS reaches no engine process: each is a child that
        # imports MaxText's vLLM plugin, shims and all, in both MaxText runs.
        pytest.skip("the maxtext-shims run's engines are the plain run's: MaxText's vLLM plugin imports its shims into "
                    "every engine process of the MaxText cell, with or without the session-wide shims; the plain run "
                    "starts them and checks what they generate")
    results: dict = {}

    def engine(config: str, upstream: bool) -> dict:
        if (config, upstream) not in results:
            if config == "maxtext":
                model = request.getfixturevalue("maxtext_model")[0]
            elif config == engine_start.MOE:
                model = request.getfixturevalue("moe_model")
            else:
                model = checkpoint
            results[config, upstream] = start_engine(tmp_path_factory.mktemp(config), model, config, upstream)
        return results[config, upstream]

    return engine


def check_generated_on_the_7_axis_mesh(result, reference, record_property):
    """The engine started on NEW_MODEL_DESIGN's mesh (Auto axes, every device
    on `model`), ran without error and generated the reference's tokens."""
    record_run(record_property, result)
    assert set(result["mesh_layout"]["axis_types"]) == {"AxisType.Auto"} and result["mesh"]["model"] == 8, result["mesh"]
    assert not result.get("error"), describe(result)
    check_reference(result, reference, record_property)


def check_reference(result, reference, record_property) -> float:
    """The engine's greedy tokens are the reference's (transformers', or
    MaxText's own forward); returns the largest logprob difference."""
    assert started(result), describe(result)
    generated = result["generates"]["reference"]
    for ref, got in zip(reference, generated, strict=True):
        assert min(ref["margins"]) > LOGPROB_TOLERANCE, "the reference's best tokens are too close to call: change tiny_llama.SEED"
        assert got["tokens"] == ref["tokens"], (ref["prompt"], got["tokens"], ref["tokens"])
    diff = max(abs(a - b) for ref, got in zip(reference, generated, strict=True) for a, b in zip(ref["logprobs"], got["logprobs"], strict=True))
    record_property("max_logprob_difference", f"{diff:.3g}")
    assert diff <= LOGPROB_TOLERANCE, f"logprobs {diff} apart from the reference's (tolerance {LOGPROB_TOLERANCE})"
    return diff


def check_same_generations(a, b, names, record_property) -> None:
    """Two engines' generates `names` gave the same tokens, each token's
    logprob within TWO_ENGINE_LOGPROB_TOLERANCE (the largest difference in
    the JUnit record)."""
    worst = 0.0
    for name in names:
        for x, y in zip(a["generates"][name], b["generates"][name], strict=True):
            assert x["tokens"] == y["tokens"], (name, x["tokens"], y["tokens"])
            worst = max(worst, float(np.max(np.abs(np.subtract(x["logprobs"], y["logprobs"])))))
    record_property("max_logprob_difference", f"{worst:.3g}")
    assert worst <= TWO_ENGINE_LOGPROB_TOLERANCE, worst


@pytest.mark.parametrize("kernels", [KERNELS])
def test_unpatched_engine_start_dies_in_the_sampler_precompile(kernels, engines, record_property):
    result = engines("device-indexes", True)
    record_run(record_property, result)
    assert result["mesh"] == {"data": 1, "model": 8}, result["mesh"]
    assert result["mesh_layout"]["axis_types"] == ["AxisType.Explicit", "AxisType.Explicit"], result["mesh_layout"]
    stopped = result.get("error")
    assert stopped and not started(result), describe(result)
    assert stopped["type"] == "jax._src.core.ShardingTypeError", describe(result)
    assert REPORT in stopped["message"], describe(result)
    assert result["step"] == "initialize_from_config", describe(result)
    functions = [(f["file"], f["function"]) for f in stopped["frames"]]
    assert ("tpu_inference/worker/tpu_worker.py", "initialize_from_config") in functions, describe(result)
    assert ("tpu_inference/runner/compilation_manager.py", "_precompile_gather_logprobs") in functions, describe(result)
    assert ("unpatched:tpu_inference.layers.jax.sample.sampling__unpatched.py", "gather_logprobs") in functions, describe(result)
    # Before it: the four sample() variants did not lower (AssertionError),
    # left to the warm-up call that gather_logprobs never let come. With
    # MaxText's shims active in the engine (maxtext installed: its vLLM plugin
    # imports them), greedy lowers and the two sampling variants fail in the
    # top-k search: the report's own set-up, which dies in the same place.
    events = events_of(result, "initialize_from_config")
    skipped = [e["message"] for e in events if e["event"] == "lower_skipped"]
    if result["maxtext_shims"]:
        assert len(skipped) == 2 and all("worker0 sample" in m and "select cases must have the same shardings" in m for m in skipped), skipped
    else:
        assert len(skipped) == 4 and all("worker0 sample" in m and "AssertionError" in m and WSC_ASSERT in m for m in skipped), skipped
    assert result["maxtext_shims"] == (maxtext_shims.ADAPTER is not None), "the engine runs MaxText's shims exactly where maxtext is installed"
    assert not any(e["event"] == "flushed" for e in events)


@pytest.mark.parametrize("kernels", [KERNELS])
def test_engine_generates_the_reference_tokens_on_the_reported_configuration(kernels, engines, reference, record_property):
    result = engines("device-indexes", False)
    record_run(record_property, result)
    # The backport: Auto axes, in the order of the given device_indexes.
    assert result["mesh"] == {"data": 1, "model": 8}, result["mesh"]
    assert result["mesh_layout"] == {"axis_types": ["AxisType.Auto", "AxisType.Auto"], "devices": list(range(8))}, result["mesh_layout"]
    events = events_of(result, "initialize_from_config")
    compiled = [(e["name"], e["shapes"]) for e in events if e["event"] == "compile"]
    assert compiled == SAMPLER_COMPILATIONS, compiled
    assert not [e for e in events if e["event"] == "lower_skipped"], events  # (capture_model's backbone is not a jit: lowered at warm-up)
    assert [e["event"] for e in result["events"] if e["event"] in ("start", "done")] == [
        "start", "start", "done", "done", "start", "done",  # initialize_from_config (the KV caches inside it), capture_model
    ], result["events"]
    assert not result.get("error"), describe(result)
    check_reference(result, reference, record_property)
    # Patch 0006: no sampling or logprobs program gathers the vocab.
    programs = sampler_programs(result)
    assert len(programs) == len(SAMPLER_COMPILATIONS) and all(v == [] for v in programs.values()), programs


@pytest.mark.parametrize("kernels", [KERNELS])
def test_upstream_generates_the_reference_tokens_on_the_new_model_design_mesh(kernels, engines, reference, record_property):
    result = engines("new-model-design", True)
    check_generated_on_the_7_axis_mesh(result, reference, record_property)
    # The pin's sampler on the engine's Auto mesh: the sampled and logprobs
    # programs all-gather the whole [B, V] logits (patch 0006 removes that).
    programs = sampler_programs(result)
    sampling_or_logprobs = [name for name in programs if "'do_sampling': 'False'" not in name]
    assert sampling_or_logprobs and all(programs[name] for name in sampling_or_logprobs), programs


@pytest.mark.parametrize("kernels", [KERNELS])
def test_the_rollout_batch_gives_the_same_tokens_in_two_engines(kernels, engines, record_property):
    from support.programs.engine_start import ROLLOUT_PROMPTS, ROLLOUT_TOKENS

    overlay, upstream = engines("device-indexes", False), engines("new-model-design", True)
    record_stand_in(record_property, overlay)
    assert started(overlay) and started(upstream), describe(overlay) + describe(upstream)
    for name in ("rollout_greedy", "rollout_sampled"):
        a, b = overlay["generates"][name], upstream["generates"][name]
        assert len(a) == len(b) == len(ROLLOUT_PROMPTS), (name, a, b)
        for x in a:
            assert len(x["tokens"]) == ROLLOUT_TOKENS and len(x["logprobs"]) == ROLLOUT_TOKENS, (name, x)
    check_same_generations(overlay, upstream, ("rollout_greedy", "rollout_sampled"), record_property)
    # Within one engine: the greedy batch again gives its tokens again.
    for result in (overlay, upstream):
        runs = result["generates"]
        assert [o["tokens"] for o in runs["rollout_greedy_again"]] == [o["tokens"] for o in runs["rollout_greedy"]]
    # Sampling really sampled: not the greedy tokens.
    assert [o["tokens"] for o in overlay["generates"]["rollout_sampled"]] != [o["tokens"] for o in overlay["generates"]["rollout_greedy"]]
    # The runner's layouts for the attention kernel: decode requests first,
    # never a chunked-prefill-only segment (test_pallas_interpret.py's cases).
    layouts = [d["distribution"] for d in overlay["distributions"] + upstream["distributions"]]
    assert all(d[0] == d[1] for d in layouts), layouts
    kinds = {"decode-only" if d[0] == d[2] else "prefill-only" if d[0] == 0 else "mixed" for d in layouts}
    assert kinds == {"decode-only", "prefill-only", "mixed"}, layouts


@pytest.mark.parametrize("kernels", [KERNELS])
def test_maxtext_model_generates_maxtexts_own_tokens(kernels, engines, maxtext_model, record_property):
    """MaxText's model in the engine as train_rl's maxtext_on_vllm runs it
    (MaxTextForCausalLM, NEW_MODEL_DESIGN=1: the 7-axis Auto mesh), its
    weights restored from MaxText's checkpoint by the adapter's own
    load_weights: its greedy tokens are MaxText's own forward's of the same
    weights, outside vLLM (training-mode `__call__`, dot-product attention,
    the whole sequence each step), and each token's logprob agrees within
    LOGPROB_TOLERANCE."""
    _, reference = maxtext_model
    result = engines("maxtext", False)
    check_generated_on_the_7_axis_mesh(result, reference, record_property)
    # Patch 0006 on the 7-axis mesh: no sampling or logprobs program gathers the vocab.
    programs = sampler_programs(result)
    assert programs and all(v == [] for v in programs.values()), programs
    # MaxText installed: its vLLM plugin imports its Tunix adapter in the engine, shims and all.
    assert result["maxtext_shims"], "MaxText's vLLM plugin imports its shims in every engine"


@pytest.mark.skipif(os.environ.get("MRL_QUICK") == "1", reason="the full matrix's (an engine start more): would have run "
                    "MaxText's model in the pin's engine and checked that it gives the overlay's tokens and logprobs")
@pytest.mark.parametrize("kernels", [KERNELS])
def test_upstream_maxtext_model_gives_the_overlays_tokens(kernels, engines, maxtext_model, record_property):
    """The 7-axis mesh is Auto at the pin too: there the series changes
    nothing, and the pin's engine gives the overlay's tokens."""
    overlay, upstream = engines("maxtext", False), engines("maxtext", True)
    record_run(record_property, upstream)
    assert not upstream.get("error"), describe(upstream)
    check_same_generations(overlay, upstream, ("reference", "rollout_greedy"), record_property)


@pytest.mark.parametrize("kernels", [KERNELS])
def test_moe_with_tp1_ep8_dp_attention_samples_on_the_vocab_shards(kernels, engines, record_property):
    """The configuration whose warm-up compilation hung upstream's
    vocab-sharded sampler (#3490, reverted in #3584): a MoE model with TP=1,
    EP=8 and data-parallel attention. The engine splits the devices into
    rows (attn_dp_expert) and experts ("expert", which the LM head shards
    the vocab by): patch 0006 samples on the vocab's shards there, every
    program the runner precompiles compiles (a hang fails the test with the
    step and the compilation the engine was in), none gathers the vocab,
    and the engine generates."""
    result = engines(engine_start.MOE, False)
    record_run(record_property, result)
    assert started(result) and not result.get("error"), describe(result)
    mesh = result["mesh"]
    assert set(result["mesh_layout"]["axis_types"]) == {"AxisType.Auto"}, result["mesh_layout"]
    assert {a: n for a, n in mesh.items() if n > 1} == {"attn_dp_expert": 2, "expert": 4}, mesh
    programs = sampler_programs(result)
    assert programs and all(v == [] for v in programs.values()), programs
    assert [len(g["tokens"]) for g in result["generates"]["rollout_sampled"]] == [engine_start.ROLLOUT_TOKENS] * len(engine_start.ROLLOUT_PROMPTS)


@pytest.mark.parametrize("kernels", [KERNELS])
def test_moe_gives_the_pins_greedy_and_sampled_tokens(kernels, engines, record_property):
    """The pin's engine in the same configuration, its sampler gathering
    the vocab (the reference: the same model code, so any difference is
    the sampler's): the same greedy tokens and, for the engine's seed, the
    same tokens sampled at the rollout's temperature, top-k and top-p, each
    logprob within rounding."""
    overlay, upstream = engines(engine_start.MOE, False), engines(engine_start.MOE, True)
    record_run(record_property, upstream)
    assert started(upstream) and not upstream.get("error"), describe(upstream)
    assert any(sampler_programs(upstream).values()), "the pin's programs gather the vocab"
    check_same_generations(overlay, upstream, ("reference", "rollout_sampled"), record_property)
