"""What the train_rl run (support/programs/train_rl_run.py) feeds MaxText's
`train_rl` in place of the downloads of MaxText's own integration test: its
two configurations, a tiny byte-level BPE tokenizer trained on the prompts
(saved with `transformers`), a GSM8K-format dataset in local parquet files,
a reward file, and the argv that names them.

Two shapes: "tiny" (the tests' runs: MaxText's qwen3 and a Llama 3.1 of 2
layers, width 128, two GRPO steps) and "user" (issue 61: MaxText's shipped
model configs, USER_MODELS, at the lengths and generations a user sets,
USER_LENGTHS, for at least five steps; "real" dims on a chip, "tiny" dims on
the CPU simulation: the same code path with the tiny runs' widths and shorter
completions, so that the CPU can rehearse it).

Imports nothing heavy at import: MaxText, pandas and the tokenizers are
imported by the functions that use them.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
from typing import Any

from support.fixes import maxtext_models
from support.fixes.matrix import CHIPS

#: The tiny model's dimensions, in MaxText's words and in Hugging Face's
#: (support/fixes/maxtext_models.py says why these).
TINY = maxtext_models.ENGINE_DIMS
HF_TINY = maxtext_models.ENGINE_HF_DIMS

CONFIGS: dict[str, dict[str, Any]] = {
    # MaxText's test's argv for each configuration, with the tiny model's
    # overrides (in the adapter's maxtext_config too).
    "maxtext_on_vllm": {
        # MaxText's test's model, qwen3-0.6b.
        "model_name": maxtext_models.ENGINE_MODEL_NAME,
        "hf_config": maxtext_models.ENGINE_HF_CONFIG,
        "argv": [
            "run_name=tiny_rl_maxtext",
            "vllm_hf_overrides={architectures: ['MaxTextForCausalLM']}",
            "vllm_additional_config=" + json.dumps({"maxtext_config": {
                "model_name": maxtext_models.ENGINE_MODEL_NAME, "log_config": "false", "override_model_config": True, **TINY}}),
        ],
        "env": {"NEW_MODEL_DESIGN": "1"},
        # Its logits are tied to the embedding: without the scaling (see
        # maxtext_models.ENGINE_EMBEDDING_SCALE) the random model repeats
        # its last token with near certainty, every generation of a group is
        # the same, GRPO's advantages are zero and the step trains nothing
        # but the weight decay (the engine's logprobs did not move).
        "embedding_scale": maxtext_models.ENGINE_EMBEDDING_SCALE,
    },
    "vllm_native": {
        # Not MaxText's test's qwen3-0.6b: MaxText 0.2.4 cannot sync it into
        # vLLM's own model (maxtext_vllm_rollout._create_model_converter
        # raises NotImplementedError: its rule table is None, "only supported
        # on the direct MaxText-to-MaxText sync path"). Llama 3.1 syncs
        # through Tunix's transfer_state_with_mappings with MaxText's
        # LLAMA3_VLLM_MAPPING.
        "model_name": "llama3.1-8b",
        "hf_config": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "rms_norm_eps": 1e-5,
                      "rope_theta": 500000.0, "tie_word_embeddings": False, **HF_TINY},
        "argv": ["run_name=tiny_rl_native"],
        "env": {},
    },
}
MAXTEXT_TINY_ARGS = ["override_model_config=True"] + [f"{k}={v}" for k, v in TINY.items()]

SHAPES = ("tiny", "user")

#: The user shape's models, one a configuration: MaxText's shipped configs,
#: random weights (nothing downloaded). maxtext_on_vllm runs qwen3-0.6b, the
#: model MaxText's own RL test names. vllm_native cannot run any qwen3 in
#: MaxText 0.2.4 (its sync has no HF-target rules for them: see CONFIGS), so
#: it runs the smallest shipped config MaxText can sync into vLLM's own model,
#: qwen2.5-1.5b (MaxText's QWEN2 mapping), at 8 of its 28 decoder layers: the
#: whole model does not fit one v5e beside its engine (1.54 B parameters: its
#: actor, reference, engine weights and Adam state alone are 14.4 GiB in
#: bfloat16, the state 11.5 GiB more once Tunix's first update turns it to
#: float32; docs and the chip plan give the table); at 8 layers it has 608 M
#: parameters, qwen3-0.6b's size (596 M), at qwen2.5-1.5b's width, heads,
#: vocabulary and biases.
USER_MODELS: dict[str, dict[str, Any]] = {
    "maxtext_on_vllm": {
        "model_name": "qwen3-0.6b", "overrides": {},
        "hf_config": {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024,
                      "intermediate_size": 3072, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
                      "num_hidden_layers": 28, "vocab_size": 151936, "max_position_embeddings": 40960,
                      "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": True,
                      "attention_bias": False, "hidden_act": "silu", "torch_dtype": "bfloat16"},
    },
    "vllm_native": {
        "model_name": "qwen2.5-1.5b", "overrides": {"base_num_decoder_layers": 8},
        "hf_config": {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 1536,
                      "intermediate_size": 8960, "num_attention_heads": 12, "num_key_value_heads": 2, "head_dim": 128,
                      "num_hidden_layers": 8, "vocab_size": 151936, "max_position_embeddings": 32768,
                      "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": True,
                      "hidden_act": "silu", "torch_dtype": "bfloat16"},
    },
}
#: The user shape's lengths and batch. "real": prompts padded to 256 tokens
#: and completions of up to 256 (a few hundred tokens each, GSM8K-like
#: reasoning), 4 generations of each prompt (GRPO's advantage is a
#: generation's reward against its group's mean: 2, rl.yml's default, gives
#: only +-1 advantages; 4 is the least that ranks several answers, and keeps
#: the update's float32 logits, 4 x 512 x 151936, at 1.16 GiB a copy), one
#: prompt a step (rl.yml's batch_size), bfloat16 weights (rl.yml). "tiny"
#: (the CPU simulation: kernels interpreted) decodes 16 tokens, as the tiny runs do.
USER_LENGTHS: dict[str, dict[str, int]] = {
    "real": {"prompt": 256, "completion": 256, "kv_cache_buffer": 256, "generations": 4, "batch_size": 1},
    "tiny": {"prompt": 128, "completion": 16, "kv_cache_buffer": 16, "generations": 4, "batch_size": 1},
}
USER_STEPS = 6
#: The engine's share of the chip: it takes hbm_utilization_vllm of the
#: chip less what is in use when it starts (the actor, the reference and its
#: own weights: 3 x 1.11 GiB for qwen3-0.6b, 3 x 1.13 for the 8-layer qwen2.5,
#: bfloat16) for its KV cache. 0.28 of a v5e's 15.75 GiB leaves that cache
#: about 1 GiB (the run needs 4 x 768 tokens: 0.33 GiB for qwen3-0.6b) and
#: the trainer 11.3 GiB: at the first update Adam's bfloat16 state (2.2 GiB),
#: the float32 state Tunix's update turns it into (4.4 GiB: the pins' Tunix
#: divides the bfloat16 gradients by a float32 denominator,
#: peft_trainer.py:534-535; upstream's 9a17c371 keeps the state's dtypes)
#: and the float32 gradients (2.2 GiB), 8.9 GiB, beside the update's logits
#: (1.16 GiB a float32 copy). rl.yml's 0.72 would leave the trainer 4.4 GiB.
USER_HBM_UTILIZATION = 0.28
#: The user shape's learning rate: rl.yml's 3e-6 moves a bfloat16 weight of
#: magnitude 0.03 by less than half its rounding step (1.2e-4), so most
#: weights would not change in five steps; 1e-4 moves them.
USER_LEARNING_RATE = 1e-4


def user_dims(config: str, dims: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """The user shape's model name, MaxText overrides and vLLM config.json
    for `config`, at "real" or "tiny" dims (tiny: the tiny runs' widths,
    the family and its structure kept)."""
    model = USER_MODELS[config]
    if dims == "real":
        return model["model_name"], dict(model["overrides"]), dict(model["hf_config"])
    hf = dict(model["hf_config"]) | {k: v for k, v in HF_TINY.items() if k not in ("torch_dtype",)}
    return model["model_name"], dict(TINY), hf


def embedding_scale(emb_dim: int) -> float:
    """The tied embedding's scale (see maxtext_models.ENGINE_EMBEDDING_SCALE):
    the tiny run's 0.25 at width 128, the same logit spread at any width."""
    return maxtext_models.ENGINE_EMBEDDING_SCALE * (128 / emb_dim) ** 0.5


