"""Applying a position plan to a HuggingFace model for one call (pass 2 and decoding).

Llama-style decoders compute ``position_embeddings = (cos, sin)`` once and hand them to
every decoder layer as a keyword argument. :func:`apply_plan` registers a forward
pre-hook on each decoder layer that swaps in the cos/sin of that layer's map (broad below
the split layer, sharp from it on), indexed by the ``position_ids`` of the tokens in the
current forward (prefill, a decode step, or a teacher-forced continuation). Each layer's
KV cache therefore stays in its map's coordinates, and decoding continues in unit steps
from each map's last prompt position.

The hooks live only inside the ``with`` block and are removed in ``finally``: after any
call, including one that raised, the model is exactly the unpatched model. A per-model
re-entrant lock serializes calls, so two threads never mix their plans.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator, Sequence

import torch

from .positions import positions_at, rope_angles, rope_tables

if TYPE_CHECKING:  # pragma: no cover
    from .baselines.plans import BaselinePlan

__all__ = [
    "SUPPORTED_FAMILIES",
    "UnsupportedModelError",
    "RotaryInfo",
    "rotary_info",
    "check_supported",
    "decoder_layers",
    "model_lock",
    "PositionPlan",
    "apply_plan",
]

SUPPORTED_FAMILIES: tuple[str, ...] = ("llama", "mistral", "qwen2", "qwen3", "granite")
_SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


class UnsupportedModelError(ValueError):
    """The model family or its RoPE variant is not supported by QGPM."""


_LOCKS: "weakref.WeakKeyDictionary[torch.nn.Module, threading.RLock]" = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


def model_lock(model: torch.nn.Module) -> threading.RLock:
    """The re-entrant lock that serializes QGPM calls on ``model``."""
    with _LOCKS_GUARD:
        lock = _LOCKS.get(model)
        if lock is None:
            lock = threading.RLock()
            _LOCKS[model] = lock
        return lock


def decoder_layers(model: torch.nn.Module) -> Sequence[torch.nn.Module]:
    base = getattr(model, "base_model", model)
    layers = getattr(base, "layers", None)
    if layers is None:
        raise UnsupportedModelError(f"{type(model).__name__} has no decoder layer list at model.base_model.layers")
    return layers


def check_supported(model: torch.nn.Module) -> None:
    """Raise :class:`UnsupportedModelError` naming the family unless QGPM supports it."""
    family = getattr(model.config, "model_type", type(model).__name__)
    if family not in SUPPORTED_FAMILIES:
        raise UnsupportedModelError(
            f"model family '{family}' ({type(model).__name__}) is not supported by QGPM. Supported: "
            f"{', '.join(SUPPORTED_FAMILIES)} (Llama-style decoders with full rotate-half RoPE passed to "
            "each layer as position_embeddings). Families with local/global RoPE bases (Gemma 3), partial "
            "rotary, ALiBi or no RoPE need an adapter; method='vanilla' is not affected."
        )
    info = rotary_info(model)
    if info.rope_type not in _SUPPORTED_ROPE_TYPES:
        raise UnsupportedModelError(
            f"RoPE type '{info.rope_type}' of this {family} model is not supported (frequencies change with "
            f"sequence length); supported RoPE types: {', '.join(_SUPPORTED_ROPE_TYPES)}"
        )


@dataclass(frozen=True)
class RotaryInfo:
    inv_freq: torch.Tensor  # [d/2] float32, cpu
    attention_scaling: float
    rope_type: str
    head_dim: int


def rotary_info(model: torch.nn.Module) -> RotaryInfo:
    """The model's own rotary frequencies (scaling folded in) and attention scaling."""
    base = getattr(model, "base_model", model)
    rot = getattr(base, "rotary_emb", None)
    if rot is None or not hasattr(rot, "inv_freq"):
        raise UnsupportedModelError(f"{type(model).__name__} has no rotary_emb.inv_freq (not a RoPE model?)")
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    inv = rot.inv_freq.detach().float().cpu()
    if inv.numel() * 2 != head_dim:
        raise UnsupportedModelError(
            f"partial rotary embeddings ({inv.numel() * 2} of {head_dim} dims) are not supported"
        )
    return RotaryInfo(inv, float(getattr(rot, "attention_scaling", 1.0)), str(getattr(rot, "rope_type", "default")), head_dim)


