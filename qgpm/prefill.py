"""Prefill reuse: pass 1's vanilla KV states carried into generation where they are exact.

A ``qgpm`` call whose pass 2 starts with a run of tokens computed exactly as in a vanilla
prefill (all of them when the call falls back to vanilla positions; under ``remap="reorder"``
fed in slot order, the tokens before the first moved one) lets pass 1 go on through every
layer when that is cheaper than stopping at the deepest head's layer (:func:`prefill_reuse_pays`);
generation then starts from those tokens' cached states (:func:`take_prefill`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

from .layers import attention_implementation
from .rope import PositionPlan

logger = logging.getLogger("qgpm")

__all__ = ["Prefill", "PREFIX_SAFE_ATTENTION", "prefill_reuse_pays", "fresh_cache", "take_prefill", "rewind", "prefix_safe"]

PREFIX_SAFE_ATTENTION = frozenset({"eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention"})
"""Attention implementations shipped with transformers, which offset the causal mask by a cached prefix."""


@dataclass(eq=False)
class Prefill:
    """The vanilla KV states pass 1 computed when it went on as a prefill, shared by a
    prepared call and its replans: the first ``valid`` tokens of ``cache`` still hold them
    (a generation that reused ``P`` tokens appends after them); ``seconds``: what going on
    cost, counted in the prefill time of a generation that reuses them."""

    cache: Any
    valid: int
    seconds: float


def prefill_reuse_pays(prefix: int, num_tokens: int, deepest: int, n_layers: int) -> bool:
    """Whether pass 1 should go on as a vanilla prefill (``QGPM.reuse_prefill``).

    Pass 1 has run ``deepest`` of ``n_layers`` layers over the ``num_tokens`` prompt tokens
    when the plan is known. Stopping there costs a full pass 2: one prefill. Going on costs the
    remaining layers for every token, ``(n_layers - deepest) / n_layers`` of a prefill, and
    then pass 2 only for the share ``f = 1 - prefix / num_tokens`` of tokens after the
    ``prefix`` it can reuse (:meth:`PositionPlan.vanilla_prefix
    <qgpm.rope.PositionPlan.vanilla_prefix>`). That chunk is charged ``f * (1 + f / 2)`` of a
    prefill, not ``f``: its queries attend over the whole prompt under an explicit mask, which
    costs more per token than a causal prefill (on CPU, SmolLM2 at 4K:
    ``benchmarks/results/speed_cpu_smollm2_reuse_d*.md``; measured 0.29 / 0.59 / 1.10 of a
    prefill for f = 0.25 / 0.49 / 0.74). It goes on when that is cheaper, and always for a plan
    that changes nothing (``prefix >= num_tokens``: one prefill in all).
    """
    if prefix <= 0:
        return False
    if prefix >= num_tokens:
        return True
    f = 1.0 - prefix / num_tokens
    return (n_layers - deepest) / n_layers + f * (1.0 + f / 2.0) < 1.0


def prefix_safe(model: torch.nn.Module) -> bool:
    """Whether ``model``'s attention implementation handles a chunk of queries after a cached prefix."""
    return attention_implementation(model) in PREFIX_SAFE_ATTENTION


def reuse_applies(model: torch.nn.Module, warned: set) -> bool:
    """Whether a prefill can be reused on ``model`` (:func:`prefix_safe`); an attention
    implementation that cannot is logged once per ``warned`` set (the engine's)."""
    if prefix_safe(model):
        return True
    impl = attention_implementation(model)
    if impl not in warned:
        warned.add(impl)
        logger.warning("qgpm: reuse_prefill is not applied with attention implementation %r (a chunk after a cached prefix "
                       "needs its causal mask offset, which only transformers' own implementations are known to apply); "
                       "pass 2 prefills the whole prompt. Pass reuse_prefill=False to the engine to silence this.", impl)
    return False


def fresh_cache(model: torch.nn.Module) -> Any:
    """An empty KV cache for ``model``; sliding-window layers (Gemma 3) record their past, so
    that it can be cut back to a prefix (a rewind, a reused prefill)."""
    cache = DynamicCache(config=model.config)
    if hasattr(cache, "activate_past_recording"):
        cache.activate_past_recording()
    return cache


def take_prefill(prefill: Prefill | None, plan: Any, num_tokens: int, installed: Any) -> tuple[Any, int]:
    """A call's reusable prefill, cut back to what pass 2 can reuse, and that length.

    ``(None, 0)`` unless pass 1 went on as a prefill and pass 2 is a plain forward (no plan
    ``installed``) whose leading tokens match: at most the ``plan``'s vanilla prefix, what is
    still valid, and one token short of the ``num_tokens`` prompt (generation computes the last
    prompt token's logits). Run it under the model lock (inside ``apply_plan``).
    """
    if prefill is None or installed is not None or not isinstance(plan, PositionPlan):
        return None, 0
    use = min(plan.vanilla_prefix(), prefill.valid, num_tokens - 1)
    if use <= 0:
        return None, 0
    try:
        _cut_back(prefill.cache, use)
    except RuntimeError as exc:  # a cache layer that cannot be cut back: prefill the whole prompt
        logger.warning("qgpm: pass 1's prefill cannot be reused (%s); pass 2 prefills the whole prompt (same answer)", exc)
        prefill.valid = 0
        return None, 0
    # a sliding-window layer keeps only its window once cut back: no later reuse of a shorter prefix
    prefill.valid = 0 if any(getattr(prefill.cache, "is_sliding", ())) else use
    return prefill.cache, use


def _cut_back(cache: Any, length: int) -> None:
    """Cut every layer of ``cache`` back to its first ``length`` tokens, each from its own length:
    a generation stopped inside a forward (an exception, Ctrl-C) leaves the layers it reached
    one token longer than the rest."""
    for layer in getattr(cache, "layers", None) or [cache]:
        extra = layer.get_seq_length() - length
        if extra > 0:
            layer.crop(-extra)


def rewind(cache: Any, tokens: int) -> bool:
    """Drop the last ``tokens`` entries of a KV cache so generation can continue from it;
    ``False`` (logged) when this cache cannot be rewound (a sliding-window layer past its
    window that kept no past states), and generation then recomputes the prompt."""
    try:
        cache.crop(-tokens)
    except RuntimeError as exc:
        logger.warning("qgpm: the log-prob prefill's KV cache cannot be rewound (%s); generation recomputes the prompt "
                       "(one more prefill, same answer)", exc)
        return False
    return True
