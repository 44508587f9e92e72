"""Attention-level machinery of the RoPE baselines, registered through transformers'
``AttentionInterface`` (no modeling file is patched).

For one call, :func:`installed` registers :func:`baseline_attention` under
:data:`ATTENTION_NAME`, points every decoder layer's attention module at the call's plan,
and switches the model to that implementation with ``model.set_attn_implementation``.
On exit (also after an exception) the plan is detached and the model's own
implementation (eager, sdpa, flash, ...) is restored exactly.

The attention function receives the query and key already rotated at their standard
positions ``p`` (and the cached keys likewise). RoPE rotations compose, so moving a
vector to position ``p'`` is one more rotation by ``p' - p`` (:func:`rotate`); the KV
cache keeps standard positions and every decode step works from it.

Two-branch methods (STRING, Self-Extend) attend to disjoint key sets in their two
branches, so the log-sum-exp merge of the branches (:func:`attention_lse`,
:func:`merge_by_lse`, kept as the reference statement of the math) is one softmax over
the union: :func:`two_branch_attention` runs it as one fused
``scaled_dot_product_attention`` per block of query rows over the concatenated near and
far keys, in float32. Wherever a call needs only standard attention (a layer Ms-PoE
leaves alone, or no pair reaching the remapped range), the work goes to transformers'
own ``sdpa_attention_forward``.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from ..rope import apply_rope, rotate_half
from ..layers import attention_switched
from ..runtime import UnsupportedModelError, decoder_layers

__all__ = [
    "ATTENTION_NAME",
    "register_attention",
    "baseline_attention",
    "installed",
    "active_plans",
    "rotate_half",
    "rotate",
    "token_positions",
    "attention_lse",
    "merge_by_lse",
    "two_branch_attention",
    "standard_attention",
]

ATTENTION_NAME = "qgpm_baseline"
"""The name :func:`baseline_attention` is registered under in ``AttentionInterface``."""

_ACTIVE: dict[int, tuple[Any, int]] = {}  # id(attention module) -> (plan, layer index), only inside a call
_REGISTERED = False
_REGISTER_LOCK = threading.Lock()
_BLOCK_ELEMENTS = 1 << 25  # bound on (query rows x heads x 2K) per block of the two-branch attention
_BLOCK_ROWS = 256  # and on its query rows: smaller blocks skip more of the causally masked keys (measured on CPU)
_SDPA_GQA = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 5)  # scaled_dot_product_attention(enable_gqa=)


def register_attention() -> None:
    """Register :func:`baseline_attention` (with sdpa's mask builder) once per process."""
    global _REGISTERED
    with _REGISTER_LOCK:
        if _REGISTERED:
            return
        # heavy: transformers' modeling_utils and masking_utils (about 2.5 s here), only once a baseline runs
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask  # heavy: as above

        AttentionInterface.register(ATTENTION_NAME, baseline_attention)
        # sdpa's mask builder: None for a plain causal prompt, else a boolean mask (padding,
        # sliding window) that the plans AND into their own causal masks.
        AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
        _REGISTERED = True


def active_plans() -> int:
    """How many attention modules are attached to a plan right now (0 outside calls)."""
    return len(_ACTIVE)


def baseline_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                       **kwargs: Any) -> tuple[torch.Tensor, None]:
    """The function behind ``attn_implementation="qgpm_baseline"``: hands the layer's
    query / key / value to the plan of the running call."""
    entry = _ACTIVE.get(id(module))
    if entry is None:
        raise RuntimeError(
            f"attn_implementation={ATTENTION_NAME!r} is only valid inside a qgpm call (engine.answer / generate_prepared "
            f"with a RoPE baseline method); this {type(module).__name__} has no active plan. Switch the model back with "
            "model.set_attn_implementation('sdpa') or 'eager'."
        )
    plan, layer = entry
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    return plan.attention(module, layer, query, key, value, attention_mask, float(scaling), float(dropout), kwargs), None


def _implementation_owners(model: torch.nn.Module) -> list[Any]:
    """Every config whose attention implementation the switch may touch (model, submodels, sub-configs)."""
    seen: dict[int, Any] = {}
    stack = [m.config for m in model.modules() if hasattr(getattr(m, "config", None), "_attn_implementation_internal")]
    while stack:
        cfg = stack.pop()
        if id(cfg) in seen:
            continue
        seen[id(cfg)] = cfg
        for name in getattr(cfg, "sub_configs", {}) or {}:
            sub = getattr(cfg, name, None)
            if hasattr(sub, "_attn_implementation_internal"):
                stack.append(sub)
    return list(seen.values())


