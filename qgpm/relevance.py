"""Pass 1: read query relevance from the model's own attention heads (Sec. 4.1, Eq. 4).

A plain prefill runs only up to the deepest layer holding a selected head. At each such
layer a pre-hook on the attention module takes the layer's input hidden states and its
standard RoPE tables, projects queries for the query rows ``Q`` only and keys for every
token, and keeps

    l_h(j) = max_{r in Q} <R(p_r) q_{h,r}, R(p_j) k_{h,j}> / sqrt(d)          (Eq. 4)

i.e. |Q| x N logits per head, never an N x N matrix. Under GQA query head ``h`` reads KV
head ``h // (n_heads / n_kv_heads)``; on Qwen3 and Gemma 3 q/k are taken after
``q_norm``/``k_norm``. Gemma 3 scales logits by ``query_pre_attn_scalar ** -0.5`` instead of
``1 / sqrt(d)`` (its attention's own scale), and a head on one of its sliding-window layers
is read with that layer's own (local) RoPE tables, as the model hands them to the layer.
Eq. 4 is taken over every token there too, beyond the window: it is the head's q.k
similarity, a relevance signal, not its attention (calibration decides which heads to use).
"""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict
from typing import Any, Callable, Sequence

import torch

from .layers import input_device
from .rope import apply_rope, head_geometry
from .runtime import cache_kwarg, decoder_layers, model_turn

__all__ = ["head_token_logits", "sentence_logits", "Pass1Stats"]


class _StopPass1(Exception):
    """Raised inside the deepest needed layer to end pass 1 early."""


class Pass1Stats:
    """What pass 1 did (for tests and timings): which layers ran for relevance
    (``layers_run``), whether the forward went on as a vanilla prefill (``continued``, when
    ``go_on`` asked for it) and which later layers it ran then (``layers_continued``)."""

    def __init__(self) -> None:
        self.layers_run: list[int] = []
        self.layers_continued: list[int] = []
        self.continued = False


def _logit_scale(config, head_dim: int) -> float:
    """The factor of Eq. 4: ``1 / sqrt(d)``, or Gemma 3's ``query_pre_attn_scalar ** -0.5``."""
    qpas = getattr(config, "query_pre_attn_scalar", None)
    return float(qpas) ** -0.5 if qpas is not None else 1.0 / math.sqrt(head_dim)


