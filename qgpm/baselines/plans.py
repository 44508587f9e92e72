"""Per-call plans of the RoPE baselines: what each attention layer does in one call.

A plan is built from the method's options and the prompt length (:func:`build_baseline_plan`)
and applied with :func:`qgpm.runtime.apply_plan`, like QGPM's position plans. Each plan's
``attention`` is called by :func:`qgpm.baselines.attention.baseline_attention` for every
layer of every forward in the call (prefill, decode steps, a teacher-forced continuation).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from ..rope import RotaryInfo, UnsupportedModelError
from .attention import installed, rotate, standard_attention, token_positions, two_branch_attention
from .options import MsPoEOptions, SelfExtendOptions, StringOptions
from .rules import ms_poe_ratios, ms_poe_unit_ratios, position_awareness_scores, self_extend_positions

__all__ = ["BaselinePlan", "StringPlan", "SelfExtendPlan", "MsPoEPlan", "build_baseline_plan"]

log = logging.getLogger("qgpm")


@dataclass
class BaselinePlan:
    """Base of the attention-level plans (``num_tokens``: the prompt length ``N``)."""

    method: str
    num_tokens: int
    rotary: RotaryInfo
    n_layers: int
    _inv_freq: dict = field(default_factory=dict, repr=False)

    def inv_freq(self, device: torch.device) -> torch.Tensor:
        """The model's rotary frequencies on ``device`` (float64)."""
        key = str(device)
        if key not in self._inv_freq:
            self._inv_freq[key] = self.rotary.inv_freq.to(device=device, dtype=torch.float64)
        return self._inv_freq[key]

    def reset(self) -> None:
        """Forget per-call state (called when the plan is installed)."""

    @contextlib.contextmanager
    def installed(self, model: torch.nn.Module) -> Iterator[None]:
        """Route every attention layer of ``model`` through this plan inside the block."""
        with installed(model, self):
            yield

    def describe(self) -> dict[str, Any]:
        """What the plan does, for ``result.details``."""
        return {}

    def attention(self, module, layer: int, query, key, value, mask, scaling: float, dropout: float, kwargs: dict) -> torch.Tensor:
        raise NotImplementedError


@dataclass
class StringPlan(BaselinePlan):
    """STRING: distances ``d >= S`` become ``d - S + W``; near branch + shifted-query branch."""

    shift: int = 0
    local_window: int = 128
    logit_scale: float = 1.0  # cos_sin_scale squared

    def describe(self) -> dict[str, Any]:
        return {"shift": self.shift, "local_window": self.local_window, "logit_scale": self.logit_scale}

    def attention(self, module, layer, query, key, value, mask, scaling, dropout, kwargs):
        qpos = token_positions(query, key, kwargs)
        scaling = scaling * self.logit_scale
        if key.shape[-2] - 1 < self.shift:  # no pair in this forward is S or more apart
            return standard_attention(module, query, key, value, mask, scaling, dropout, kwargs)
        # far branch: the query moves back by S - W positions, so distance d reads d - S + W
        shift = torch.full(qpos.shape, float(self.local_window - self.shift), dtype=torch.float64, device=qpos.device)
        return two_branch_attention(query, key, value, mask, qpos=qpos, threshold=self.shift, inv_freq=self.inv_freq(query.device),
                                    scaling=scaling, query_shift=shift)


@dataclass
class SelfExtendPlan(BaselinePlan):
    """Self-Extend: neighbour window ``W`` at standard positions, grouped positions beyond it."""

    group_size: int = 8
    window: int = 1024

    def describe(self) -> dict[str, Any]:
        return {"group_size": self.group_size, "window": self.window}

    def attention(self, module, layer, query, key, value, mask, scaling, dropout, kwargs):
        qpos = token_positions(query, key, kwargs)
        k_len = key.shape[-2]
        if k_len - 1 < self.window:  # every pair inside the neighbour window
            return standard_attention(module, query, key, value, mask, scaling, dropout, kwargs)
        kpos = torch.arange(k_len, device=query.device)
        q_shift = self_extend_positions(qpos, self.group_size, self.window, query=True) - qpos
        k_shift = self_extend_positions(kpos, self.group_size, self.window, query=False) - kpos
        return two_branch_attention(query, key, value, mask, qpos=qpos, threshold=self.window, inv_freq=self.inv_freq(query.device),
                                    scaling=scaling, query_shift=q_shift, key_shift=k_shift)


