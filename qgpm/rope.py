"""RoPE in one place: the model's rotary frequencies, rotation tables and position plans.

Pure torch, no transformers; the layer hooks that install a plan are in :mod:`qgpm.hooks`.

- :func:`head_geometry` / :func:`rotary_info`: a model's head layout and its own rotary
  frequencies ``w_m`` (``rotary_emb.inv_freq``, scaling folded in) as :class:`RotaryInfo`.
- :func:`rope_angles` -> :func:`rope_tables`: per-plane positions to rotate-half cos/sin
  tables, bit-identical to HF's rotary embedding for integer positions.
- :func:`rotate_half` / :func:`apply_rope`: rotating query/key vectors with such tables.
- :class:`PositionPlan`: per-plane positions of each map for one prompt (what
  :func:`qgpm.plan.build_plan` returns and :func:`qgpm.runtime.apply_plan` installs), with
  the cos/sin tables it hands to each decoder layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager

import torch

from .hooks import position_hooks
from .layers import UnsupportedModelError
from .positions import positions_at

__all__ = [
    "UnsupportedModelError",
    "RotaryInfo",
    "head_geometry",
    "rotary_info",
    "LiveRotary",
    "rope_angles",
    "rope_tables",
    "rotate_half",
    "apply_rope",
    "PositionPlan",
]




@dataclass(frozen=True)
class RotaryInfo:
    """A model's rotary embedding: what position remapping needs to know about it.

    ``inv_freq``: ``[d/2]`` float32 angular frequencies ``w_m`` on the cpu (plane 0 is the
    fastest; linear / llama3 / yarn scaling already folded in); ``attention_scaling``: the
    factor HF multiplies cos/sin by; ``rope_type``: HF's name of the RoPE variant;
    ``head_dim``: ``d``, the per-head dimension (every dimension is rotated).

    Models whose layers use different rotary embeddings (Gemma 3: sliding-window "local"
    layers with base 10,000, "global" full-attention layers with base 1,000,000 and its
    scaling) set ``layer_kinds`` (the kind of each decoder layer, HF's ``layer_types``) and
    ``kinds`` (a one-kind ``RotaryInfo`` per kind). ``modulated_kinds`` names the kinds
    QGPM remaps; layers of the other kinds keep their standard positions. The top-level
    fields are then those of the first modulated kind (the global layers of Gemma 3).
    """

    inv_freq: torch.Tensor  # [d/2] float32, cpu
    attention_scaling: float
    rope_type: str
    head_dim: int
    layer_kinds: tuple[str, ...] | None = None
    kinds: dict[str, "RotaryInfo"] = field(default_factory=dict, compare=False, repr=False)
    modulated_kinds: tuple[str, ...] = ()

    @property
    def layered(self) -> bool:
        """True when the decoder layers use more than one rotary kind (Gemma 3)."""
        return self.layer_kinds is not None

    def kind_of(self, layer: int) -> str | None:
        """The rotary kind of decoder layer ``layer`` (``None`` for a one-kind model)."""
        return None if self.layer_kinds is None else self.layer_kinds[layer]

    def for_kind(self, kind: str | None) -> "RotaryInfo":
        """The one-kind :class:`RotaryInfo` of ``kind`` (``self`` for ``None``)."""
        return self if kind is None else self.kinds[kind]


def head_geometry(config: Any) -> tuple[int, int, int]:
    """``(n_heads, n_kv_heads, head_dim)`` of a HF model config.

    ``head_dim`` is the config's own ``head_dim`` when it sets one, else
    ``hidden_size // num_attention_heads``; ``n_kv_heads`` defaults to ``n_heads`` (no GQA).
    """
    n_heads = config.num_attention_heads
    n_kv = getattr(config, "num_key_value_heads", None) or n_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // n_heads
    return n_heads, n_kv, head_dim


def rotary_info(model: torch.nn.Module) -> RotaryInfo:
    """The model's own rotary frequencies (scaling folded in) and attention scaling.

    Raises :class:`UnsupportedModelError` for a model without ``rotary_emb.inv_freq`` or
    with partial rotary embeddings (fewer rotated dimensions than ``head_dim``). A model
    with one rotary embedding per layer kind (Gemma 3's ``rotary_emb.<kind>_inv_freq`` with
    ``config.layer_types``) gets a layered :class:`RotaryInfo` (see there).
    """
    base = getattr(model, "base_model", model)
    rot = getattr(base, "rotary_emb", None)
    if rot is not None and not hasattr(rot, "inv_freq") and getattr(model.config, "layer_types", None) and hasattr(rot, "rope_type") and isinstance(rot.rope_type, dict):
        return _layered_rotary_info(model, rot)
    if rot is None or not hasattr(rot, "inv_freq"):
        raise UnsupportedModelError(f"{type(model).__name__} has no rotary_emb.inv_freq (not a RoPE model?)")
    head_dim = head_geometry(model.config)[2]
    inv = rot.inv_freq.detach().float().cpu()
    if inv.numel() * 2 != head_dim:
        raise UnsupportedModelError(
            f"partial rotary embeddings ({inv.numel() * 2} of {head_dim} dims) are not supported"
        )
    return RotaryInfo(inv, float(getattr(rot, "attention_scaling", 1.0)), str(getattr(rot, "rope_type", "default")), head_dim)


class LiveRotary:
    """:func:`rotary_info` of ``model``, read again whenever the model's rotary buffers were
    replaced since the last reading: ``model.to(torch.bfloat16)`` or ``.half()`` after the
    engine was built rounds HF's ``inv_freq``, and the model then rotates with the rounded
    frequencies, so plans must too (an identity plan stays the unmodified model). Checking is
    an identity test on a few buffers; ``widen`` is applied to each reading."""

    def __init__(self, model: torch.nn.Module, widen: Callable[[RotaryInfo], RotaryInfo] = lambda info: info) -> None:
        self.model, self.widen = model, widen
        self._read_from, self._info = self._buffers(), widen(rotary_info(model))

    def _buffers(self) -> tuple[torch.Tensor, ...]:
        rot = getattr(getattr(self.model, "base_model", self.model), "rotary_emb", None)
        return tuple(rot.buffers()) if rot is not None else ()

    def current(self) -> RotaryInfo:
        """The model's rotary info now."""
        now = self._buffers()
        if len(now) != len(self._read_from) or any(a is not b for a, b in zip(now, self._read_from)):
            self._info, self._read_from = self.widen(rotary_info(self.model)), now
        return self._info


# The rotary kinds QGPM remaps on a model with several (see RotaryInfo); layers of any other
# kind keep standard positions. Gemma 3's sliding-window layers ("sliding_attention") are left
# vanilla: their window (512 / 1,024 tokens) already bounds every distance they can see, so
# bringing far evidence nearer cannot help there, and their KV cache keeps standard positions.
MODULATED_KINDS: tuple[str, ...] = ("full_attention",)


def _layered_rotary_info(model: torch.nn.Module, rot: Any) -> RotaryInfo:
    """:class:`RotaryInfo` of a model with one rotary embedding per layer kind (Gemma 3)."""
    head_dim = head_geometry(model.config)[2]
    layer_kinds = tuple(str(k) for k in model.config.layer_types)
    kinds: dict[str, RotaryInfo] = {}
    for kind in sorted(set(layer_kinds)):
        inv = getattr(rot, f"{kind}_inv_freq", None)
        if inv is None:
            raise UnsupportedModelError(f"{type(model).__name__}'s rotary_emb has no {kind}_inv_freq (layer kind {kind!r})")
        inv = inv.detach().float().cpu()
        if inv.numel() * 2 != head_dim:
            raise UnsupportedModelError(f"partial rotary embeddings ({inv.numel() * 2} of {head_dim} dims) are not supported")
        scaling = float(getattr(rot, f"{kind}_attention_scaling", 1.0))
        kinds[kind] = RotaryInfo(inv, scaling, str(rot.rope_type.get(kind, "default")), head_dim)
    modulated = tuple(k for k in MODULATED_KINDS if k in kinds)
    if not modulated:
        raise UnsupportedModelError(
            f"{type(model).__name__} has layer kinds {sorted(kinds)}; QGPM remaps only {', '.join(MODULATED_KINDS)} layers"
        )
    top = kinds[modulated[0]]
    return RotaryInfo(top.inv_freq, top.attention_scaling, top.rope_type, head_dim, layer_kinds=layer_kinds, kinds=kinds, modulated_kinds=modulated)


def rope_angles(positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotation angle ``w_m * p'_{m,j}`` in float32, shape ``[..., planes]`` (planes last).

    ``positions`` is ``[planes, *shape]``. Computed in float32 exactly like HF's rotary
    embedding does (``position.float() * inv_freq.float()``), so integer positions give
    bit-identical angles to the unmodified model.
    """
    p = positions.to(torch.float32)
    p = p.permute(*range(1, p.ndim), 0)  # [..., planes]
    return p * inv_freq.detach().to(device=p.device, dtype=torch.float32)


def rope_tables(angles: torch.Tensor, *, attention_scaling: float = 1.0, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables in rotate-half layout (plane m in dims m and m + d/2), cast to ``dtype``.

    Built in float32, multiplied by the model's ``attention_scaling``, then cast.
    """
    emb = torch.cat((angles, angles), dim=-1)
    cos = emb.cos() * attention_scaling
    sin = emb.sin() * attention_scaling
    return cos.to(dtype), sin.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[-x2, x1]`` for the rotate-half layout (plane ``m`` in dims ``m`` and ``m + d/2``)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` (``[..., T, d]``) with rotate-half tables ``cos``/``sin`` (``[T, d]``)."""
    return x * cos + rotate_half(x) * sin


@dataclass(frozen=True)
class PositionPlan:
    """Per-plane positions of each map for one prompt, and which layer uses which map.

    ``positions[k]`` is ``[d/2, N]`` (float64) for map ``k``; ``layer_map[l]`` is the map
    index used by decoder layer ``l``, or ``None`` for a layer that keeps the model's
    standard positions (no hook). On a model with several rotary kinds (Gemma 3) there is
    one table set per (modulated kind, map): ``positions[2 * i + k]`` is map ``k`` (0 broad,
    1 sharp) of the ``i``-th modulated kind, rotated with ``table_rotary[2 * i + k]``;
    with one kind ``table_rotary`` is empty and every table set uses ``rotary``.
    ``capacity``: how many token indices (prompt plus generation budget) to build the
    cos/sin tables for up front. ``orders`` (``remap="reorder"`` only, else empty): per
    map, the slot ``pi[j]`` of each prompt token in the causal order pass 2 follows (a
    token attends to the tokens whose slot is not later than its own; generated tokens
    come after every slot); see :meth:`causal_mask`.

    The plan does not change once built (:func:`qgpm.plan.build_plan` takes the capacity);
    it only caches the cos/sin tables it has computed, per map, device and dtype, so every
    layer and decode step reuses them. What one installation needs per forward is kept by
    the hooks of :meth:`installed` (:mod:`qgpm.hooks`), not by the plan.
    """

    positions: list[torch.Tensor]
    layer_map: list[int | None]
    rotary: RotaryInfo
    capacity: int = 0
    table_rotary: tuple[RotaryInfo, ...] = ()
    orders: tuple[torch.Tensor, ...] = ()
    _tables: dict = field(default_factory=dict, repr=False, compare=False)

    def installed(self, model: torch.nn.Module) -> ContextManager[None]:
        """This plan's layer hooks on ``model`` for the length of a block (:func:`qgpm.hooks.position_hooks`;
        :func:`qgpm.runtime.apply_plan` enters it under the model lock)."""
        return position_hooks(model, self)

    def rotary_of(self, map_index: int) -> RotaryInfo:
        """The one-kind rotary embedding the tables of ``positions[map_index]`` rotate with."""
        return self.table_rotary[map_index] if self.table_rotary else self.rotary

    @property
    def num_tokens(self) -> int:
        """``N``, the number of prompt tokens the plan covers."""
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
        rot = self.rotary_of(map_index)
        angles = rope_angles(pos.to(torch.float32).to(device), rot.inv_freq.to(device))  # [T, planes] float32 (no float64 on the device: MPS has none)
        out = rope_tables(angles, attention_scaling=rot.attention_scaling, dtype=dtype)
        self._tables[key] = out
        return out

    def is_standard(self) -> bool:
        """``True`` when the plan changes nothing: no reorder, and every layer either keeps
        the model's standard positions or reads a map whose positions are ``0..N-1`` on
        every plane (what a call that falls back to vanilla positions builds). Pass 2 then
        is the model's plain forward."""
        if self.orders:
            return False
        std = torch.arange(self.num_tokens, dtype=torch.float64).reshape(1, -1)
        used = {int(m) for m in self.layer_map if m is not None}
        return all(torch.equal(self.positions[m], std.to(self.positions[m].dtype).expand_as(self.positions[m])) for m in used)

    def vanilla_prefix(self) -> int:
        """How many leading prompt tokens pass 2 computes exactly as a vanilla prefill does:
        ``N`` for a standard plan, for a plan fed in slot order the tokens before the first one
        that moves (they keep their place and see only tokens that keep theirs), else 0."""
        if self.is_standard():
            return self.num_tokens
        order = self.feed_order()
        if order is None:
            return 0
        moved = (order != torch.arange(order.numel())).nonzero()
        return int(moved[0]) if moved.numel() else self.num_tokens

    def feed_order(self) -> torch.Tensor | None:
        """The token order that turns pass 2 into a plain forward, or ``None``.

        When every decoder layer reads one ``remap="reorder"`` map (the same ``pi`` on every
        layer, positions equal to the slots on every plane), pass 2 computes exactly what the
        model computes on the prompt fed in slot order with standard positions:
        ``input_ids[:, order]``, where ``order[s]`` is the token that takes slot ``s``.
        Feeding it so runs the model's own causal attention (no ``[N, N]`` mask, no hooks,
        any attention implementation); generated tokens come after every slot either way.
        ``None`` when there is no reorder, when layers read different orders, or when some
        layers keep standard positions (``layer_map`` entry ``None``): those plans need
        the per-layer masks of :func:`qgpm.hooks.position_hooks`. Layered plans (one table set
        per rotary kind, Gemma 3) qualify too: each layer applies its own rotary to the
        standard positions of the slot order, and sliding windows apply over that order.
        """
        if not self.orders or any(m is None for m in self.layer_map):
            return None
        used = sorted({int(m) for m in self.layer_map if m is not None})
        if not used:
            return None
        pi = self.orders[used[0]]
        slots = pi.to(torch.float64).reshape(1, -1)
        for m in used:  # every used map's positions are pi's slots on every plane (so its order is pi too)
            if not torch.equal(self.positions[m], slots.to(self.positions[m].dtype).expand_as(self.positions[m])):
                return None
        return torch.argsort(pi)

    def causal_mask(self, map_index: int, position_ids: torch.Tensor, num_keys: int, device: torch.device) -> torch.Tensor | None:
        """``[1, 1, S, K]`` bool (True = may attend) for queries at token indices
        ``position_ids`` (``[1, S]``) over the keys ``0..K-1``, in the causal order of
        ``orders[map_index]``; ``None`` where that order is the text order for every query
        (no ``orders``, or every query after the prompt's reordered part)."""
        if not self.orders:
            return None
        pi = self.orders[map_index].to(device)
        pid = position_ids.reshape(-1).to(device=device, dtype=torch.long)
        n = pi.numel()
        if int(pid.min()) >= n or num_keys <= 0:
            return None
        if int(pid.max()) >= num_keys:
            raise ValueError(f"query index {int(pid.max())} has no key (only {num_keys} keys)")
        keys = torch.arange(num_keys, device=device)  # built where attention runs: no [S, K] host-to-device copy
        slot_k = torch.where(keys < n, pi[keys.clamp(max=n - 1)], keys)
        slot_q = torch.where(pid < n, pi[pid.clamp(max=n - 1)], pid)
        return (slot_k.reshape(1, -1) <= slot_q.reshape(-1, 1)).reshape(1, 1, pid.numel(), num_keys)

    def tables(self, map_index: int, position_ids: torch.Tensor, device: torch.device, dtype: torch.dtype, need: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ``[B, S, d]`` for the tokens at ``position_ids`` (token indices), on ``device``.

        ``need``: how far the tables must reach (default: the largest index + 1).
        """
        if need is None:
            need = int(position_ids.max()) + 1
        cos, sin = self.full_tables(map_index, device, dtype, need)
        pid = position_ids.to(cos.device)
        return cos[pid], sin[pid]