@dataclass
class PositionPlan:
    """Per-plane positions of each map for one prompt, and which layer uses which map.

    ``positions[k]`` is ``[d/2, N]`` (float64) for map ``k``; ``layer_map[l]`` is the map
    index used by decoder layer ``l``, or ``None`` for a layer that keeps the model's
    standard positions (no hook).
    """

    positions: list[torch.Tensor]
    layer_map: list[int | None]
    rotary: RotaryInfo
    capacity: int = 0  # token indices to build tables for up front (prompt + generation budget)
    _tables: dict = field(default_factory=dict, repr=False)
    _need: int = field(default=0, repr=False)

    @property
    def num_tokens(self) -> int:
        return int(self.positions[0].shape[1])

    def full_tables(self, map_index: int, device: torch.device, dtype: torch.dtype, need: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ``[T, d]`` for token indices ``0..T-1`` (``T >= need``), built on ``device``.

        Built once per (map, device, dtype) and reused by every layer and decode step;
        rebuilt longer only if generation runs past the planned capacity.
        """
        key = (map_index, str(device), dtype)
        hit = self._tables.get(key)
        if hit is not None and hit[0].shape[0] >= need:
            return hit
        length = max(need, self.capacity, self.num_tokens + 64)
        idx = torch.arange(length)
        pos = positions_at(self.positions[map_index], idx)  # [planes, T] float64
        angles = rope_angles(pos.to(device), self.rotary.inv_freq.to(device))  # [T, planes] float32
        out = rope_tables(angles, attention_scaling=self.rotary.attention_scaling, dtype=dtype)
        self._tables[key] = out
        return out

    def tables(self, map_index: int, position_ids: torch.Tensor, device: torch.device, dtype: torch.dtype, need: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ``[B, S, d]`` for the tokens at ``position_ids`` (token indices), on ``device``."""
        if need is None:
            need = int(position_ids.max()) + 1
        cos, sin = self.full_tables(map_index, device, dtype, need)
        pid = position_ids.to(cos.device)
        return cos[pid], sin[pid]


@contextlib.contextmanager
def apply_plan(model: torch.nn.Module, plan: "PositionPlan | BaselinePlan | None") -> Iterator[None]:
    """Within the block, every forward of ``model`` uses ``plan``'s positions.

    ``plan=None`` only takes the model lock (vanilla behaviour). Hooks are removed on
    exit, whatever happened inside. An attention-level plan of a RoPE baseline
    (:class:`qgpm.baselines.BaselinePlan`) installs itself through its ``installed``
    context instead, under the same lock.
    """
    lock = model_lock(model)
    with lock:
        if plan is None:
            yield
            return
        if not isinstance(plan, PositionPlan):
            with plan.installed(model):
                yield
            return
        layers = decoder_layers(model)
        if len(plan.layer_map) != len(layers):
            raise ValueError(f"plan has {len(plan.layer_map)} layer entries, model has {len(layers)} layers")
        handles = []

        def make_hook(map_index: int, first: bool):
            def hook(module, args, kwargs):
                pid = kwargs.get("position_ids")
                if pid is None:
                    raise RuntimeError(
                        "QGPM needs position_ids in decoder-layer calls; this transformers version does not pass them"
                    )
                hs = args[0] if args else kwargs["hidden_states"]
                if pid.ndim == 1:
                    pid = pid.unsqueeze(0)
                if first:  # one host sync per forward: how far the tables must reach
                    plan._need = int(pid.max()) + 1
                kwargs["position_embeddings"] = plan.tables(map_index, pid, hs.device, hs.dtype, need=plan._need)
                return args, kwargs

            return hook

        first_hooked = next((i for i, m in enumerate(plan.layer_map) if m is not None), None)
        try:
            for i, (layer, map_index) in enumerate(zip(layers, plan.layer_map)):
                if map_index is None:
                    continue
                handles.append(layer.register_forward_pre_hook(make_hook(map_index, i == first_hooked), with_kwargs=True))
            yield
        finally:
            for h in handles:
                h.remove()