@dataclass
class MsPoEPlan(BaselinePlan):
    """Ms-PoE: per-KV-group position ratios ``p / r``, chosen per layer from the prompt's last row."""

    min_ratio: float = 1.2
    max_ratio: float = 1.8
    skip_layers: int = 2
    ratios: dict = field(default_factory=dict)  # layer -> [B, n_kv] float64, set during the call

    def reset(self) -> None:
        self.ratios = {}

    def describe(self) -> dict[str, Any]:
        return {"min_ratio": self.min_ratio, "max_ratio": self.max_ratio, "skip_layers": self.skip_layers}

    def _layer_ratios(self, layer: int, query: torch.Tensor, key: torch.Tensor, qpos: torch.Tensor, scaling: float) -> torch.Tensor:
        """Ratios of this layer's KV groups, computed once per call from row ``N - 1``.

        Like the released code, the score reads the attention of the raw (un-rotated)
        query and keys; here they are recovered by rotating back to position 0.
        """
        hit = self.ratios.get(layer)
        if hit is not None:
            return hit
        last = self.num_tokens - 1
        row = last - int(qpos[0])
        if not 0 <= row < query.shape[-2] or key.shape[-2] < self.num_tokens:
            raise RuntimeError(
                f"Ms-PoE orders heads on the prompt's last row (token {last}); the first forward of this call at layer "
                f"{layer} covers tokens {int(qpos[0])}..{int(qpos[-1])}. Run the prompt as one prefill."
            )
        inv = self.inv_freq(query.device)
        q_raw = rotate(query[:, :, row : row + 1].float(), torch.tensor([-float(last)], device=query.device), inv)  # [B, H, 1, d]
        k_raw = rotate(key[:, :, : self.num_tokens].float(), -torch.arange(self.num_tokens, device=query.device, dtype=torch.float64), inv)
        bsz, n_heads, _, dim = q_raw.shape
        n_kv = k_raw.shape[1]
        qg = q_raw.view(bsz, n_kv, n_heads // n_kv, dim)
        logits = torch.matmul(qg, k_raw.transpose(-1, -2)) * (scaling / self.rotary.attention_scaling**2)  # [B, n_kv, R, N]
        weights = torch.softmax(logits, dim=-1)
        scores = position_awareness_scores(weights).mean(dim=-1)  # [B, n_kv]: one score per KV group
        table = ms_poe_ratios(n_kv, self.min_ratio, self.max_ratio)
        out = torch.stack([ms_poe_unit_ratios(s.cpu(), table) for s in scores]).to(query.device)
        self.ratios[layer] = out
        return out

    def attention(self, module, layer, query, key, value, mask, scaling, dropout, kwargs):
        if layer < self.skip_layers:
            return standard_attention(module, query, key, value, mask, scaling, dropout, kwargs)
        qpos = token_positions(query, key, kwargs)
        ratios = self._layer_ratios(layer, query, key, qpos, scaling)  # [B, n_kv]
        n_kv, n_heads = key.shape[1], query.shape[1]
        inv = self.inv_freq(query.device)
        kpos = torch.arange(key.shape[-2], device=query.device, dtype=torch.float64)
        factor = 1.0 / ratios - 1.0  # position p moves to p / r, i.e. by p (1/r - 1)
        k_new = rotate(key.float(), factor[:, :, None] * kpos, inv)
        q_factor = factor.repeat_interleave(n_heads // n_kv, dim=1)  # query head h reads KV group h // R
        q_new = rotate(query.float(), q_factor[:, :, None] * qpos.to(torch.float64), inv)
        out = standard_attention(module, q_new, k_new, value.float(), mask, scaling, dropout, kwargs)
        return out.to(query.dtype)


NO_FLOAT64_DEVICES = ("mps",)  # torch devices without float64 tensors


def build_baseline_plan(method: str, options: Any, *, n_tokens: int, rotary: RotaryInfo, n_layers: int, sliding_window: int | None = None,
                        max_new_tokens: int = 0, device: torch.device | None = None) -> tuple[BaselinePlan | None, dict[str, Any]]:
    """The plan of ``method`` for a prompt of ``n_tokens`` tokens, and its description.

    Returns ``(None, info)`` when the method leaves this prompt exactly as vanilla would
    and says so with a warning (STRING on a prompt so short that ``S <= W``). Raises
    :class:`UnsupportedModelError`, before any forward, on a model with several rotary kinds,
    and when the prompt and ``max_new_tokens`` outgrow a layer's ``sliding_window``
    (:func:`qgpm.hooks.sliding_window_of`): these plans recompute attention over the whole key
    cache, which such a layer's cache no longer holds; and on a ``device`` without float64
    (Apple's MPS), which their rotation angles are computed in.
    """
    if device is not None and torch.device(device).type in NO_FLOAT64_DEVICES:
        raise UnsupportedModelError(
            f"the RoPE baseline {method!r} computes its rotation angles in float64, which the {torch.device(device).type} device "
            "does not have: run it on the CPU or a CUDA GPU (method='qgpm', 'vanilla' and the input-editing methods run there)"
        )
    if rotary.layered:  # these plans re-rotate with one inv_freq for every layer
        raise UnsupportedModelError(
            f"the RoPE baseline {method!r} assumes one rotary embedding for every layer; this model has several "
            f"({', '.join(sorted(rotary.kinds))}, e.g. Gemma 3) and is not supported by it yet"
        )
    if sliding_window is not None and n_tokens + max_new_tokens > sliding_window:
        raise UnsupportedModelError(
            f"the RoPE baseline {method!r} recomputes attention over every cached key, but this model's layers attend within a "
            f"sliding window of {sliding_window} tokens, which the prompt ({n_tokens} tokens) and max_new_tokens={max_new_tokens} "
            f"outgrow: use at most {sliding_window} tokens in all, or method='qgpm' / 'vanilla'"
        )
    common = dict(num_tokens=n_tokens, rotary=rotary, n_layers=n_layers)
    if isinstance(options, StringOptions):
        shift = options.shift_for(n_tokens)
        if options.shift is None and shift <= options.local_window:
            log.warning(
                "STRING: the prompt has %d tokens, so S = %.3f * N = %d <= W = %d and the remapping d -> d - S + W would "
                "bring no distance nearer; answering with standard positions. Pass StringOptions(local_window=...) "
                "below S (or shift=...) to remap short prompts.", n_tokens, options.shift_ratio, shift, options.local_window,
            )
            return None, {"shift": shift, "local_window": options.local_window, "remapped": False}
        plan = StringPlan("string", shift=shift, local_window=options.local_window, logit_scale=options.cos_sin_scale**2, **common)
        return plan, plan.describe()
    if isinstance(options, SelfExtendOptions):
        plan = SelfExtendPlan("self-extend", group_size=options.group_size, window=options.window, **common)
        return plan, plan.describe()
    if isinstance(options, MsPoEOptions):
        if options.skip_layers > n_layers:
            raise ValueError(f"MsPoEOptions.skip_layers={options.skip_layers} exceeds the model's {n_layers} layers")
        plan = MsPoEPlan("ms-poe", min_ratio=options.min_ratio, max_ratio=options.max_ratio, skip_layers=options.skip_layers, **common)
        return plan, plan.describe()
    raise TypeError(f"no RoPE baseline takes options of type {type(options).__name__} (method {method!r})")
