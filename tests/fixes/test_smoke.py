"""`maxtext-rl-overlay smoke` on the installed stack, as a user runs it: the
command in a fresh process, its table, its JSON and its exit status.

On the CPU platform it runs with --cpu-simulation (8 CPU devices, the TPU
kernels interpreted) and every line says it is no hardware qualification; on
a TPU it runs as it would on the user's TPU VM. One smoke run is shared by
the module's tests (an engine start costs a minute or two here).
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from maxtext_rl_overlay.checks.reports import load_report
from maxtext_rl_overlay.smoke.checks import DEFAULT_PRECISION
from maxtext_rl_overlay.smoke.cpu_simulation import NOTICE
from maxtext_rl_overlay.smoke.report import write_json
from maxtext_rl_overlay.smoke.run import SmokeReport
from support.fixes import breaks, maxtext_models, maxtext_shims
from support.fixes.matrix import CHIPS, PLATFORM

CPU = PLATFORM == "cpu"
#: The TPU cell runs the tests marked so on its host's chips, however many.
cell = pytest.mark.tpu_cell
#: One smoke: the checkpoint, the reference, the engine start and its generates.
SMOKE_TIMEOUT = 1500
pytestmark = pytest.mark.timeout(SMOKE_TIMEOUT + 300)
#: The configurations smoke runs here, and each one's checks: where maxtext is
#: installed, MaxText's model too; where it is not, a row says it was skipped.
CHECKS = ["engine ran", "greedy tokens", "greedy logprobs", "sampled batch's greedy tokens", "sampled batch's greedy logprobs",
          "sampled draws differ", "sampled within top-k, top-p", "sampled logprobs", "sampled draws can tell",
          "synced greedy tokens", "synced greedy logprobs"]
# On a chip the gate's checks run at its pinned precision, then jax's default is measured.
CHECKS += [] if CPU else [f"{DEFAULT_PRECISION} tokens", f"{DEFAULT_PRECISION} logprobs"]
MAXTEXT_CONFIGURATIONS = (breaks.MAXTEXT, breaks.MAXTEXT_MOE)
#: The quick matrix's smoke leaves MaxText's dense qwen3 to the full matrix (and the chip): the quick matrix runs
#: that model in the engine against MaxText's own forward in test_series_engine_start.py and train_rl's sync of it in
#: test_train_rl.py, and the MoE's configuration takes the same sync through both of Tunix's unstacking functions.
NOT_SELECTED = (breaks.MAXTEXT,) if os.environ.get("MRL_QUICK") == "1" and maxtext_models.AVAILABLE else ()
CONFIGURATIONS = {"llama-device-indexes": CHECKS,
                  **({name: CHECKS for name in MAXTEXT_CONFIGURATIONS if name not in NOT_SELECTED} if maxtext_models.AVAILABLE else {})}
SKIPPED = (dict.fromkeys(NOT_SELECTED, "not selected (--configuration)") if maxtext_models.AVAILABLE
           else dict.fromkeys(MAXTEXT_CONFIGURATIONS, "maxtext not installed"))
#: The code each configuration's sync runs: train_rl's rollout's, by configuration.
SYNC_PATHS = {"llama-device-indexes": "Tunix's VllmSampler.update_params: transfer_state_with_mappings",
              **dict.fromkeys(MAXTEXT_CONFIGURATIONS, "MaxText's MaxTextVllmSampler.load_checkpoint: transfer_state_directly")}
#: The KV heads of the MoE configuration's tiny model: on more chips than these, the engine pads them.
MOE_KV_HEADS = 4
ROWS = sum(len(c) for c in CONFIGURATIONS.values()) + len(SKIPPED)


def _smoke(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    # The command decides where jax runs, not this test process's simulation.
    clean = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    return subprocess.run([sys.executable, "-m", "maxtext_rl_overlay", "smoke", *args], capture_output=True, text=True,
                          env=dict(clean, **(env or {})), timeout=SMOKE_TIMEOUT)


def _flags(json_path: pathlib.Path) -> list[str]:
    return ["--json", str(json_path)] + (["--cpu-simulation"] if CPU else [])


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    if maxtext_shims.GLOBAL:
        pytest.skip("the maxtext-shims run's engines are the plain run's: MRL_MAXTEXT_SHIMS reaches no engine process "
                    "(smoke starts the engine in a child process), so this would start the plain run's engine again")
    out = tmp_path_factory.mktemp("smoke") / "smoke.json"
    selected = [arg for name in CONFIGURATIONS for arg in ("--configuration", name)] if NOT_SELECTED else []
    proc = _smoke(*_flags(out), *selected)
    return proc, (load_report(out, "smoke") if out.is_file() else None)


def _table_rows(stdout: str) -> list[str]:
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("configuration"))
    return [line for line in lines[start + 1 :] if line.strip() and not line.startswith(NOTICE)][:ROWS]


def _unstack_calls(sync_path: str) -> dict[str, int]:
    """How often each of Tunix's unstacking functions ran in MaxText's sync, as its sync_path says."""
    return {name: int(count) for name, count in re.findall(r"(_\w+) (\d+) times", sync_path)}


def _unstacked_weights(sync_path: str) -> dict[str, int]:
    """How many weights (not rng leaves) each of Tunix's unstacking functions took, as its sync_path says."""
    return {name: int(weights) for name, weights in re.findall(r"(_\w+) \d+ times \((\d+) weights", sync_path)}


