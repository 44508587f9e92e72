"""The position rules of the RoPE baselines, one named function per rule (pure torch).

Distances are ``d = i - j`` for query token ``i`` and key token ``j`` (token indices of the
prompt plus generated tokens). These functions say *what* each method does to positions;
:mod:`qgpm.baselines.plans` applies them inside attention, and the exactness tests
compare the model against a brute-force softmax over the distance matrices built here.
"""

from __future__ import annotations

import torch

__all__ = [
    "string_distance",
    "self_extend_positions",
    "self_extend_distance",
    "ms_poe_ratios",
    "position_awareness_scores",
    "ms_poe_unit_ratios",
    "ms_poe_distance",
]


# ----------------------------------------------------------------------------- STRING


def string_distance(d: torch.Tensor, shift: int, local_window: int) -> torch.Tensor:
    """STRING's remapped relative distance: ``d`` below ``S``, ``d - S + W`` at or beyond ``S``.

    Implemented in attention as two branches: a sliding window (keys at ``d < S``, standard
    positions) and a shifted query (keys at ``d >= S``, the query moved back by ``S - W``
    positions), merged by log-sum-exp.
    """
    return torch.where(d >= shift, d - shift + local_window, d)


# ----------------------------------------------------------------------------- Self-Extend


def self_extend_positions(pos: torch.Tensor, group_size: int, window: int, *, query: bool) -> torch.Tensor:
    """Self-Extend's grouped positions (float64): ``floor(i/G) + W - W/G`` for a query,
    ``floor(j/G)`` for a key. They meet the neighbour positions at distance ``W``
    (``(i - j) / G + W - W / G = W`` when ``i - j = W``), so distances stay continuous.
    """
    grouped = torch.div(pos.to(torch.int64), group_size, rounding_mode="floor").to(torch.float64)
    if query:
        grouped = grouped + window - window / group_size
    return grouped


def self_extend_distance(i: torch.Tensor, j: torch.Tensor, group_size: int, window: int) -> torch.Tensor:
    """Self-Extend's distance matrix ``[len(i), len(j)]`` (float64): ``i - j`` inside the
    neighbour window (``i - j < W``), grouped-query minus grouped-key position beyond it."""
    d = (i[:, None] - j[None, :]).to(torch.float64)
    grouped = self_extend_positions(i, group_size, window, query=True)[:, None] - self_extend_positions(j, group_size, window, query=False)[None, :]
    return torch.where(d < window, d, grouped)


# ----------------------------------------------------------------------------- Ms-PoE


def ms_poe_ratios(n: int, min_ratio: float, max_ratio: float) -> torch.Tensor:
    """``n`` ratios evenly spaced from ``min_ratio`` to ``max_ratio`` (both included), float64.

    The released code spaces them as ``min + (max - min) * k / n`` (its top ratio stays
    below ``max``); we include both ends so the stated range is the range used.
    """
    if n < 1:
        raise ValueError(f"need at least one head, got {n}")
    if n == 1:
        return torch.tensor([float(min_ratio)], dtype=torch.float64)
    return torch.linspace(float(min_ratio), float(max_ratio), n, dtype=torch.float64)


def position_awareness_scores(weights: torch.Tensor) -> torch.Tensor:
    """Ms-PoE's outlier-based score per head: the share of keys whose attention weight
    exceeds three times the row mean, on the prompt's last query row.

    ``weights``: ``[heads, K]`` attention probabilities of that row (each row sums to 1,
    so the mean is ``1 / K``). A head with many outliers attends to content at specific
    places; Ms-PoE gives such heads the smallest ratios.
    """
    mean = weights.mean(dim=-1, keepdim=True)
    return (weights > 3 * mean).to(torch.float64).mean(dim=-1)


def ms_poe_unit_ratios(scores: torch.Tensor, ratios: torch.Tensor) -> torch.Tensor:
    """Assign ``ratios`` (ascending) to units (heads, or KV groups) by descending score:
    the unit with the highest score gets ``ratios[0]``. Ties keep index order.

    (The released code indexes its ratio table with the sort order itself, i.e. the
    inverse of this assignment; the two agree only when the order is its own inverse.)
    """
    if scores.numel() != ratios.numel():
        raise ValueError(f"{scores.numel()} scores for {ratios.numel()} ratios")
    order = torch.sort(-scores.to(torch.float64), stable=True).indices
    out = torch.empty_like(ratios)
    out[order] = ratios
    return out


def ms_poe_distance(d: torch.Tensor, ratio: float | torch.Tensor) -> torch.Tensor:
    """Ms-PoE's distance on a head with ratio ``r``: ``d / r`` (positions ``p / r``)."""
    return d.to(torch.float64) / ratio