@contextlib.contextmanager
def installed(model: torch.nn.Module, plan: Any) -> Iterator[None]:
    """Within the block, every attention layer of ``model`` runs ``plan.attention``.

    Call it with the model lock held (:func:`qgpm.runtime.apply_plan` does). The model's
    attention implementation is restored on exit, whatever happened inside.
    """
    register_attention()
    modules = []
    for i, layer in enumerate(decoder_layers(model)):
        attn = getattr(layer, "self_attn", None)
        if attn is None:
            raise UnsupportedModelError(f"decoder layer {i} of {type(model).__name__} has no self_attn module")
        modules.append(attn)
    owners = _implementation_owners(model)
    saved = [(cfg, cfg._attn_implementation_internal) for cfg in owners]
    with attention_switched(model):  # other threads' checks keep reading the model's own implementation
        try:
            for i, attn in enumerate(modules):
                _ACTIVE[id(attn)] = (plan, i)
            plan.reset()
            model.set_attn_implementation(ATTENTION_NAME)
            if getattr(model.config, "_attn_implementation", None) != ATTENTION_NAME:
                raise UnsupportedModelError(
                    f"{type(model).__name__} does not let its attention implementation be switched at run time "
                    "(transformers' AttentionInterface), which the RoPE baselines need"
                )
            yield
        finally:
            for attn in modules:
                _ACTIVE.pop(id(attn), None)
            for cfg, value in saved:
                cfg._attn_implementation_internal = value


# ----------------------------------------------------------------------------- rotations