@cell
def test_smoke_passes_every_check_on_the_installed_stack(smoke, record_property):
    proc, doc = smoke
    for config in (doc or {}).get("configurations", []):
        # Each configuration's deviations, healthy (docs/install.md's margins beside the breaks'): in the JUnit
        # record a chip run brings back, as in the JSON.
        record_property(config["name"], "; ".join(f"{c['name']}: {c.get('detail', '')}" for c in config["checks"]))
        if config.get("sync_path"):
            record_property(f"{config['name']} sync", config["sync_path"])
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert doc is not None and doc["ok"] and doc["failed"] == [], doc
    configs = {c["name"]: c for c in doc["configurations"]}
    assert list(configs) == list(CONFIGURATIONS)
    for name, checks in CONFIGURATIONS.items():
        config = configs[name]
        assert config["chips"] == CHIPS
        assert config["precision"] == ("default" if CPU else "highest"), config["precision"]
        assert [c["name"] for c in config["checks"]] == checks and all(c["ok"] for c in config["checks"]), config["checks"]
        assert config["seconds"]["engine_start"] > 0 and {"greedy", "sampled", "sync", "synced"} <= set(config["seconds"])
        assert config["sync_path"].startswith(SYNC_PATHS[name]), config["sync_path"]
        assert config["compiles"]["engine start"][0] > 0, config["compiles"]  # the engine's programs, counted
    assert configs["llama-device-indexes"]["mesh"] == {"data": 1, "model": CHIPS}, "Tunix's device_indexes: ('data', 'model'), all on model"
    for name in MAXTEXT_CONFIGURATIONS:
        if name not in configs:
            continue
        mesh = configs[name]["mesh"]
        assert len(mesh) == 7 and mesh["model"] == CHIPS, f"NEW_MODEL_DESIGN's 7-axis mesh: {mesh}"
        # The scanned layers went through Tunix's own unstacking (the seed's second bug's path).
        calls = _unstack_calls(configs[name]["sync_path"])
        assert calls.get("_unstack_scanned_param", 0) > 0 and "_bulk_align_and_unstack" in calls, calls
    if breaks.MAXTEXT_MOE in configs:
        # Its KV heads padded to the chips where they are fewer: the KV weights took the seed's fix
        # site, _bulk_align_and_unstack; on as many chips as heads or fewer (one v5e) nothing pads them.
        weights = _unstacked_weights(configs[breaks.MAXTEXT_MOE]["sync_path"])
        record_property("weights through _bulk_align_and_unstack", weights.get("_bulk_align_and_unstack"))
        assert (weights.get("_bulk_align_and_unstack", 0) > 0) == (CHIPS > MOE_KV_HEADS), (CHIPS, configs[breaks.MAXTEXT_MOE]["sync_path"])
    assert doc["skipped"] == SKIPPED and doc["finished"], doc
    rows = _table_rows(proc.stdout)
    assert [re.split(r"\s{2,}", row)[5] for row in rows] == [c for checks in CONFIGURATIONS.values() for c in checks] + ["-"] * len(SKIPPED), \
        proc.stdout
    for name, why in SKIPPED.items():  # a configuration this install cannot run is said, in the table and the last line
        assert any(row.startswith(name) and f"skipped  {why}" in row for row in rows), proc.stdout
        assert f"{name} skipped: {why}" in proc.stdout
    assert "smoke: yes" in proc.stdout