@torch.inference_mode()
def head_token_logits(
    model,
    input_ids: torch.Tensor,
    heads: Sequence[tuple[int, int]],
    query_rows: torch.Tensor,
    *,
    stats: Pass1Stats | None = None,
    go_on: Callable[[torch.Tensor], bool] | None = None,
    cache: Any = None,
    precision: torch.dtype | None = None,
) -> torch.Tensor:
    """Eq. 4 for every head in ``heads``: a ``[len(heads), N]`` float32 tensor.

    Runs the model only up to the deepest layer in ``heads`` (that layer's attention
    projections included, its attention and MLP skipped).

    ``precision`` (e.g. ``torch.bfloat16``): run the layers under ``torch.autocast`` to that
    dtype (weights cast op by op, no cached copies), a cheaper pass 1 on a float32 model
    whose hardware multiplies bfloat16 fast. The q/k projections of the read heads come out
    at that precision; rotation and the logits themselves are computed in float32. ``None``:
    the model's own dtype. Not with ``go_on``: states computed at another precision are not
    the model's prefill.

    ``go_on`` (with ``cache``, a fresh KV cache): called with the finished logits inside
    the deepest layer, before its attention runs. ``True`` lets the forward go on through
    every layer as the plain prefill it is, filling ``cache`` with the prompt's vanilla KV
    states (so that generation can start from them instead of prefilling again); ``False``
    ends pass 1 there as without it. The logits are the same either way.
    """
    if not heads:
        raise ValueError("pass 1 needs at least one (layer, head)")
    if (go_on is None) != (cache is None):
        raise ValueError("go_on and cache go together: pass both (to let pass 1 continue as a prefill) or neither")
    if precision is not None and go_on is not None:
        raise ValueError("a pass 1 at another precision cannot go on as the prefill (its KV states are not the model's): "
                         "pass precision=None with go_on, or no go_on")
    n_heads, n_kv, head_dim = head_geometry(model.config)
    layers = decoder_layers(model)
    by_layer: dict[int, list[int]] = defaultdict(list)
    for i, (layer, head) in enumerate(heads):
        if not 0 <= layer < len(layers) or not 0 <= head < n_heads:
            raise ValueError(f"head ({layer}, {head}) is outside the model ({len(layers)} layers x {n_heads} heads)")
        by_layer[layer].append(i)
    deepest = max(by_layer)
    scale = _logit_scale(model.config, head_dim)
    softcap = getattr(model.config, "attn_logit_softcapping", None)
    group = n_heads // n_kv
    n = input_ids.shape[1]
    out = torch.empty(len(heads), n, dtype=torch.float32)
    rows = query_rows.to(torch.long)
    handles = []
    continued = [False]

    def make_attn_hook(layer_idx: int):
        def hook(module, args, kwargs):
            hs = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            cos, sin = kwargs["position_embeddings"]
            dev = hs.device
            r = rows.to(dev)
            idx = by_layer[layer_idx]
            qh = torch.tensor([heads[i][1] for i in idx], device=dev)
            q = module.q_proj(hs[:, r]).view(1, r.numel(), n_heads, head_dim)
            k = module.k_proj(hs).view(1, n, n_kv, head_dim)
            if getattr(module, "q_norm", None) is not None:
                q = module.q_norm(q)
            if getattr(module, "k_norm", None) is not None:
                k = module.k_norm(k)
            with torch.autocast(dev.type, enabled=False):  # the logits in float32 under any pass-1 precision
                q = q[0].transpose(0, 1)[qh].float()  # [H, R, d]
                k = k[0].transpose(0, 1)[qh // group].float()  # [H, N, d]
                c, s = cos[0].float(), sin[0].float()
                q = apply_rope(q, c[r], s[r])
                k = apply_rope(k, c, s)
                logits = torch.einsum("hrd,hnd->hrn", q, k) * scale
                if softcap is not None:  # monotone, as the model applies it before softmax
                    logits = torch.tanh(logits / softcap) * softcap
            out[idx] = logits.amax(dim=1).cpu()
            if layer_idx == deepest:
                if go_on is not None and go_on(out):
                    continued[0] = True
                    if stats is not None:
                        stats.continued = True
                    return None
                raise _StopPass1
            return None

        return hook

    def make_layer_hook(layer_idx: int):
        def hook(module, args, kwargs):
            if stats is not None:
                (stats.layers_continued if continued[0] else stats.layers_run).append(layer_idx)
            return None

        return hook

    with model_turn(model):
        try:
            for layer_idx in by_layer:
                handles.append(layers[layer_idx].self_attn.register_forward_pre_hook(make_attn_hook(layer_idx), with_kwargs=True))
            if stats is not None:
                for li, layer in enumerate(layers):
                    handles.append(layer.register_forward_pre_hook(make_layer_hook(li), with_kwargs=True))
            device = input_device(model)
            kw = {"use_cache": False} if cache is None else {"use_cache": True, cache_kwarg(model.base_model.forward): cache}
            amp = (torch.autocast(device.type, dtype=precision, cache_enabled=False) if precision is not None
                   else contextlib.nullcontext())
            try:
                with amp:
                    model.base_model(input_ids=input_ids.to(device), **kw)
            except _StopPass1:
                pass
            else:
                if not continued[0]:  # pragma: no cover - the deepest hook raises unless go_on said go on
                    raise RuntimeError("pass 1 did not reach the deepest selected layer")
        finally:
            for h in handles:
                h.remove()
    return out


def sentence_logits(token_logits: torch.Tensor, token_sentence: torch.Tensor, num_sentences: int, exclude: torch.Tensor | None = None) -> torch.Tensor:
    """``l_h(S_i) = max_{j in S_i} l_h(j)``: ``[heads, sentences]``, ``-inf`` for empty sentences.

    ``exclude`` marks tokens left out of the signal (tokens containing a newline).
    """
    ts = token_sentence.to(torch.long)
    keep = ts >= 0
    if exclude is not None:
        keep &= ~exclude.to(torch.bool)
    h = token_logits.shape[0]
    out = torch.full((h, num_sentences), float("-inf"), dtype=torch.float32)
    if keep.any() and num_sentences:
        idx = ts[keep].unsqueeze(0).expand(h, -1)
        out = out.scatter_reduce(1, idx, token_logits[:, keep].float(), reduce="amax", include_self=True)
    return out
