"""Position hooks: a :class:`~qgpm.rope.PositionPlan` on a HuggingFace model for one block.

Llama-style decoders compute ``position_embeddings = (cos, sin)`` once and hand them to
every decoder layer as a keyword argument. :func:`position_hooks` registers a forward
pre-hook on each decoder layer that swaps in the cos/sin of that layer's map (broad below
the split layer, sharp from it on), indexed by the ``position_ids`` of the tokens in the
current forward (prefill, a decode step, or a teacher-forced continuation). Each layer's
KV cache therefore stays in its map's coordinates, and decoding continues in unit steps
from each map's last prompt position. Under ``remap="reorder"`` the hooks also replace each
layer's causal mask with the plan's order.

On a model with several rotary kinds (Gemma 3) only layers of a modulated kind get a hook;
the sliding-window layers keep the model's own cos/sin and positions (``layer_map`` None).
The hooks live only inside the ``with`` block and are removed in ``finally``. This module
reads the plan through the attributes it names in :class:`HookedPlan`; it does not import
the plan's class (``PositionPlan.installed`` calls it).
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Protocol, Sequence

import torch

from .layers import attention_implementation, decoder_layers

__all__ = ["position_hooks", "reorder_mask_kind", "HookedPlan"]


class HookedPlan(Protocol):
    """What the hooks read of a position plan (:class:`qgpm.rope.PositionPlan`)."""

    layer_map: Sequence[int | None]
    orders: Sequence[torch.Tensor]

    def tables(self, map_index: int, position_ids: torch.Tensor, device: torch.device, dtype: torch.dtype,
               need: int | None = None) -> tuple[torch.Tensor, torch.Tensor]: ...

    def causal_mask(self, map_index: int, position_ids: torch.Tensor, num_keys: int, device: torch.device) -> torch.Tensor | None: ...


@contextlib.contextmanager
def position_hooks(model: torch.nn.Module, plan: HookedPlan) -> Iterator[None]:
    """Within the block, every forward of ``model`` uses ``plan``'s positions (and, for a
    reorder plan, its causal order). Take the model lock around it (:func:`qgpm.runtime.apply_plan`)."""
    layers = decoder_layers(model)
    if len(plan.layer_map) != len(layers):
        raise ValueError(f"plan has {len(plan.layer_map)} layer entries, model has {len(layers)} layers")
    mask_kind = reorder_mask_kind(model) if plan.orders else None
    handles = []
    need = [0]  # this installation's own state: how far the tables must reach in the current forward
    gathered: dict = {}  # (map, device, dtype) -> this forward's cos/sin rows, shared by the layers of one map

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
                need[0] = int(pid.max()) + 1
                gathered.clear()
            key = (map_index, hs.device, hs.dtype)
            rows = gathered.get(key)
            if rows is None:  # one gather per map and forward, not one per layer
                rows = gathered[key] = plan.tables(map_index, pid, hs.device, hs.dtype, need=need[0])
            kwargs["position_embeddings"] = rows
            if plan.orders:  # remap="reorder": the causal order follows the moved slots
                given = kwargs.get("attention_mask")  # one mask per attention kind (full, sliding): each is checked
                mkey = ("mask", map_index, hs.device, id(given))
                if mkey not in gathered:
                    gathered[mkey] = _reordered_mask(plan, map_index, pid, given, hs, mask_kind)
                if gathered[mkey] is not None:
                    kwargs["attention_mask"] = gathered[mkey]
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


def sliding_window_of(model: torch.nn.Module) -> int | None:
    """The sliding window some layer of ``model`` attends within, in tokens (``None``: every layer
    attends to the whole prompt up to the model's window). Read from the config:
    ``layer_types`` where it lists the layers' kinds (Qwen2, Gemma 3), else ``sliding_window``
    (Mistral), which counts only when shorter than ``max_position_embeddings``."""
    cfg = getattr(model.config, "text_config", None) or model.config
    window = getattr(cfg, "sliding_window", None)
    kinds = getattr(cfg, "layer_types", None)
    if kinds is not None:
        return int(window) if window and "sliding_attention" in kinds else None
    if not window or getattr(cfg, "use_sliding_window", True) is False:
        return None
    return int(window) if window < (getattr(cfg, "max_position_embeddings", 0) or window + 1) else None


def reorder_mask_kind(model: torch.nn.Module) -> str:
    """How this model's attention reads the custom causal mask of ``remap="reorder"``:
    ``"bool"`` (sdpa) or ``"additive"`` (eager). Raises ``ValueError`` for an attention
    implementation that takes no such mask; the engine calls it before pass 1."""
    impl = attention_implementation(model)
    if impl == "sdpa":
        return "bool"
    if impl == "eager":
        return "additive"
    raise ValueError(
        f"remap='reorder' sets its own causal mask, which the '{impl}' attention implementation does not take; "
        "load the model with attn_implementation='sdpa' (default) or 'eager', set one map on every layer "
        "(split_layer=0 and unmodulated_layers=0: pass 2 then runs the prompt in slot order through the model's own attention), "
        "or use remap='stride'"
    )


def _reordered_mask(plan: HookedPlan, map_index: int, pid: torch.Tensor, given: torch.Tensor | None,
                    hs: torch.Tensor, kind: str | None) -> torch.Tensor | None:
    """The layer's attention mask under the plan's causal order, combined with the model's own
    mask ``given`` (padding, sliding window) where it passed one; ``None`` = keep ``given``."""
    if pid.shape[0] != 1:
        raise ValueError(f"remap='reorder' runs one sequence per call, got a batch of {pid.shape[0]}")
    num_keys = int(given.shape[-1]) if isinstance(given, torch.Tensor) else int(pid.max()) + 1
    order = plan.causal_mask(map_index, pid, num_keys, hs.device)
    if order is None:
        return None
    if isinstance(given, torch.Tensor):
        # The model's mask is the text-order causal mask; the reorder replaces it. Anything
        # else in it (padding, a sliding window shorter than the prompt) has no meaning in the
        # moved order, so it is refused instead of being dropped.
        allowed = given if given.dtype == torch.bool else given > torch.finfo(given.dtype).min / 2
        q = pid.reshape(-1, 1).to(given.device)
        text_causal = torch.arange(num_keys, device=given.device).reshape(1, -1) <= q
        if allowed.shape[-2:] != text_causal.shape or not bool((allowed == text_causal).all()):
            raise ValueError(
                "remap='reorder' replaces the causal mask, but this forward's mask also masks other tokens "
                "(padding, or a sliding window shorter than the prompt); run one unpadded sequence on a model "
                "without a sliding window, or use remap='stride'"
            )
        if given.dtype == torch.bool:
            return order
        # on the layer's device (order's): with device_map over several GPUs the model's one mask
        # stays on the first, and torch.where takes a 0-dim tensor from another device only from the CPU
        return torch.where(order, torch.zeros((), dtype=given.dtype, device=order.device), torch.finfo(given.dtype).min)
    if kind == "bool":
        return order
    zero = torch.zeros((), dtype=hs.dtype, device=hs.device)
    return torch.where(order, zero, torch.finfo(hs.dtype).min)