def rotate(x: torch.Tensor, delta: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Move rotate-half RoPE vectors ``x`` ``[..., T, d]`` by ``delta`` positions.

    ``delta`` broadcasts against ``x[..., 0]`` (``[..., T]``); angles are built in float64.
    A vector rotated at position ``p`` and moved by ``delta`` is the vector rotated at
    ``p + delta`` (the model's attention scaling, a constant factor, is kept).
    """
    ang = delta.to(torch.float64).unsqueeze(-1) * inv_freq.to(device=delta.device, dtype=torch.float64)
    cos = torch.cat((ang.cos(), ang.cos()), dim=-1).to(x.dtype)
    sin = torch.cat((ang.sin(), ang.sin()), dim=-1).to(x.dtype)
    return apply_rope(x, cos, sin)


def token_positions(query: torch.Tensor, key: torch.Tensor, kwargs: dict) -> torch.Tensor:
    """Token indices of the query rows, ``[q]`` (int64): the last ``q`` of the ``K`` keys.

    The baselines assume the cache holds every token from index 0 (one sequence or
    sequences of equal length: no left padding, no sliding-window cache); anything else
    is an error, never a silent misplacement.
    """
    q_len, k_len = query.shape[-2], key.shape[-2]
    expect = torch.arange(k_len - q_len, k_len, device=query.device)
    pid = kwargs.get("position_ids")
    if pid is not None:
        pid = pid.reshape(-1, pid.shape[-1]).to(query.device)
        if pid.shape[-1] != q_len or not bool((pid == expect).all()):
            raise UnsupportedModelError(
                "the RoPE baselines need position_ids 0..K-1 matching the key cache (no left padding, no "
                f"sliding-window cache); got {q_len} query positions {pid[0, :1].tolist()}..{pid[0, -1:].tolist()} "
                f"over {k_len} keys"
            )
    return expect


# ----------------------------------------------------------------------------- attention math


def _allowed_from_mask(mask: torch.Tensor | None) -> torch.Tensor | None:
    """transformers' mask as ``True`` = may attend, ``[B, 1, q, K]`` (or None)."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        return mask
    return mask > torch.finfo(mask.dtype).min / 2  # additive float mask: 0 = attend, dtype min = masked


def attention_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked softmax attention that also returns the log-sum-exp of each row (the
    explicit form of one branch; :func:`two_branch_attention` fuses both branches instead).

    ``q`` ``[B, Hkv, R, q, d]`` (the ``R`` query heads of each KV head), ``k``/``v``
    ``[B, Hkv, K, d]``, ``allowed`` broadcastable to ``[B, Hkv, R, q, K]``. Returns the
    output ``[B, Hkv, R, q, d]`` and ``lse`` ``[B, Hkv, R, q]``; a row with no allowed key
    has output 0 and ``lse = -inf`` (it then weighs nothing in :func:`merge_by_lse`).
    """
    logits = torch.matmul(q, k.unsqueeze(2).transpose(-1, -2)) * scaling
    logits = logits.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)
    probs = torch.exp(logits - lse.unsqueeze(-1)).nan_to_num(0.0)
    return torch.matmul(probs, v.unsqueeze(2)), lse


def merge_by_lse(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two softmax attentions over disjoint key sets into the softmax over their union:
    ``out = w_a out_a + w_b out_b`` with ``w_x = exp(lse_x - logaddexp(lse_a, lse_b))``."""
    lse = torch.logaddexp(lse_a, lse_b)
    w_a = torch.exp(lse_a - lse).nan_to_num(0.0).unsqueeze(-1)
    w_b = torch.exp(lse_b - lse).nan_to_num(0.0).unsqueeze(-1)
    return out_a * w_a + out_b * w_b, lse


def two_branch_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    qpos: torch.Tensor,
    threshold: int,
    inv_freq: torch.Tensor,
    scaling: float,
    query_shift: torch.Tensor,
    key_shift: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention where pairs at distance ``d < threshold`` keep standard positions (near
    branch) and pairs at ``d >= threshold`` use moved positions (far branch: query moved
    by ``query_shift[r]``, key by ``key_shift[j]``), as one softmax over both branches.

    ``query`` ``[B, H, q, d]`` and ``key``/``value`` ``[B, Hkv, K, d]`` as the attention
    module passes them (rotated at standard positions). Returns ``[B, q, H, d]`` in the
    query's dtype.

    The near and far keys of a row are disjoint, so the softmax over their union is the
    log-sum-exp merge of the two branches (:func:`merge_by_lse`); it is computed as one
    fused ``scaled_dot_product_attention`` per block of query rows over the concatenated
    keys ``[near keys ; far keys]`` (values ``[v ; v]``), with a boolean mask that lets
    the near part through at ``0 <= d < threshold`` and the far part at ``d >= threshold``
    (AND the model's own mask). When ``query_shift`` is the same for every row (STRING),
    the query's move is folded into the far keys (``<R(a) q, k> = <q, R(-a) k>``); when it
    varies per row (Self-Extend), queries and keys are concatenated along the head dim,
    ``[q ; R(shift) q]`` against ``[k ; 0]`` (near) and ``[0 ; k_far]`` (far), so each
    branch's logit is one dot product (values padded to ``2d``, the output cut back to
    ``d``). ``scale`` is passed explicitly (the default would read ``1/sqrt(2d)``).
    Work is in float32 whatever the model's dtype (as before: the exactness tests compare
    with a float64 reference at 2e-5), in blocks of at most :data:`_BLOCK_ROWS` query rows
    (fewer when ``rows x H x 2K`` would exceed :data:`_BLOCK_ELEMENTS`) that only read the
    keys they can reach. A row with no allowed key (possible only through the model's own
    mask: with ``threshold >= 1`` every row reaches its own key) gets output 0, not NaN.
    """
    bsz, n_heads, q_len, dim = query.shape
    n_kv, k_len = key.shape[1], key.shape[-2]
    if threshold < 1:
        raise ValueError(f"two_branch_attention needs threshold >= 1, got {threshold}")
    rep = n_heads // n_kv
    q32 = query.float()
    k32, v32 = key.float(), value.float()
    device = query.device
    qs = query_shift.to(device=device, dtype=torch.float64)
    ks = None if key_shift is None else key_shift.to(device=device, dtype=torch.float64)
    fold = q_len == 1 or bool((qs == qs[0]).all())
    # only keys j <= i - threshold can be far for some row i <= k_len - 1: rotate just those
    # (a decode step would otherwise re-rotate the whole cache, per layer and step)
    far_end = max(0, k_len - threshold)
    if fold:  # one shift for every row: move the far keys by key_shift - query_shift instead
        # a single shift (STRING: 0-dim) builds one cos/sin row that broadcasts over the keys
        delta = -qs[0] if ks is None else ks[:far_end] - qs[0]
        k_far = rotate(k32[..., :far_end, :], delta, inv_freq)
        k_near_all, k_far_all, v_all = k32, k_far, v32
        q_all = q32
    else:  # per-row shift: [q ; R(shift) q] against [k ; 0] and [0 ; k_far]
        k_far = k32[..., :far_end, :] if ks is None else rotate(k32[..., :far_end, :], ks[:far_end], inv_freq)
        zeros = torch.zeros_like(k32)
        k_near_all = torch.cat((k32, zeros), dim=-1)
        k_far_all = torch.cat((zeros[..., :far_end, :], k_far), dim=-1)
        v_all = torch.cat((v32, zeros), dim=-1)  # values padded to 2d too: CPU's fused kernel wants equal head dims
        q_all = None  # built per block
    allowed_extra = _allowed_from_mask(attention_mask)
    first = k_len - q_len  # token index of query row 0 (checked by token_positions)
    block = max(1, min(_BLOCK_ROWS, _BLOCK_ELEMENTS // max(1, n_heads * 2 * k_len)))
    kpos = torch.arange(k_len, device=device)
    outs = []
    for r0 in range(0, q_len, block):
        r1 = min(q_len, r0 + block)
        i0, i1 = first + r0, first + r1 - 1  # token indices of the block's first and last row
        rows = qpos[r0:r1]
        if fold:
            qb = q_all[:, :, r0:r1]
        else:
            q_rows = q32[:, :, r0:r1]
            qb = torch.cat((q_rows, rotate(q_rows, qs[r0:r1], inv_freq)), dim=-1)
        # near keys j with 0 <= i - j < threshold; far keys j with i - j >= threshold (j <= i1 - threshold)
        lo, hi = max(0, i0 - threshold + 1), i1 + 1
        hi_far = max(0, i1 - threshold + 1)
        d = rows[:, None] - kpos[None, lo:hi]
        allowed = (d >= 0) & (d < threshold)
        if allowed_extra is not None:
            allowed = allowed & allowed_extra[:, :, r0:r1, lo:hi]
        keys, values = k_near_all[:, :, lo:hi], v_all[:, :, lo:hi]
        if hi_far > 0:
            d = rows[:, None] - kpos[None, :hi_far]
            allowed_far = d >= threshold
            if allowed_extra is not None:
                allowed_far = allowed_far & allowed_extra[:, :, r0:r1, :hi_far]
            allowed = torch.cat(_broadcast_rows(allowed, allowed_far), dim=-1)
            keys = torch.cat((keys, k_far_all[:, :, :hi_far]), dim=-2)
            values = torch.cat((values, v_all[:, :, :hi_far]), dim=-2)
        if allowed.dim() == 2:
            allowed = allowed[None, None]  # [1, 1, q, K'] broadcasts over batch and heads
        if rep == 1:
            out = torch.nn.functional.scaled_dot_product_attention(qb, keys, values, attn_mask=allowed, scale=scaling)
        elif _SDPA_GQA:
            out = torch.nn.functional.scaled_dot_product_attention(qb, keys, values, attn_mask=allowed, scale=scaling, enable_gqa=True)
        else:  # torch < 2.5: query head h reads KV head h // rep
            out = torch.nn.functional.scaled_dot_product_attention(
                qb, keys.repeat_interleave(rep, dim=1), values.repeat_interleave(rep, dim=1), attn_mask=allowed, scale=scaling)
        out = out[..., :dim]
        if allowed_extra is not None:  # only the model's own mask can leave a row with no allowed key:
            # it attends to nothing, output 0, not NaN (masked_fill, not a test-and-branch: no host sync per block on GPU)
            out = out.masked_fill(~allowed.any(dim=-1, keepdim=True), 0.0)
        outs.append(out)
    out = torch.cat(outs, dim=2)
    return out.transpose(1, 2).contiguous().to(query.dtype)


def _broadcast_rows(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two masks ``[..., q, Ka]`` and ``[..., q, Kb]`` broadcast over every dim but the last."""
    lead = torch.broadcast_shapes(a.shape[:-1], b.shape[:-1])
    return a.expand(*lead, a.shape[-1]), b.expand(*lead, b.shape[-1])


def standard_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, scaling: float, dropout: float, kwargs: dict) -> torch.Tensor:
    """Plain causal attention through transformers' own ``sdpa_attention_forward``."""
    out, _ = sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    return out