@cell
def test_smoke_says_on_every_line_whether_it_is_a_simulation(smoke):
    proc, doc = smoke
    rows = _table_rows(proc.stdout)
    assert len(rows) == ROWS, proc.stdout
    assert all((NOTICE in row) == CPU for row in rows), proc.stdout
    assert doc["cpu_simulation"] == CPU and (doc["notice"] == NOTICE) == CPU
    for config in doc["configurations"]:
        stand_ins = config["stand_ins"]
        simulated = [s for s in stand_ins if "pallas-interpret" in s or "memory" in s]
        assert bool(simulated) == CPU, stand_ins


@cell
@pytest.mark.parametrize("package, raises", [("jax", "ImportError('libjax is missing')"), ("torch", "OSError('libtorch_cpu.so: cannot open')")])
def test_a_package_that_fails_to_import_is_a_broken_stack_named_as_such(tmp_path, package, raises):
    """Not "no TPU here", not a bug: exit 1, naming the package and its
    error, before any engine starts; --json says the same."""
    (tmp_path / "shadow" / package).mkdir(parents=True)
    (tmp_path / "shadow" / package / "__init__.py").write_text(f"raise {raises}\n")
    out = tmp_path / "smoke.json"
    write_json(out, SmokeReport(False, []), cpu_simulation=False)  # an earlier pass must not survive
    proc = _smoke("--json", str(out), env={"PYTHONPATH": str(tmp_path / "shadow")})  # without --cpu-simulation: the probe asks jax
    assert proc.returncode == 1, proc.stdout + proc.stderr[-4000:]
    assert f"smoke: NO - the installed stack is broken: {package} fails to import: {raises.split('(')[0]}" in proc.stderr, proc.stderr[-2000:]
    assert "no TPU here" not in proc.stderr
    doc = load_report(out, "smoke")
    assert doc["ok"] is False and f"{package} fails to import" in doc["failed"][0], doc


@pytest.mark.skipif(not CPU, reason="on a TPU smoke runs without --cpu-simulation (the other tests); this would have "
                    "checked that a machine without a TPU gets status 3 and the flag to pass")
