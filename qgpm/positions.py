"""Position math of QGPM (paper Sec. 4.3-4.4, Eq. 3, 7, 8): pure torch, no transformers.

Notation: a prompt of ``N`` tokens ``j = 0..N-1``; ``d/2`` rotary planes ``m`` with angular
frequency ``w_m`` (take it from the model's ``rotary_emb.inv_freq``, which already folds
in linear / llama3 / yarn scaling); wavelength ``lambda_m = 2*pi / w_m``; plane 0 is the
fastest.

Data flow: ``token scores s(j)`` -> :func:`boundary_plane` -> :func:`frequency_gate`
-> :func:`strides` -> :func:`cumulative_positions` -> :func:`qgpm.rope.rope_tables` (the
RoPE side lives in :mod:`qgpm.rope`); decoding continues with :func:`continuation_positions`.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "wavelengths",
    "boundary_plane",
    "boundary_plane_plain",
    "frequency_gate",
    "protect_fast_planes",
    "strides",
    "cumulative_positions",
    "continuation_positions",
    "positions_at",
    "move_permutation",
    "with_leads",
    "ends_placement",
    "moved_positions",
]


def wavelengths(inv_freq: torch.Tensor) -> torch.Tensor:
    """``lambda_m = 2*pi / w_m`` for every plane (float64)."""
    w = inv_freq.detach().to(torch.float64).cpu()
    if w.ndim != 1 or w.numel() == 0 or bool((w <= 0).any()):
        raise ValueError("inv_freq must be a non-empty 1-D tensor of positive frequencies")
    return 2 * math.pi / w


def boundary_plane_plain(distance: float, head_dim: int, theta: float) -> float:
    """Eq. 3 for unscaled RoPE: ``m(D) = (d/2) * ln(D / 2pi) / ln(theta)``.

    The (fractional) plane index whose wavelength equals ``distance``.
    """
    if distance <= 0:
        raise ValueError(f"distance must be positive, got {distance}")
    return (head_dim / 2) * math.log(distance / (2 * math.pi)) / math.log(theta)


def boundary_plane(distance: float, inv_freq: torch.Tensor) -> float:
    """Eq. 3 on the model's actual wavelengths: the fractional plane where ``lambda_m = D``.

    Interpolates ``m`` linearly in ``log(lambda)`` between neighbouring planes, and
    extrapolates with the end segments outside the range. For plain RoPE ``log lambda``
    is linear in ``m``, so this equals :func:`boundary_plane_plain` exactly; for scaled
    RoPE (llama3, yarn, linear) it follows the scaled wavelengths.
    """
    if distance <= 0:
        raise ValueError(f"distance must be positive, got {distance}")
    lam = torch.log(wavelengths(inv_freq)).tolist()
    x = math.log(distance)
    n = len(lam)
    if n == 1:
        return 0.0
    # Wavelengths grow with m; find the segment that brackets x (or the end segment).
    k = 0
    while k < n - 2 and lam[k + 1] < x:
        k += 1
    lo, hi = lam[k], lam[k + 1]
    if hi == lo:  # flat segment (can happen with clamped scaled frequencies)
        return float(k)
    return k + (x - lo) / (hi - lo)


def frequency_gate(num_planes: int, m_star: float, tau: float) -> torch.Tensor:
    """``g_m = sigmoid((m - m*) / tau)`` for ``m = 0..num_planes-1`` (float64).

    ``g ~ 0`` on fast planes (modulated), ``g ~ 1`` on slow planes (unit stride).
    ``tau = 0`` gives a hard step (``g = 1`` for ``m >= m*``).
    """
    m = torch.arange(num_planes, dtype=torch.float64)
    if tau < 0:
        raise ValueError(f"tau must be >= 0, got {tau}")
    if tau == 0:
        return (m >= m_star).to(torch.float64)
    return torch.sigmoid((m - m_star) / tau)


def protect_fast_planes(gate: torch.Tensor, m_local: float, tau: float) -> torch.Tensor:
    """Band gate: planes faster than ``m_local`` also keep unit stride.

    ``g'_m = max(g_m, 1 - sigmoid((m - m_local) / tau))`` (a hard step for ``tau = 0``).
    A plane whose wavelength is far below the evidence-to-question distance sees that
    distance aliased many times over, so compressing it barely moves the evidence
    "closer"; but those planes carry local word order, and compressing them scrambles
    the text the model has to read (measured in ``docs/tuning/smollm2_dev_4k.md``).
    ``m_local`` is :func:`boundary_plane` of the local window in tokens.
    """
    m = torch.arange(gate.numel(), dtype=torch.float64)
    if tau < 0:
        raise ValueError(f"tau must be >= 0, got {tau}")
    if tau == 0:
        fast = (m < m_local).to(torch.float64)
    else:
        fast = 1 - torch.sigmoid((m - m_local) / tau)
    return torch.maximum(gate.to(torch.float64), fast)


def strides(scores: torch.Tensor, gate: torch.Tensor, eps: float) -> torch.Tensor:
    """Eq. 7: ``delta_m(j) = max(s(j) + (1 - s(j)) * g_m, eps)``; shape ``[planes, N]``.

    ``scores`` are token scores in ``[0, 1]`` (1 = keep unit stride).
    """
    s = scores.to(torch.float64).reshape(1, -1)
    if s.numel() and (bool((s < 0).any()) or bool((s > 1).any())):
        raise ValueError("token scores must lie in [0, 1]")
    if not 0 < eps <= 1:
        raise ValueError(f"eps (stride floor) must be in (0, 1], got {eps}")
    g = gate.to(torch.float64).reshape(-1, 1)
    return torch.clamp(s + (1 - s) * g, min=eps)


def cumulative_positions(delta: torch.Tensor) -> torch.Tensor:
    """Eq. 8: ``p'_{m,j} = sum_{k=1..j} delta_m(k)``; ``p'_{m,0} = 0``; shape ``[planes, N]``.

    With every stride 1 this is exactly ``arange(N)`` on every plane.
    """
    if delta.ndim != 2:
        raise ValueError("delta must have shape [planes, N]")
    out = torch.zeros_like(delta)
    if delta.shape[1] > 1:
        out[:, 1:] = torch.cumsum(delta[:, 1:], dim=1)
    return out


def continuation_positions(positions: torch.Tensor, steps: int) -> torch.Tensor:
    """Decode positions: the k-th generated token sits at ``p'_{m,N-1} + k`` on every plane.

    Returns ``[planes, steps]`` for ``k = 1..steps``.
    """
    last = positions[:, -1:]
    k = torch.arange(1, steps + 1, dtype=positions.dtype).reshape(1, -1)
    return last + k


def positions_at(positions: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Per-plane positions of arbitrary token indices (prompt or generated), ``[planes, *index.shape]``.

    Indices ``< N`` read the prompt positions; ``j >= N`` continue in unit steps from the
    last prompt position (``p'_{m,N-1} + (j - N + 1)``).
    """
    n = positions.shape[1]
    idx = index.to(torch.long).cpu()
    if bool((idx < 0).any()):
        raise ValueError("token indices must be non-negative")
    inside = idx.clamp(max=n - 1)
    base = positions[:, inside.reshape(-1)].reshape(positions.shape[0], *idx.shape)
    extra = (idx - (n - 1)).clamp(min=0).to(positions.dtype)
    return base + extra


