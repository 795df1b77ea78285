"""Benchmark: vLLM's engine decoding on the overlay's tpu-inference against
the pin's unpatched one, side by side in one run, on the same devices and
the same model.

    PYTHON tests/bench/bench_decode.py [--cpu-simulation] [--tokens N] [--batches 1,8,64] [--json FILE] [--forms]

(scripts/bench-decode.sh [PYTHON] [OPTIONS] runs it with tests/ on PYTHONPATH.)
PYTHON must see the installed overlay (tpu_inference, vllm, the tool's
`maxtext_rl_overlay`), plus torch and transformers (the checkpoint).

The parent writes a small Llama here (transformers' own initialisation,
seeded, as smoke's tiny_llama.py does, in a config a little larger than
smoke's: MODELS), then starts one engine process per engine, one after the
other (one process holds the chips at a time; an engine start sets
process-wide state):

  overlay   the installed tpu_inference
  upstream  a copy of the installed tpu_inference with the whole
            tpu-inference series reverse-applied (support/fixes/unpatched.py's
            `unpatched_package`), first on the child's PYTHONPATH; the child
            checks that it is what it imported. Where jax's make_mesh makes
            Explicit axes (jax 0.11 here; 0.10.2 on a v5e too) the pin's runner cannot start (its
            device_indexes mesh is Explicit: ShardingTypeError), so there the
            backport of 984b29c49 (the Auto mesh) stays in, and the output says so.

Each engine is smoke's (maxtext_rl_overlay.smoke.engine.Engine: vLLM's `LLM`
in the process, on all the machine's devices, as Tunix's rollout configures
it: device_indexes, tensor parallel over the devices, max_logprobs=1,
processed logprobs), with max_num_seqs the largest batch. For each batch B
(the first B of the same prompts, greedy, ignore_eos, logprobs=1) it warms
up, then times REPEATS generates of N tokens and of 1 token, alternately;
decode tokens/s = B * (N - 1) / (median(t_N) - median(t_1)): the prefill
and the first token cancel out. The parent prints both engines' tokens/s
and overlay/upstream per batch, whether the tokens are equal (a NO names the
batch), and the ratios in the last line; --json FILE writes the same data.

On one chip the runner's mesh does not partition the vocab, so both engines
sample on sampling.py's full-vocabulary path (the overlay's vocab-sharded
sampler, patch 0006, does not engage): the ratio measures the series'
overhead everywhere else. On the 8-device CPU simulation (--cpu-simulation,
kernels interpreted: every line says so) the vocab is sharded 8 ways.

--forms compares train_rl's two rollout forms on the overlay instead, on one
model shape (smoke's tiny MaxText qwen3, written by MaxText on the host CPU):
`vllm_native` (vLLM's own Qwen3 on its config.json, vLLM's dummy weights: the
speed is compared, not the tokens) against `maxtext_on_vllm` (MaxText's
model in vLLM, NEW_MODEL_DESIGN=1, its weights restored), the ratio
vllm_native/maxtext_on_vllm per batch.

Asserts nothing (exit 0 whenever both engines ran, 1 if one did not).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import importlib.util
import json
import math
import os
import pathlib
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

ENGINES = ("overlay", "upstream")
#: --forms: train_rl's two rollout forms on the overlay, on one model shape
#: (smoke's tiny MaxText qwen3; needs maxtext): vLLM's own Qwen3 (its weights
#: vLLM's dummy ones: only the speed is compared) and MaxText's model in vLLM.
FORMS = ("vllm_native", "maxtext_on_vllm")
FORMS_MODEL = "smoke's MaxText qwen3"
#: The Llamas (transformers' LlamaConfig arguments beyond tiny_llama.CONFIG's).
MODELS: dict[str, dict[str, Any]] = {
    "smoke": {},  # smoke's tiny Llama (2 layers, hidden 128, vocab 1024)
    # The default: 4 layers, hidden 256, vocab 32000 (about 20M parameters).
    "small": {"hidden_size": 256, "intermediate_size": 768, "num_attention_heads": 8, "num_key_value_heads": 8,
              "head_dim": 32, "num_hidden_layers": 4, "vocab_size": 32000},
    # For a chip: 8 layers, hidden 1024, vocab 32000 (about 170M parameters).
    "medium": {"hidden_size": 1024, "intermediate_size": 2816, "num_attention_heads": 16, "num_key_value_heads": 8,
               "head_dim": 64, "num_hidden_layers": 8, "vocab_size": 32000},
}
MAX_MODEL_LEN = 256
PROMPT_LENGTHS = (8, 16)  # each prompt's length is drawn in [8, 16)
#: The backport that builds the runner's device_indexes mesh with Auto axes.
MESH_BACKPORT = "backport-984b29c49"


def child_env(shadow: pathlib.Path | None) -> dict[str, str]:
    env = dict(os.environ)
    if shadow is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(shadow), env.get("PYTHONPATH", "")]))
    return env


# -- the engine process ------------------------------------------------------


def child(request_path: pathlib.Path, result_path: pathlib.Path) -> int:
    from maxtext_rl_overlay.smoke import configurations
    from maxtext_rl_overlay.smoke.engine import Engine

    req = json.loads(request_path.read_text())
    base, llm_args = configurations.LLAMA, req["llm_args"]
    if req["engine"] == "maxtext_on_vllm":
        base = configurations.MAXTEXT
    elif req["engine"] == "vllm_native":  # the checkpoint is MaxText's: vLLM's own model on its config, weights made up
        llm_args = llm_args | {"load_format": "dummy"}
    configuration = dataclasses.replace(base, name=f"bench-decode-{req['engine']}", sync=None, llm_args=llm_args)
    engine = Engine(configuration, pathlib.Path(req["checkpoint"]), req["cpu_simulation"], result_path)
    engine.prepare()
    engine.load()
    import jax
    import tpu_inference

    out: dict[str, Any] = {"engine": req["engine"], "tpu_inference": tpu_inference.__file__, "jax": jax.__version__,
                           "platform": jax.default_backend(), "devices": jax.device_count(),
                           "device_kind": jax.devices()[0].device_kind,
                           "vocab_sharded_module": importlib.util.find_spec("tpu_inference.layers.jax.sample.vocab_sharded") is not None}
    print(f"bench-decode {req['engine']}: tpu_inference from {tpu_inference.__file__}; jax {jax.__version__}, "
          f"{jax.device_count()} {jax.devices()[0].device_kind} device(s)", flush=True)
    shadow = req.get("shadow")
    imported_shadow = shadow is not None and pathlib.Path(tpu_inference.__file__).resolve().is_relative_to(pathlib.Path(shadow).resolve())
    if imported_shadow != (shadow is not None) or out["vocab_sharded_module"] == (shadow is not None):
        out["error"] = (f"imported the wrong tpu_inference: {tpu_inference.__file__} (wanted the "
                        f"{'copy under ' + shadow if shadow else 'installed one'}; vocab_sharded.py present: {out['vocab_sharded_module']})")
        result_path.write_text(json.dumps(out, indent=1))
        return 1
    try:
        engine.start()
        out["mesh"] = engine.result.mesh
        out["engine_start_s"] = engine.result.seconds["engine_start"]
        out["batches"] = {str(b): decode(engine.llm, req["prompts"][:b], req["tokens"], req["repeats"], engine) for b in req["batches"]}
    except Exception as error:  # noqa: BLE001 - reported by the parent
        import traceback

        traceback.print_exc()
        out["error"] = f"{type(error).__name__}: {str(error)[:1000]} (in {engine.result.step})"
    result_path.write_text(json.dumps(out, indent=1))
    return 0 if "error" not in out else 1


def decode(llm: Any, prompts: list[list[int]], tokens: int, repeats: int, engine: Any) -> dict[str, Any]:
    """One batch: warm-up, then REPEATS timed generates of `tokens` and of 1 token, alternately."""
    from vllm import SamplingParams

    def generate(n: int) -> tuple[float, list[Any]]:
        params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, logprobs=1, detokenize=False)
        began = time.perf_counter()
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return time.perf_counter() - began, outputs

    engine.at(f"batch {len(prompts)}: warm-up")
    generate(tokens)
    generate(1)
    long_s, short_s, rows = [], [], []
    for repeat in range(repeats):
        engine.at(f"batch {len(prompts)}: repeat {repeat + 1} of {repeats}")
        seconds, outputs = generate(tokens)
        long_s.append(seconds)
        rows.append([list(o.outputs[0].token_ids) for o in outputs])
        short_s.append(generate(1)[0])
    logprobs = [[lp[t].logprob for t, lp in zip(o.outputs[0].token_ids, o.outputs[0].logprobs, strict=True)] for o in outputs]
    decode_s = statistics.median(long_s) - statistics.median(short_s)
    return {"seconds_n": long_s, "seconds_1": short_s, "decode_seconds": decode_s,
            "tokens_per_s": len(prompts) * (tokens - 1) / decode_s if decode_s > 0 else float("nan"),
            "generate_tokens_per_s": len(prompts) * tokens / statistics.median(long_s),
            "repeats_equal": all(r == rows[0] for r in rows), "tokens": rows[0], "logprobs": logprobs}


# -- the parent --------------------------------------------------------------


def write_checkpoint(path: pathlib.Path, model: str) -> dict[str, Any]:
    """tiny_llama's Llama (its config and initialisation, seed 0) with MODELS[model] over its config."""
    import torch
    import transformers

    from maxtext_rl_overlay.smoke import tiny_llama

    config = {**tiny_llama.CONFIG, **MODELS[model], "max_position_embeddings": MAX_MODEL_LEN}
    torch.manual_seed(tiny_llama.SEED)
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config, torch_dtype="float32")).eval()
    llama.save_pretrained(path, safe_serialization=True)
    return config