def test_smoke_without_a_tpu_and_without_the_flag_cannot_run():
    proc = _smoke(env={"JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "no TPU here (jax's backend is cpu)" in proc.stderr and "--cpu-simulation" in proc.stderr, proc.stderr
    assert proc.stdout == ""


#: A program that opens the chips and holds them until its stdin closes (then
#: it exits as a program does, and libtpu lets go of its lock file).
HOLDER = ("import sys, jax; devices = jax.devices(); "
          "print('holding', devices[0].platform, len(devices), flush=True); sys.stdin.read()")


@cell
@pytest.mark.skipif(CPU, reason="needs a TPU (the TPU cell): would have started a program that opens the chips and holds "
                    "them, run smoke beside it, and checked that it exits 3 saying the TPU is held by another process")
def test_smoke_cannot_run_while_another_process_holds_the_chips(tmp_path):
    """README's "a TPU another process holds": status 3 and the line that says
    so, while another program has the chips open."""
    clean = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=clean)
    try:
        assert holder.stdout is not None and holder.stderr is not None
        said = holder.stdout.readline().split()
        assert said[:2] == ["holding", "tpu"], (said, holder.poll(), holder.stderr.read() if holder.poll() is not None else "")
        out = tmp_path / "smoke.json"
        proc = _smoke("--json", str(out))
    finally:
        if holder.stdin:
            holder.stdin.close()
        try:
            holder.wait(timeout=60)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait()
    assert proc.returncode == 3, proc.stdout + proc.stderr[-4000:]
    assert "the TPU is held by another process" in proc.stderr, proc.stderr[-2000:]
    if out.is_file():
        doc = load_report(out, "smoke")
        assert doc["ok"] is False and "held by another process" in (doc.get("cannot_run") or ""), doc


def test_an_engine_past_its_timeout_fails_naming_the_step_it_was_in(tmp_path):
    """--timeout bounds each engine process: past it the process is stopped
    and the check names the step it was in (at 5 s: importing, or starting)."""
    if maxtext_shims.GLOBAL:
        pytest.skip("the maxtext-shims run's engines are the plain run's (see the smoke fixture)")
    out = tmp_path / "smoke.json"
    # The first configuration alone: MaxText's would make their models first (a minute of CPU) for an engine stopped at 5 s.
    proc = _smoke(*_flags(out), "--timeout", "5", "--configuration", "llama-device-indexes")
    assert proc.returncode == 1, proc.stdout + proc.stderr[-4000:]
    [check] = load_report(out, "smoke")["configurations"][0]["checks"]  # the first configuration's engine
    assert check["name"] == "engine ran" and not check["ok"], check
    step = check["detail"].removeprefix("no result within 5 s; it was in: ")
    assert step in ("importing jax, vLLM and tpu-inference", "engine start") or step.startswith("generate "), check
    assert "llama-device-indexes: engine ran" in proc.stderr


@cell
@pytest.mark.skipif(os.environ.get("MRL_QUICK") == "1", reason="the full matrix's (an engine start more each): would have run "
                    "smoke on copies of the installed packages with one break each (support/fixes/breaks.py: greedy takes the "
                    "least likely token; top-p, top-k or the temperature ignored; processed logprobs of the unprocessed logits; "
                    "the Llama's norms, MaxText's norms not synced; MaxText's scanned layers unstacked in reverse; the KV-padded "
                    "MoE's aligned layers in reverse, its KV heads repeated in the wrong order) and checked that each exits 1 "
                    "naming the check that sees it")
@pytest.mark.parametrize("break_", list(breaks.NAMED))
def test_smoke_names_a_broken_stack(tmp_path, break_, record_property):
    """The installed stack, broken (a copy of the installed package first on
    the path, one line of it changed: the sampler's on the path this run's
    chips take): smoke says no, naming the check, in every configuration the
    break reaches."""
    if maxtext_shims.GLOBAL:
        pytest.skip("the maxtext-shims run's engines are the plain run's (see the smoke fixture)")
    broken = breaks.NAMED[break_]
    if broken.configurations is not None and not set(broken.configurations) & set(CONFIGURATIONS):
        pytest.skip(f"reaches only {', '.join(broken.configurations)}, which smoke does not run here ({SKIPPED}): would have "
                    f"broken {broken.edit(CHIPS).file} and checked that smoke fails {' or '.join(broken.checks)} there")
    if broken.ran == "_bulk_align_and_unstack" and CHIPS <= MOE_KV_HEADS:
        pytest.skip(f"on {CHIPS} chip(s) the engine does not pad the MoE's {MOE_KV_HEADS} KV heads, so no weight takes "
                    f"_bulk_align_and_unstack (its KV weights are unstacked as they are): would have broken it and checked "
                    f"that smoke fails {' or '.join(broken.checks)}")
    edit = broken.edit(CHIPS)
    spec = importlib.util.find_spec(edit.package)  # found, not imported: jax stays unopened here
    assert spec is not None and spec.submodule_search_locations, edit.package
    shadow = tmp_path / "shadow"
    shutil.copytree(spec.submodule_search_locations[0], shadow / edit.package)
    target = shadow / edit.file
    text = target.read_text()
    assert text.count(edit.right) == 1, f"the line this break changes moved in {edit.file} ({edit.right.strip()!r}): update breaks.py"
    target.write_text(text.replace(edit.right, edit.wrong))
    out = tmp_path / "smoke.json"
    # A break that reaches some configurations runs those alone (an engine start less).
    only = [arg for name in broken.configurations or () for arg in ("--configuration", name)]
    proc = _smoke(*_flags(out), *only, env={"PYTHONPATH": os.pathsep.join(filter(None, [str(shadow), os.environ.get("PYTHONPATH")]))})
    assert proc.returncode == 1, proc.stdout + proc.stderr[-4000:]
    report = load_report(out, "smoke")
    reached = [c for c in report["configurations"] if broken.configurations is None or c["name"] in broken.configurations]
    assert reached and len(reached) == len(report["configurations"]), (broken.configurations, report["skipped"])
    assert all(report["skipped"][name] == "not selected (--configuration)" for name in CONFIGURATIONS if name not in {c["name"] for c in reached})
    for config in reached:
        checks = {c["name"]: c["ok"] for c in config["checks"]}
        failed = [name for name in broken.checks if checks.get(name) is False]
        assert checks["engine ran"] and failed, (config["name"], checks)
        assert f"{config['name']}: {failed[0]}" in proc.stderr, proc.stderr[-2000:]
        # What the break showed (the margins' table in docs/install.md): kept in the JUnit record, which a chip run brings back.
        record_property(config["name"], "; ".join(f"{c['name']}: {c.get('detail', '')}" for c in config["checks"] if not c["ok"]))
        if broken.ran:  # the broken function ran on weights: the check failed because the sync took its path
            record_property(f"{config['name']} sync", config["sync_path"])
            assert _unstacked_weights(config["sync_path"]).get(broken.ran, 0) > 0, config["sync_path"]


#: Where the pins' Tunix stops on MaxText's scanned state (the seed's second
#: bug: a Flax NNX rng count stacked to (layers,), scan_axis 1).
PINS_TUNIX_ERROR = "IndexError: tuple index out of range"


@cell
@pytest.mark.skipif(os.environ.get("MRL_QUICK") == "1", reason="the full matrix's (an engine start more): would have run smoke "
                    "with the pins' Tunix (the series reverse-applied) and checked that MaxText's sync stops with the seed's "
                    "IndexError in transfer_state_directly, where the overlay's passes")
def test_smoke_with_the_pins_tunix_stops_in_maxtexts_sync(tmp_path, record_property):
    """The seed's second bug before and after, in the real engine: smoke's
    MaxText sync (the scanned actor's whole state, Tunix unstacking it) with
    the pins' Tunix stops with the report's IndexError; with the overlay's
    (test_smoke_passes_every_check_on_the_installed_stack) every check passes."""
    if maxtext_shims.GLOBAL:
        pytest.skip("the maxtext-shims run's engines are the plain run's (see the smoke fixture)")
    if "maxtext-new-model-design" not in CONFIGURATIONS:
        pytest.skip("maxtext not installed: would have run smoke's MaxText sync on the pins' Tunix and checked its IndexError")
    from support.fixes.unpatched import unpatched_package

    spec = importlib.util.find_spec("tunix")  # found, not imported: jax stays unopened here
    assert spec is not None and spec.submodule_search_locations, "tunix"
    shadow = tmp_path / "shadow"
    reversed_ = unpatched_package("google-tunix", pathlib.Path(spec.submodule_search_locations[0]), shadow)
    assert any(name.startswith("0001-") for name in reversed_), reversed_
    out = tmp_path / "smoke.json"
    proc = _smoke(*_flags(out), "--configuration", "maxtext-new-model-design",
                  env={"PYTHONPATH": os.pathsep.join(filter(None, [str(shadow), os.environ.get("PYTHONPATH")]))})
    assert proc.returncode == 1, proc.stdout + proc.stderr[-4000:]
    configs = {c["name"]: c for c in load_report(out, "smoke")["configurations"]}
    checks = {c["name"]: c for c in configs["maxtext-new-model-design"]["checks"]}
    # Everything before the sync passed on the pins' Tunix: the engine's model is the same, only the sync differs.
    before = [c for c in configs["maxtext-new-model-design"]["checks"] if c["name"] != "weight sync"]
    record_property("before the sync", "; ".join(f"{c['name']}: {'pass' if c['ok'] else 'FAIL ' + c['detail']}" for c in before))
    assert checks["engine ran"]["ok"] and not checks["weight sync"]["ok"], checks
    detail = checks["weight sync"]["detail"]
    record_property("pins' Tunix", detail)
    assert detail.startswith("stopped in weight sync: " + PINS_TUNIX_ERROR), detail
    assert "in _bulk_align_and_unstack: + (arr.shape[scan_axis],)" in detail or "in intersect_trees" in detail, detail
    print(f"the pins' Tunix: {detail}")


# -- the sync check sees every parameter --------------------------------------
#
# smoke's second model differs from the first in every parameter (its norms
# drawn too), so a sync that leaves any kind of parameter stale decodes apart
# from the second model's reference. Each case makes that stale sync here:
# the second model with one kind of parameter still the first's, decoded by
# transformers as the engine would decode it, then given to smoke's check.

LLAMA_KINDS = {"embedding": "embed_tokens.", "LM head": "lm_head.", "norms": "norm.", "attention": "self_attn.", "MLP": "mlp."}


@pytest.fixture(scope="module")
def llama_pair(tmp_path_factory):
    from maxtext_rl_overlay.smoke import tiny_llama

    work = tmp_path_factory.mktemp("llama-pair")
    first = tiny_llama.write_checkpoint(work / "first", tiny_llama.SEEDS[0])
    second = tiny_llama.write_checkpoint(work / "second", tiny_llama.SEEDS[1], tiny_llama.CONSTANTS_SPREAD)
    refs = [tiny_llama.reference_greedy(c, tiny_llama.REFERENCE_PROMPTS, tiny_llama.REFERENCE_TOKENS) for c in (first, second)]
    return work, first, second, refs


@cell
def test_the_second_llama_differs_from_the_first_in_every_parameter(llama_pair):
    import safetensors.torch

    _, first, second = llama_pair[:3]
    a, b = (safetensors.torch.load_file(str(c / "model.safetensors")) for c in (first, second))
    assert a.keys() == b.keys()
    same = [name for name in a if bool((a[name] == b[name]).any())]
    assert not same, f"parameters with elements the sync could leave stale unseen: {same}"


@cell
@pytest.mark.parametrize("kind", list(LLAMA_KINDS))
def test_a_sync_that_leaves_one_kind_of_parameter_stale_fails_smokes_check(llama_pair, kind):
    import safetensors.torch

    from maxtext_rl_overlay.smoke import checks, tiny_llama

    work, first, second, (first_ref, second_ref) = llama_pair
    stale = work / f"stale-{kind.replace(' ', '-')}"
    shutil.copytree(second, stale)
    old, new = (safetensors.torch.load_file(str(c / "model.safetensors")) for c in (first, stale))
    left = [name for name in new if LLAMA_KINDS[kind] in name]
    assert left, kind
    safetensors.torch.save_file({k: (old[k] if k in left else v) for k, v in new.items()}, str(stale / "model.safetensors"),
                                metadata={"format": "pt"})
    engine = tiny_llama.reference_greedy(stale, tiny_llama.REFERENCE_PROMPTS, tiny_llama.REFERENCE_TOKENS)
    for platform in checks.LOGPROB_TOLERANCE:  # the CPU simulation's tolerance and a TPU's
        said = checks.synced(engine, second_ref, first_ref, platform, "transformers")
        assert not all(c.ok for c in said), (kind, platform, said)


# MaxText's configuration, the same way: the engine's model (unrolled, seed 0)
# and train_rl's actor (scanned, seed 4, norms drawn), both made by smoke's
# own maxtext_model; the actor unrolled by MaxText's own pre-unroll (what its
# direct sync relies on), each kind but one put into the engine's model, and
# MaxText's own forward decoding the result. qwen3 ties its LM head to the
# embedding (`logits_via_embedding`): the embedding is the LM head too.

MAXTEXT_KINDS = {"embedding (the LM head, tied)": lambda path: path[0] == "token_embedder",
                 "norms": lambda path: path[-2].endswith("norm"),
                 "attention": lambda path: "self_attention" in path and not path[-2].endswith("norm"),
                 "MLP": lambda path: "mlp" in path}


@pytest.fixture(scope="module")
def maxtext_pair(tmp_path_factory):
    if not maxtext_models.AVAILABLE:
        pytest.skip("maxtext is not installed (the matrix's MaxText cell runs this): would have checked that a sync into "
                    "MaxText's model leaving any kind of parameter stale fails smoke's sync check")
    if maxtext_shims.GLOBAL:
        pytest.skip("the maxtext-shims run's MaxText forward is the plain run's: the shims replace jax.lax.top_k and "
                    "with_sharding_constraint, which neither model's forward calls")
    import jax
    from flax import nnx
    from flax.traverse_util import flatten_dict, unflatten_dict

    from maxtext_rl_overlay.smoke import maxtext_model, tiny_llama

    work = tmp_path_factory.mktemp("maxtext-pair")
    first = maxtext_model.write_engine_checkpoint(work / "first")
    second = maxtext_model.write_actor_checkpoint(work / "second")
    forwards = [maxtext_model.Forward(*model) for model in (first, second)]
    refs = [maxtext_model.reference_greedy(f, tiny_llama.REFERENCE_PROMPTS, tiny_llama.REFERENCE_TOKENS) for f in forwards]
    unrolled = maxtext_models.maxtext_pre_unroll(nnx.state(second[0], nnx.Param))
    unrolled = flatten_dict(unrolled.to_pure_dict() if hasattr(unrolled, "to_pure_dict") else unrolled)
    engine_params = flatten_dict(nnx.to_pure_dict(nnx.state(first[0], nnx.Param)))
    assert unrolled.keys() == engine_params.keys(), "MaxText's unroll of the actor no longer gives the engine model's layout"

    def decode_synced(stale) -> list:
        """The engine's model given the actor's parameters, but those `stale`
        says to leave, decoded by MaxText's own forward (the first model's,
        its state replaced: one compilation)."""
        whole = flatten_dict(nnx.to_pure_dict(forwards[0].state))
        whole.update({path: (engine_params[path] if stale(path) else unrolled[path]) for path in engine_params})
        state = jax.tree.map(lambda x: x, forwards[0].state)
        nnx.replace_by_pure_dict(state, unflatten_dict(whole))
        forward = forwards[0]
        kept, forward.state = forward.state, state
        try:
            return maxtext_model.reference_greedy(forward, tiny_llama.REFERENCE_PROMPTS, tiny_llama.REFERENCE_TOKENS)
        finally:
            forward.state = kept

    return engine_params, unrolled, refs, decode_synced


def test_the_maxtext_actor_differs_from_the_engines_model_in_every_parameter(maxtext_pair):
    import numpy as np

    engine_params, unrolled = maxtext_pair[:2]
    same = [path for path in engine_params if bool(np.any(np.asarray(engine_params[path]) == np.asarray(unrolled[path])))]
    assert not same, f"parameters with elements the sync could leave stale unseen: {same}"
    kinds = {path: [k for k, is_kind in MAXTEXT_KINDS.items() if is_kind(path)] for path in engine_params}
    assert all(len(k) == 1 for k in kinds.values()), f"every parameter is of one kind: {kinds}"


def test_a_right_sync_into_maxtexts_model_passes_smokes_check(maxtext_pair):
    """The control: with nothing left stale, the check passes (so the cases
    below fail for the stale kind, not for the way they were made)."""
    from maxtext_rl_overlay.smoke import checks

    _, _, (first_ref, second_ref), decode_synced = maxtext_pair
    said = checks.synced(decode_synced(lambda path: False), second_ref, first_ref, "cpu", "MaxText's own forward")
    assert all(c.ok for c in said), said


@pytest.mark.parametrize("kind", list(MAXTEXT_KINDS))
def test_a_sync_into_maxtexts_model_that_leaves_one_kind_stale_fails_smokes_check(maxtext_pair, kind):
    from maxtext_rl_overlay.smoke import checks

    engine_params, _, (first_ref, second_ref), decode_synced = maxtext_pair
    assert any(MAXTEXT_KINDS[kind](path) for path in engine_params), kind
    engine = decode_synced(MAXTEXT_KINDS[kind])
    for platform in checks.LOGPROB_TOLERANCE:  # the CPU simulation's tolerance and a TPU's
        said = checks.synced(engine, second_ref, first_ref, platform, "MaxText's own forward")
        assert not all(c.ok for c in said), (kind, platform, said)