QUESTIONS = [
    ("Tom has 3 apples and buys 4 more. How many apples does he have?", "3 + 4 = 7\n#### 7"),
    ("A box holds 6 pens. How many pens are in 2 boxes?", "6 * 2 = 12\n#### 12"),
    ("Sara reads 5 pages a day for 3 days. How many pages does she read?", "5 * 3 = 15\n#### 15"),
    ("There are 10 birds and 4 fly away. How many birds are left?", "10 - 4 = 6\n#### 6"),
]

def user_questions(count: int, dims: str = "real") -> list[tuple[str, str]]:
    """GSM8K-format word problems for the user shape, `count` of them: at
    real dims each a paragraph (217-218 tokens of the user shape's tokenizer,
    USER_TOKENIZER_VOCAB, in MaxText's template), the numbers varying; at
    tiny dims the tiny runs' QUESTIONS over again (88-91 tokens: the CPU's
    prompts stay within 128)."""
    if dims == "tiny":
        return (QUESTIONS * (count // len(QUESTIONS) + 1))[:count]
    out = []
    for i in range(count):
        shelves, books, added, weeks = 3 + i, 12 + 2 * i, 2 + i % 4, 2 + i % 3
        question = (f"A school library has {shelves} shelves of books. Each shelf holds {books} books at the start of "
                    f"the term, and every week the librarians add {added} new books to each shelf. The library also "
                    f"keeps {shelves + books} magazines in a separate reading room, and those are not counted as books. "
                    "Students borrow some of the books during the week, but they always bring every one of them back "
                    "by Friday afternoon, before the librarians count the shelves again. How many books are on the "
                    f"shelves, all together, after {weeks} weeks?")
        total = shelves * books + shelves * added * weeks
        out.append((question, f"{shelves} * {books} + {shelves} * {added} * {weeks} = {total}\n#### {total}"))
    return out


#: The user shape's tokenizer: a byte-level BPE of this many tokens, so that
#: its prompts are of a realistic length in tokens (a larger vocabulary
#: learnt from these few paragraphs would merge whole phrases).
USER_TOKENIZER_VOCAB = 512


#: A reward that differs between a group's generations (GRPO's advantages of
#: a random model are otherwise all zero): the share of digits in the text.
REWARD_FILE = '''
def digit_share(prompts, completions, tmvp_config=None, **kwargs):
    return [sum(c.isdigit() for c in text) / max(1, len(text)) + 0.01 * len(text) for text in completions]
'''


def make_inputs(work: pathlib.Path, config: str, hf_config: dict | None = None,
                questions: list[tuple[str, str]] | None = None, tokenizer_vocab: int | None = None) -> dict:
    """The tokenizer, the dataset files, the reward file (`hf_config`: the
    vLLM config.json, the configuration's tiny one by default; `questions`:
    the user shape's, all but the last two for training; `tokenizer_vocab`:
    the tokenizer's size, the model's vocabulary less 64 by default)."""
    hf_config = hf_config or CONFIGS[config]["hf_config"]
    rows = questions or QUESTIONS
    tests = 2
    import pandas as pd
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    template = json.loads((_maxtext_package()
                           / "examples" / "chat_templates" / "gsm8k_rl.json").read_text())
    corpus = [template["SYSTEM_PROMPT"], template["TEMPLATE"]] + [q + " " + a for q, a in rows]
    specials = ["<pad>", "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"]
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus * 4, trainers.BpeTrainer(
        vocab_size=tokenizer_vocab or hf_config["vocab_size"] - 64, special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tokenizer_dir = work / "tokenizer"
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}\n{% endif %}"
    fast.save_pretrained(tokenizer_dir)
    assert (fast.pad_token_id, fast.bos_token_id, fast.eos_token_id) == (0, 1, 2)
    (tokenizer_dir / "config.json").write_text(json.dumps(hf_config))
    train = work / "train.parquet"
    test = work / "test.parquet"
    train_rows = rows[:-tests] if questions else rows
    pd.DataFrame({"question": [q for q, _ in train_rows], "answer": [a for _, a in train_rows]}).to_parquet(train)
    pd.DataFrame({"question": [q for q, _ in rows[-tests:] if questions] or [q for q, _ in rows[:tests]],
                  "answer": [a for _, a in rows[-tests:] if questions] or [a for _, a in rows[:tests]]}).to_parquet(test)
    rewards = work / "rewards.py"
    rewards.write_text(REWARD_FILE)
    prompt_tokens = [len(fast(template["TEMPLATE"].format(system_prompt=template["SYSTEM_PROMPT"], question=q))["input_ids"])
                     for q, _ in rows]
    return {"tokenizer": tokenizer_dir, "train": train, "test": test, "rewards": rewards, "vocab": len(fast),
            "prompt_tokens": [min(prompt_tokens), max(prompt_tokens)]}


def user_argv(config: str, work: pathlib.Path, inputs: dict, dims: str, steps: int) -> list[str]:
    """The user shape's argv: MaxText's own base argv of the tests (the data,
    the reward, no checkpoint) with USER_MODELS' model and USER_LENGTHS'."""
    name, overrides, _ = user_dims(config, dims)
    lengths = USER_LENGTHS[dims]
    argv = [a for a in argv_for(config, work, inputs) if a.split("=", 1)[0] not in _USER_REPLACES]
    argv = [a for a in argv if not any(a.startswith(f"{k}=") for k in TINY)]
    argv += [
        f"model_name={name}",
        f"batch_size={lengths['batch_size']}",
        f"num_batches={steps}",
        f"rl.num_generations={lengths['generations']}",
        f"max_prefill_predict_length={lengths['prompt']}",
        f"max_target_length={lengths['prompt'] + lengths['completion']}",
        f"kv_cache_buffer={lengths['kv_cache_buffer']}",
        f"learning_rate={USER_LEARNING_RATE}",
        *(["override_model_config=True"] if overrides else []),
        *[f"{k}={v}" for k, v in overrides.items()],
    ]
    if dims == "real":
        argv.append(f"hbm_utilization_vllm={USER_HBM_UTILIZATION}")
    if config == "maxtext_on_vllm":
        argv = [a for a in argv if not a.startswith("vllm_additional_config=")]
        argv.append("vllm_additional_config=" + json.dumps({"maxtext_config": {
            "model_name": name, "log_config": "false", **({"override_model_config": True, **overrides} if overrides else {})}}))
    return argv


#: The tiny runs' settings the user shape sets anew.
_USER_REPLACES = ("model_name", "batch_size", "num_batches", "rl.num_generations", "max_prefill_predict_length",
                  "max_target_length", "kv_cache_buffer", "learning_rate", "hbm_utilization_vllm", "override_model_config")


#: train_rl's hbm_utilization_vllm in these runs.
HBM_UTILIZATION = 0.4


def base_argv(model_name: str, work: pathlib.Path, inputs: dict, batches: int) -> list[str]:
    """MaxText's integration test's base argv for train_rl (rl.yml, the
    model's name, `batches` GRPO steps of one prompt, the rollout's
    parallelism over the chips)."""
    rl_yml = _maxtext_package() / "configs" / "post_train" / "rl.yml"
    return [
        "train_rl.py", str(rl_yml),
        f"model_name={model_name}",
        f"tokenizer_path={inputs['tokenizer']}",
        f"base_output_directory={work / 'out'}",
        "batch_size=1",
        f"num_batches={batches}",
        "num_test_batches=1",
        f"chips_per_vm={CHIPS}",
        "scan_layers=True",
        f"hbm_utilization_vllm={HBM_UTILIZATION}",
        "rollout_data_parallelism=1",
        "rollout_tensor_parallelism=-1",
        "rl.num_generations=2",
    ]


def data_argv(inputs: dict) -> list[str]:
    """What replaces the test's downloads: no checkpoint conversion, the local data and reward files."""
    return [
        "convert_checkpoint_if_possible=False",
        "dataset_name=openai/gsm8k",
        "eval_dataset_name=openai/gsm8k",
        f"hf_train_files={inputs['train']}",
        f"hf_eval_files={inputs['test']}",
        f"reward_functions_path={inputs['rewards']}",
        "reward_functions=digit_share",
    ]


def argv_for(config: str, work: pathlib.Path, inputs: dict) -> list[str]:
    return [
        # MaxText's test's base argv (two GRPO steps; its test: batch_size=4, num_batches=1) ...
        *base_argv(CONFIGS[config]["model_name"], work, inputs, batches=2),
        # ... with what replaces its downloads: a tiny randomly initialised
        # model (no checkpoint, no conversion), local data files, ...
        *MAXTEXT_TINY_ARGS,
        *data_argv(inputs),
        # ... and lengths that fit the tiny model and the CPU.
        "max_prefill_predict_length=128",
        "max_target_length=144",
        "kv_cache_buffer=16",
        "learning_rate=1e-3",
        "use_pathways=False",
        "enable_checkpointing=False",
        "remat_policy=full",
        *CONFIGS[config]["argv"],
    ]


def _maxtext_package() -> pathlib.Path:
    """The installed maxtext package's folder."""
    spec = importlib.util.find_spec("maxtext")
    assert spec is not None and spec.origin is not None, "maxtext is installed"
    return pathlib.Path(spec.origin).parent