def write_maxtext_checkpoint(path: pathlib.Path, python: str, say: Any) -> tuple[pathlib.Path, dict[str, Any]]:
    """smoke's tiny MaxText qwen3 and its vLLM config.json, written by MaxText
    in a process of its own on the host CPU (smoke's maxtext_model.py; this
    process keeps off the chips)."""
    say(f"forms: writing smoke's MaxText qwen3 on the host CPU ({path})")
    done = subprocess.run([python, "-m", "maxtext_rl_overlay.smoke.maxtext_model", str(path), "0"], capture_output=True, text=True,
                          timeout=900, check=False)
    if done.returncode != 0 or not (path / "config.json").is_file():
        raise SystemExit(f"bench-decode: writing MaxText's checkpoint failed: {done.stderr.strip()[-1000:]}")
    config: dict[str, Any] = json.loads((path / "config.json").read_text())
    return path, config


def prompts(count: int, vocab: int) -> list[list[int]]:
    rng = random.Random(0)
    return [[1] + [rng.randrange(3, vocab) for _ in range(rng.randrange(*PROMPT_LENGTHS) - 1)] for _ in range(count)]


def jax_makes_explicit_meshes(python: str) -> bool:
    """Whether the engines' jax's make_mesh defaults to Explicit axes, asked
    of that jax in a process of its own on the CPU (this process keeps off
    the chips). Not a version test: 0.10.2 on a v5e already does, and the
    pin's runner died there in the sampler's top_k (ShardingTypeError)."""
    program = "import jax; print(jax.make_mesh((1,), ('x',)).axis_types[0])"
    done = subprocess.run([python, "-c", program], env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True, text=True,
                          timeout=300, check=False)
    if done.returncode != 0:
        raise SystemExit(f"bench-decode: could not ask {python}'s jax for make_mesh's axes: {done.stderr.strip()[-500:]}")
    return done.stdout.strip().splitlines()[-1].endswith("Explicit")