def move_permutation(token_unit: torch.Tensor, moved_units: list[int], front_units: list[int] | tuple[int, ...] = ()) -> torch.Tensor:
    """The token order of the ``remap="move"`` map: ``pi[j]`` is the slot token ``j`` takes.

    ``token_unit[j]`` is the context unit of token ``j`` (-1 outside the context);
    ``moved_units`` lists the units to move, in the order they take the last context slots
    (the last one ends next to the question); ``front_units`` (optional) the units that take
    the first context slots, in that order (the first one opens the context). The context's
    slots are its own token indices: the front units' tokens fill the first slots, the other
    context tokens the next ones in text order, the moved units' tokens the last ones, each
    unit's tokens in text order. Tokens outside the context keep their index. Returns a
    permutation of ``0..N-1`` (int64).
    """
    tu = token_unit.to(torch.long).reshape(-1)
    pi = torch.arange(tu.numel(), dtype=torch.long)
    front_units = list(front_units)
    if not moved_units and not front_units:
        return pi
    both = list(moved_units) + front_units
    if len(set(both)) != len(both):
        raise ValueError(f"moved_units and front_units together repeat a unit (each unit moves once): moved_units={list(moved_units)}, front_units={front_units}")
    slots = (tu >= 0).nonzero().reshape(-1)
    moved = torch.tensor(both, dtype=torch.long)
    stay = slots[~torch.isin(tu[slots], moved)]
    order = [slots[tu[slots] == u] for u in front_units] + [stay] + [slots[tu[slots] == u] for u in moved_units]
    pi[torch.cat(order)] = slots
    return pi


