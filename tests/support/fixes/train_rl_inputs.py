"""What the train_rl run (support/programs/train_rl_run.py) feeds MaxText's
`train_rl` in place of the downloads of MaxText's own integration test: its
two configurations, a tiny byte-level BPE tokenizer trained on the prompts
(saved with `transformers`), a GSM8K-format dataset in local parquet files,
a reward file, and the argv that names them.

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

QUESTIONS = [
    ("Tom has 3 apples and buys 4 more. How many apples does he have?", "3 + 4 = 7\n#### 7"),
    ("A box holds 6 pens. How many pens are in 2 boxes?", "6 * 2 = 12\n#### 12"),
    ("Sara reads 5 pages a day for 3 days. How many pages does she read?", "5 * 3 = 15\n#### 15"),
    ("There are 10 birds and 4 fly away. How many birds are left?", "10 - 4 = 6\n#### 6"),
]

#: A reward that differs between a group's generations (GRPO's advantages of
#: a random model are otherwise all zero): the share of digits in the text.
REWARD_FILE = '''
def digit_share(prompts, completions, tmvp_config=None, **kwargs):
    return [sum(c.isdigit() for c in text) / max(1, len(text)) + 0.01 * len(text) for text in completions]
'''


def make_inputs(work: pathlib.Path, config: str) -> dict:
    """The tokenizer, the dataset files, the reward file."""
    import pandas as pd
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    template = json.loads((_maxtext_package()
                           / "examples" / "chat_templates" / "gsm8k_rl.json").read_text())
    corpus = [template["SYSTEM_PROMPT"], template["TEMPLATE"]] + [q + " " + a for q, a in QUESTIONS]
    specials = ["<pad>", "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"]
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus * 4, trainers.BpeTrainer(
        vocab_size=TINY["vocab_size"] - 64, special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tokenizer_dir = work / "tokenizer"
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}\n{% endif %}"
    fast.save_pretrained(tokenizer_dir)
    assert (fast.pad_token_id, fast.bos_token_id, fast.eos_token_id) == (0, 1, 2)
    (tokenizer_dir / "config.json").write_text(json.dumps(CONFIGS[config]["hf_config"]))
    train = work / "train.parquet"
    test = work / "test.parquet"
    pd.DataFrame({"question": [q for q, _ in QUESTIONS], "answer": [a for _, a in QUESTIONS]}).to_parquet(train)
    pd.DataFrame({"question": [q for q, _ in QUESTIONS[:2]], "answer": [a for _, a in QUESTIONS[:2]]}).to_parquet(test)
    rewards = work / "rewards.py"
    rewards.write_text(REWARD_FILE)
    return {"tokenizer": tokenizer_dir, "train": train, "test": test, "rewards": rewards, "vocab": len(fast)}


def argv_for(config: str, work: pathlib.Path, inputs: dict) -> list[str]:
    rl_yml = _maxtext_package() / "configs" / "post_train" / "rl.yml"
    return [
        "train_rl.py", str(rl_yml),
        # MaxText's test's base argv ...
        f"model_name={CONFIGS[config]['model_name']}",
        f"tokenizer_path={inputs['tokenizer']}",
        f"base_output_directory={work / 'out'}",
        "batch_size=1",
        "num_batches=2",  # two GRPO steps (MaxText's test: batch_size=4, num_batches=1)
        "num_test_batches=1",
        f"chips_per_vm={CHIPS}",
        "scan_layers=True",
        "hbm_utilization_vllm=0.4",
        "rollout_data_parallelism=1",
        "rollout_tensor_parallelism=-1",
        "rl.num_generations=2",
        # ... with what replaces its downloads: a tiny randomly initialised
        # model (no checkpoint, no conversion), local data files, ...
        *MAXTEXT_TINY_ARGS,
        "convert_checkpoint_if_possible=False",
        "dataset_name=openai/gsm8k",
        "eval_dataset_name=openai/gsm8k",
        f"hf_train_files={inputs['train']}",
        f"hf_eval_files={inputs['test']}",
        f"reward_functions_path={inputs['rewards']}",
        "reward_functions=digit_share",
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