def run_engine(name: str, python: str, request: dict[str, Any], work: pathlib.Path, shadow: pathlib.Path | None,
               timeout: float, say: Any) -> dict[str, Any]:
    req, res, log = work / f"{name}.request.json", work / f"{name}.result.json", work / f"{name}.log"
    req.write_text(json.dumps({**request, "engine": name, "shadow": str(shadow) if shadow else None}))
    say(f"{name}: starting the engine process (its output: {log})")
    began = time.monotonic()
    with log.open("w") as out:
        try:
            proc = subprocess.run([python, str(pathlib.Path(__file__).resolve()), "--child", str(req), str(res)],
                                  stdout=out, stderr=subprocess.STDOUT, env=child_env(shadow), timeout=timeout, check=False)
            status: str | int = proc.returncode
        except subprocess.TimeoutExpired:
            status = f"past its {timeout:.0f} s timeout"
    result: dict[str, Any] = json.loads(res.read_text()) if res.is_file() else {}
    result["process_s"] = round(time.monotonic() - began, 1)
    if status != 0 and "error" not in result:
        progress = work / f"{name}.result.progress.json"
        step = json.loads(progress.read_text()).get("step") if progress.is_file() else "the start of the process"
        tail = (log.read_text(errors="replace").strip().splitlines() or ["(no output)"])[-1]
        result["error"] = f"the engine process ended ({status}) in: {step}: {tail[:300]}"
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", nargs=2, metavar=("REQUEST", "RESULT"), help=argparse.SUPPRESS)
    parser.add_argument("--python", default=sys.executable, help="the engines' python (default: this one)")
    parser.add_argument("--cpu-simulation", action="store_true", help="8 CPU devices as a v6e-8, kernels interpreted")
    parser.add_argument("--model", choices=sorted(MODELS), default="small")
    parser.add_argument("--batches", default="1,8,64")
    parser.add_argument("--tokens", type=int, default=64, help="tokens decoded a request (default 64)")
    parser.add_argument("--repeats", type=int, default=3, help="timed generates per batch and length (default 3)")
    parser.add_argument("--engines", default=",".join(ENGINES), help="which engines, in order (default overlay,upstream)")
    parser.add_argument("--forms", action="store_true",
                        help=f"compare train_rl's rollout forms on the overlay instead ({', '.join(FORMS)}: smoke's tiny MaxText "
                             "qwen3, written by MaxText on the host CPU; needs maxtext)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="one engine process's bound, seconds")
    parser.add_argument("--json", type=pathlib.Path, help="write the results here")
    parser.add_argument("--keep", type=pathlib.Path, help="work in this folder and keep it (logs, the upstream copy)")
    parser.add_argument("--upstream", type=pathlib.Path, metavar="DIR",
                        help="a folder holding the pin's tpu_inference, made where git is (this host may lack it) by "
                             "support.fixes.unpatched.unpatched_package, with backport-984b29c49 kept where the host's "
                             "make_mesh is Explicit (the pin's runner cannot start on that mesh)")
    args = parser.parse_args(argv)
    if args.child:
        return child(pathlib.Path(args.child[0]), pathlib.Path(args.child[1]))
    batches = [int(b) for b in args.batches.split(",")]
    engines = list(FORMS) if args.forms else args.engines.split(",")
    pair = FORMS if args.forms else ENGINES
    if not 2 <= args.tokens <= MAX_MODEL_LEN - PROMPT_LENGTHS[1]:
        parser.error(f"--tokens must be within 2..{MAX_MODEL_LEN - PROMPT_LENGTHS[1]}")
    from maxtext_rl_overlay.smoke.cpu_simulation import NOTICE

    label = f" [{NOTICE}]" if args.cpu_simulation else ""

    def say(line: str) -> None:
        print(line + label, flush=True)

    jax_version = importlib.metadata.version("jax")
    say(f"bench-decode: jax {jax_version}, platform: "
        + ("CPU simulation of a TPU v6e-8 (8 CPU devices, Pallas kernels interpreted)" if args.cpu_simulation
           else "this machine's devices (each engine process says which below)")
        + f"; model {FORMS_MODEL if args.forms else args.model}, batches {batches}, {args.tokens} tokens, greedy, {args.repeats} repeats")
    keep = MESH_BACKPORT if "upstream" in engines and jax_makes_explicit_meshes(args.python) else None
    with tempfile.TemporaryDirectory(prefix="bench-decode-") as tmp:
        work = args.keep or pathlib.Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        if args.forms:
            checkpoint, config = write_maxtext_checkpoint(work / "maxtext", args.python, say)
        else:
            checkpoint, config = work / "llama", write_checkpoint(work / "llama", args.model)
        shadow = None
        reversed_: list[str] = []
        if "upstream" in engines and args.upstream is not None:
            shadow = args.upstream
            if not (shadow / "tpu_inference" / "__init__.py").is_file():
                raise SystemExit(f"bench-decode: --upstream {shadow} holds no tpu_inference package")
            say(f"upstream: {shadow / 'tpu_inference'}: the pin's tpu_inference given with --upstream (made elsewhere by "
                "support.fixes.unpatched.unpatched_package)")
        elif "upstream" in engines:
            from support.fixes.unpatched import unpatched_package

            spec = importlib.util.find_spec("tpu_inference")
            assert spec is not None and spec.origin is not None, "tpu_inference is not installed"
            shadow = work / "upstream"
            if shadow.exists():
                shutil.rmtree(shadow)
            reversed_ = unpatched_package("tpu-inference", pathlib.Path(spec.origin).parent, shadow, keep=(keep,) if keep else ())
            say(f"upstream: {shadow / 'tpu_inference'}: the installed tpu_inference with {len(reversed_)} patches of the series "
                "reverse-applied" + (f"; {MESH_BACKPORT} kept (jax {jax_version}'s make_mesh is Explicit: the pin's runner "
                                     "cannot start on it)" if keep else ""))
        most = max(batches)
        request = {
            "checkpoint": str(checkpoint), "cpu_simulation": args.cpu_simulation, "batches": batches,
            "tokens": args.tokens, "repeats": args.repeats, "prompts": prompts(most, config["vocab_size"]),
            "llm_args": {"max_num_seqs": most, "max_num_batched_tokens": max(128, most), "max_model_len": MAX_MODEL_LEN,
                         "num_gpu_blocks_override": most * math.ceil(MAX_MODEL_LEN / 16) + 16},
        }
        results = {name: run_engine(name, args.python, request, work, shadow if name == "upstream" else None,
                                    args.timeout, say) for name in engines}
    for name, r in results.items():
        if "error" in r:
            say(f"{name}: FAILED: {r['error']}")
        else:
            say(f"{name}: {r['platform']}, {r['devices']} {r['device_kind']} device(s), jax {r['jax']}, mesh {r['mesh']}, "
                f"engine start {r['engine_start_s']} s, process {r['process_s']} s; tpu_inference {r['tpu_inference']}")
    ok = [n for n in engines if "error" not in results[n]]
    doc: dict[str, Any] = {"written_by": "bench-decode", "cpu_simulation": args.cpu_simulation, "notice": NOTICE if args.cpu_simulation else None,
                           "jax": jax_version, "model": FORMS_MODEL if args.forms else args.model, "config": config,
                           "tokens": args.tokens, "repeats": args.repeats,
                           "upstream_reversed": reversed_, "upstream_kept": keep, "engines": results, "rows": []}
    if ok and args.forms:
        say("the forms' weights differ by design (vllm_native's are vLLM's dummy ones): their tokens are not compared, "
            "their meshes are above")
    elif ok:
        mesh = results[ok[0]].get("mesh", {})
        vocab_shards = mesh.get("model", 1)
        say(f"the runner's mesh {mesh}: " + (
            f"the vocab is sharded {vocab_shards} ways: the overlay samples on the shards (patch 0006), upstream gathers the vocab"
            if vocab_shards > 1 else
            "the vocab is not sharded (one chip): both engines run sampling.py's full-vocabulary path; "
            "the ratio measures the series' overhead elsewhere"))
    say(f"{'batch':>5} {'tokens':>6} " + " ".join(f"{n + ' tok/s':>15}" for n in engines)
        + (f" {pair[0] + '/' + pair[1]:>16} {'tokens equal':>12} {'max |dlogprob|':>14}" if len(ok) == 2 else ""))
    ratios = {}
    for b in batches:
        row: dict[str, Any] = {"batch": b}
        cells = []
        for n in engines:
            got = results[n].get("batches", {}).get(str(b))
            row[n] = got and got["tokens_per_s"]
            cells.append(f"{got['tokens_per_s']:>15.1f}" if got else f"{'-':>15}")
        line = f"{b:>5} {args.tokens:>6} " + " ".join(cells)
        if len(ok) == 2 and all(results[n].get("batches", {}).get(str(b)) for n in pair):
            o, u = (results[n]["batches"][str(b)] for n in pair)
            equal = o["tokens"] == u["tokens"]
            dlp = max((abs(x - y) for ro, ru in zip(o["logprobs"], u["logprobs"], strict=True)
                       for x, y in zip(ro, ru, strict=False)), default=0.0)
            row |= {"ratio": o["tokens_per_s"] / u["tokens_per_s"], "tokens_equal": equal, "max_logprob_diff": dlp,
                    "repeats_equal": o["repeats_equal"] and u["repeats_equal"]}
            ratios[b] = (row["ratio"], equal)
            line += (f" {row['ratio']:>16.3f} {'-':>12} {'-':>14}" if args.forms else
                     f" {row['ratio']:>16.3f} {'yes' if equal else 'NO':>12} {dlp:>14.2e}")
            if not row["repeats_equal"]:
                line += " (an engine's repeats differ)"
        doc["rows"].append(row)
        say(line)
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    if len(ok) == 2 and ratios:
        unequal = [b for b, (_, eq) in ratios.items() if not eq]
        say(f"{pair[0]}/{pair[1]} decode tokens/s, measured in this run: "
            + " ".join(f"B={b}: {r:.3f}" for b, (r, _) in ratios.items())
            + ("" if args.forms else  # the forms' weights differ by design: their tokens are not compared
               "; tokens equal at every batch" if not unequal else f"; tokens NOT equal at B={','.join(map(str, unequal))}: NO"))
    return 0 if len(ok) == len(engines) else 1


if __name__ == "__main__":
    sys.exit(main())