def ends_placement(moved_units: list[int], ranks: torch.Tensor) -> tuple[list[int], list[int]]:
    """Split a slot order (:func:`move_permutation`'s ``moved_units``, best last) between the
    two ends of the context, as LangChain's ``LongContextReorder`` does with documents: the
    best unit stays next to the question, the second best opens the context, the third
    comes before the best, the fourth after the second, and so on. Units that tie with the
    best rank (the Oracle's evidence) all stay next to the question, in their given order.

    Returns ``(back, front)``: ``back`` best last (next to the question), ``front`` in the
    order of its slots (the second best first). Look-alike sentences moved with the best one
    then sit a context apart from it instead of right before it.
    """
    if not moved_units:
        return [], []
    top = int(ranks[moved_units[-1]])
    ties = [u for u in moved_units if int(ranks[u]) == top]
    rest = [u for u in reversed(moved_units) if int(ranks[u]) != top]  # best first
    front = rest[0::2]  # the 2nd, 4th, ... best
    back = rest[1::2][::-1] + ties  # ..., the 5th, the 3rd best, then the best
    return back, front


def with_leads(token_unit: torch.Tensor, moved_units: list[int], lead_tokens: int) -> list[int]:
    """Each moved unit together with the units just before it in the text: its lead.

    ``moved_units`` is a slot order as :func:`move_permutation` takes it (the last unit
    ends next to the question). Each moved unit takes along the context units right before
    it, nearest first, as long as their tokens add up to at most ``lead_tokens`` and none
    of them is moved already (by its own rank or in another unit's lead). The best unit
    (last in ``moved_units``) takes its lead first. So moved units sit apart by some of
    their own surrounding text, as a reranker's chunks do, and the top unit still ends next
    to the question. Returns the units to move, in slot order: each lead in text order
    followed by its unit, the groups in the order of ``moved_units``. ``lead_tokens == 0``
    returns ``moved_units`` unchanged. Units must be numbered in text order
    (``token_unit`` non-decreasing over the context), as sentences and Oracle runs are.
    """
    if lead_tokens < 0:
        raise ValueError(f"lead_tokens must be >= 0, got {lead_tokens}")
    if lead_tokens == 0 or not moved_units:
        return list(moved_units)
    tu = token_unit.to(torch.long).reshape(-1)
    ctx = tu[tu >= 0]
    if ctx.numel() and bool((ctx[1:] < ctx[:-1]).any()):
        raise ValueError("with_leads needs units numbered in text order (token_unit non-decreasing over the context)")
    counts = torch.bincount(ctx, minlength=int(max(moved_units)) + 1).tolist()
    taken = set(moved_units)
    groups: dict[int, list[int]] = {}
    for u in reversed(moved_units):
        lead: list[int] = []
        total, v = 0, u - 1
        while v >= 0 and v not in taken and total + counts[v] <= lead_tokens:
            if counts[v]:
                lead.append(v)
            taken.add(v)
            total += counts[v]
            v -= 1
        groups[u] = lead[::-1] + [u]
    return [w for u in moved_units for w in groups[u]]


def moved_positions(pi: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """Per-plane positions of the ``remap="move"`` map, ``[planes, N]`` (float64):
    ``p'_{m,j} = g_m * j + (1 - g_m) * pi[j]``.

    The modulated (fast, ``g ~ 0``) planes read the moved order ``pi`` (:func:`move_permutation`):
    the relevant units sit just before the question there, while the slow planes
    (``g ~ 1``) keep the text order. Every token keeps a distinct slot (no compression).
    """
    j = torch.arange(pi.numel(), dtype=torch.float64).reshape(1, -1)
    g = gate.to(torch.float64).reshape(-1, 1)
    return g * j + (1 - g) * pi.to(torch.float64).reshape(1, -1)
