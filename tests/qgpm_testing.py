"""Tiny random models of each supported family, shared by the test modules.

Kept out of conftest.py: several conftest modules exist under tests/, and
``from conftest import ...`` would pick whichever was imported first.
"""

from __future__ import annotations

import torch

# Preliminary heads used only when the shipped head set is absent (never in CI).
FALLBACK_HEADS = [(14, 3), (15, 6), (18, 6), (18, 7), (23, 7), (7, 7), (17, 4), (18, 8)]


def tiny_config(family: str, vocab_size: int, **overrides):
    """A tiny random config of ``family`` (GQA everywhere; Qwen3 has q/k norms)."""
    import transformers as tf

    common = dict(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        rope_theta=10000.0, tie_word_embeddings=False,
    )
    common.update(overrides)
    cls = {
        "llama": tf.LlamaConfig,
        "mistral": tf.MistralConfig,
        "qwen2": tf.Qwen2Config,
        "qwen3": tf.Qwen3Config,
        "granite": tf.GraniteConfig,
        "gemma3_text": tf.Gemma3TextConfig,
    }[family]
    if family == "qwen3":
        common.setdefault("head_dim", 16)
    if family == "granite":
        common.update(attention_multiplier=0.3, embedding_multiplier=2.0, residual_multiplier=0.5, logits_scaling=2.0)
    if family == "gemma3_text":
        # Both layer kinds (local sliding-window layers 0 and 2, global layers 1 and 3), a
        # window much shorter than the test prompts, q/k-norm, GQA, Gemma's own logit scale,
        # and linear scaling on the global base as in the larger Gemma 3 sizes.
        common.pop("rope_theta", None)
        common.setdefault("head_dim", 16)
        common.setdefault("layer_types", ["sliding_attention", "full_attention", "sliding_attention", "full_attention"])
        common.setdefault("sliding_window", 32)
        common.setdefault("query_pre_attn_scalar", 24)
        common.setdefault("rope_parameters", {
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        })
    if family == "mistral":
        common.setdefault("sliding_window", None)
    return cls(**common)


def tiny_model(family: str, vocab_size: int, seed: int = 0, attn_implementation: str = "eager", **overrides):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = tiny_config(family, vocab_size, **overrides)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn_implementation)
    return model.eval()


FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "granite"]
# Families with several rotary kinds, tested on their own (the RoPE baselines do not cover them).
LAYERED_FAMILIES = ["gemma3_text"]


def save_tiny(directory, tokenizer, family: str = "llama", seed: int = 0, **overrides):
    """Save a tiny random model of ``family`` with ``tokenizer`` to ``directory`` (loadable by path)."""
    tiny_model(family, len(tokenizer), seed=seed, **overrides).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def spy_load_model(monkeypatch) -> list:
    """Record every ``qgpm.loading.load_model`` call the engine makes as ``(source path, kwargs)``."""
    import qgpm.engine

    calls: list = []
    real = qgpm.engine.load_model

    def spy(source, **kwargs):
        calls.append((source.path, kwargs))
        return real(source, **kwargs)

    monkeypatch.setattr(qgpm.engine, "load_model", spy)
    return calls


# A needle among filler sentences, for behaviour tests of pass 1 and its reuse.
def with_llama3_tokens(tokenizer, chat_template: str):
    """A copy of ``tokenizer`` with Llama 3's special tokens added and ``chat_template`` set."""
    import copy

    tok = copy.deepcopy(tokenizer)
    tok.add_special_tokens(
        {"bos_token": "<|begin_of_text|>", "additional_special_tokens": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]}
    )
    tok.chat_template = chat_template
    return tok


NEEDLE_FILLER = [
    "The morning market opened early and the stalls filled with fresh bread.",
    "Several visitors walked along the river to watch the boats pass by.",
    "A small band played old songs near the fountain in the square.",
    "The library kept its doors open late for the students before exams.",
]
NEEDLE = "The secret password for the blue door is tangerine."
NEEDLE_QUESTION = "What is the secret password for the blue door?"


def needle_context(where: int, n: int = 24) -> str:
    """``n`` filler sentences with :data:`NEEDLE` inserted at sentence ``where``."""
    sents = [NEEDLE_FILLER[i % len(NEEDLE_FILLER)] for i in range(n)]
    sents.insert(where, NEEDLE)
    return " ".join(sents)


def benchmark_module(name: str, folder: str = "benchmarks"):
    """The script ``<folder>/<name>.py`` (``benchmarks`` or ``scripts``) imported as a module (the
    folder is not a package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / folder / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"qgpm_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
