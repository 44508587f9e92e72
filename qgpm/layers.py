"""Where a HuggingFace decoder keeps its layers, which device takes its inputs, which attention
implementation it runs, and the error for a model QGPM cannot modulate.

The smallest module of the package (it imports nothing from it), so that both the rotary
code (:mod:`qgpm.rope`) and the hooks that patch the layers (:mod:`qgpm.hooks`) can use it.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import torch

__all__ = ["UnsupportedModelError", "attention_implementation", "attention_switched", "decoder_layers", "input_device", "unwrap_adapters"]

_SWITCHED: dict[int, str | None] = {}  # id(model.config) -> its own implementation while a call runs another


class UnsupportedModelError(ValueError):
    """The model family or its RoPE variant is not supported by QGPM."""


def decoder_layers(model: torch.nn.Module) -> Sequence[torch.nn.Module]:
    """The decoder layers of ``model`` (``model.base_model.layers``)."""
    base = getattr(model, "base_model", model)
    layers = getattr(base, "layers", None)
    if layers is None:
        raise UnsupportedModelError(f"{type(model).__name__} has no decoder layer list at model.base_model.layers")
    return layers


def unwrap_adapters(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model inside a PEFT wrapper (``PeftModel``), else ``model`` itself.

    Adapters that sit in the layers (LoRA and its kin) stay in place and active in the model
    returned, so it computes what the wrapper computes. Prompt-learning adapters (prompt, prefix,
    P-tuning) add virtual tokens in the wrapper's own forward, which QGPM's positions would not
    cover: :class:`UnsupportedModelError` says so.
    """
    if not (hasattr(model, "peft_config") and callable(getattr(model, "get_base_model", None))):
        return model
    config = getattr(model, "active_peft_config", None)
    if getattr(config, "is_prompt_learning", False):
        raise UnsupportedModelError(
            f"this PEFT model's active adapter ({getattr(config, 'peft_type', '?')}) adds virtual tokens before the prompt, "
            "which QGPM's positions do not cover; use an adapter in the layers (LoRA), or generate without QGPM")
    return model.get_base_model()


def input_device(model: torch.nn.Module) -> torch.device:
    """The device a forward of ``model`` takes ``input_ids`` on: its input embedding's, or, when
    accelerate offloaded the embedding (its weight then sits on ``meta``), the device accelerate
    runs it on. ``next(model.parameters()).device`` is ``meta`` there."""
    try:
        emb = model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        emb = None
    run_on = getattr(getattr(emb, "_hf_hook", None), "execution_device", None)
    if run_on is not None:
        return torch.device(run_on)
    weight = getattr(emb, "weight", None)
    return weight.device if isinstance(weight, torch.Tensor) else next(model.parameters()).device


def attention_implementation(model: torch.nn.Module) -> str:
    """The attention implementation ``model`` runs outside any call (``"eager"`` when unset):
    while a RoPE baseline's call has switched it (:func:`attention_switched`), the one it
    switched away from, so that other threads' checks read the model's own."""
    cfg = model.config
    key = id(cfg)
    impl = _SWITCHED[key] if key in _SWITCHED else getattr(cfg, "_attn_implementation", None)
    return impl or "eager"


@contextlib.contextmanager
def attention_switched(model: torch.nn.Module) -> Iterator[None]:
    """Within the block the caller (holding the model lock) switches ``model``'s attention
    implementation; :func:`attention_implementation` keeps reporting the model's own."""
    key = id(model.config)
    _SWITCHED[key] = getattr(model.config, "_attn_implementation", None)
    try:
        yield
    finally:
        _SWITCHED.pop(key, None)
