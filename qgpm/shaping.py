"""From sentence relevance to token scores (paper Sec. 4.1 Eq. 5, Sec. 4.2 Eq. 6).

Data flow: per-head sentence logits ``l_h(S_i)`` -> :func:`fuse_heads` (z-scores, Eq. 5)
-> :func:`rank_sentences` -> :func:`rank_shape` (Eq. 6, once per map) ->
:func:`sentence_scores` -> :func:`token_scores` (+ protected prefix).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "MapParams",
    "fuse_heads",
    "rank_sentences",
    "dense_ranks",
    "rank_shape",
    "sentence_scores",
    "token_scores",
    "protected_prefix_end",
    "relevant_mask",
    "move_order",
    "term_filter",
]


@dataclass(frozen=True)
class MapParams:
    """Shaping of one map: top-``k`` width, softness ``temperature`` (0 = hard cut)."""

    k: float
    temperature: float

    def __post_init__(self) -> None:
        if self.k <= 0:
            raise ValueError(f"K must be positive, got {self.k}")
        if self.temperature < 0:
            raise ValueError(f"T must be >= 0, got {self.temperature}")


def fuse_heads(sentence_logits: torch.Tensor) -> torch.Tensor:
    """Eq. 5: ``z_i = mean_h (l_h(S_i) - mu_h) / sigma_h``, statistics over sentences.

    ``sentence_logits`` is ``[heads, sentences]``; ``-inf`` marks a sentence with no
    usable token (all newline tokens): it is left out of ``mu/sigma`` and gets ``-inf``.
    A head whose sentence logits are all equal contributes 0.
    """
    x = sentence_logits.to(torch.float64)
    valid = torch.isfinite(x)
    z = torch.zeros_like(x)
    for h in range(x.shape[0]):
        v = x[h][valid[h]]
        if v.numel() == 0:
            continue
        mu = v.mean()
        sd = v.std(unbiased=False)
        if sd > 0:
            z[h][valid[h]] = (v - mu) / sd
    fused = z.mean(dim=0)
    fused[~valid.any(dim=0)] = float("-inf")
    return fused


def rank_sentences(z: torch.Tensor) -> torch.Tensor:
    """Ordinal rank by ``z`` descending (0 = most relevant); ties keep text order."""
    order = sorted(range(z.numel()), key=lambda i: (-float(z[i]), i))
    rho = torch.empty(z.numel(), dtype=torch.long)
    for r, i in enumerate(order):
        rho[i] = r
    return rho


def dense_ranks(z: torch.Tensor) -> torch.Tensor:
    """Dense rank by ``z`` descending: tied sentences share one rank (used by Oracle)."""
    values = sorted({float(v) for v in z.tolist()}, reverse=True)
    where = {v: r for r, v in enumerate(values)}
    return torch.tensor([where[float(v)] for v in z.tolist()], dtype=torch.long)


def rank_shape(ranks: torch.Tensor, params: MapParams) -> torch.Tensor:
    """Eq. 6: ``f_i = sigmoid((K - 0.5 - rho(i)) / T)``; ``T = 0`` is a hard top-K cut, the ranks
    below ``K`` (for a whole ``K`` the limit of Eq. 6 as ``T -> 0``; a fractional ``K`` keeps
    ``ceil(K)`` sentences, where the limit would keep those below ``K - 0.5``)."""
    rho = ranks.to(torch.float64)
    if params.temperature == 0:
        return (rho < params.k).to(torch.float64)
    return torch.sigmoid((params.k - 0.5 - rho) / params.temperature)


def within_z_window(z: torch.Tensor, window: float | None) -> torch.Tensor:
    """The relevance window (``QGPMConfig.z_window``; an addition to the paper): 1.0 for the
    sentences whose fused z is within ``window`` of the top sentence's, 0.0 for the others
    (float64 per sentence). ``None``, or no finite z, keeps every sentence (all 1.0)."""
    z = z.to(torch.float64)
    keep = torch.ones_like(z)
    finite = torch.isfinite(z)
    if window is None or not bool(finite.any()):
        return keep
    top = float(z[finite].max())
    return torch.where(finite & (z >= top - float(window) - 1e-12), keep, torch.zeros_like(z))


def term_filter(ranks: torch.Tensor, lexical: torch.Tensor, k: float, ratio: float | None) -> torch.Tensor:
    """The query-term filter (``QGPMConfig.term_ratio``; an addition to the paper): 1.0 per
    sentence, except that among a map's top ``k`` (rank below ``k``) the sentences whose
    lexical score for the question (``lexical``, e.g. BM25 over the context's sentences)
    is below ``ratio`` times the best lexical score among them get 0.0. The heads choose
    the candidates; the question's own words drop the look-alikes among them (another key's
    sentence built like the queried one), while sentences that all carry the question's
    rare words (several values of one key) stay together. ``None``, no candidate, or no
    candidate sharing a word with the question keeps every sentence (all 1.0)."""
    keep = torch.ones(ranks.numel(), dtype=torch.float64)
    if ratio is None or ranks.numel() == 0:
        return keep
    if lexical.numel() != ranks.numel():
        raise ValueError(f"term_filter got {lexical.numel()} lexical scores for {ranks.numel()} sentences")
    lex = lexical.to(torch.float64)
    cand = ranks.to(torch.float64) < float(k)
    if not bool(cand.any()):
        return keep
    best = float(lex[cand].max())
    if not best > 0:
        return keep
    keep[cand & (lex < ratio * best)] = 0.0
    return keep


def sentence_scores(f: torch.Tensor, s_low: float) -> torch.Tensor:
    """Min-max rescale ``f`` to [0, 1], then ``s_i = s_low + (1 - s_low) * f~_i``.

    The top sentence scores 1 and the bottom one ``s_low``. When every ``f`` is equal
    (e.g. fewer sentences than ``K`` under a hard cut) every sentence scores 1.
    """
    if not 0 <= s_low <= 1:
        raise ValueError(f"s_low must be in [0, 1], got {s_low}")
    f = f.to(torch.float64)
    if f.numel() == 0:
        return f
    lo, hi = f.min(), f.max()
    if float(hi - lo) <= 1e-12:
        return torch.ones_like(f)
    # clamp: the division can round the top score to 1 + 2e-16
    return (s_low + (1 - s_low) * (f - lo) / (hi - lo)).clamp(min=s_low, max=1.0)


def relevant_mask(sent_scores: torch.Tensor, s_low: float) -> torch.Tensor:
    """The relevant sentences of a map: ``s_i >= (1 + s_low) / 2`` (bool per sentence)."""
    return sent_scores >= (1 + s_low) / 2 - 1e-12


def protected_prefix_end(sent_scores: torch.Tensor, s_low: float) -> int:
    """Index of the first relevant sentence (``s_i >= (1 + s_low) / 2``); 0 if none."""
    relevant = relevant_mask(sent_scores, s_low).nonzero()
    return int(relevant[0]) if relevant.numel() else 0


def move_order(ranks: torch.Tensor, sent_scores: torch.Tensor, s_low: float, order: str = "rank") -> list[int]:
    """The units ``remap="move"`` / ``"reorder"`` moves, in slot order: the relevant sentences
    of the map (:func:`relevant_mask`). ``order="rank"``: worst-ranked first, so the top
    sentence ends next to the question; tied ranks (the Oracle's evidence) keep text order.
    ``order="text"`` (``QGPMConfig.moved_order``): in their order in the context, as the
    Oracle places its evidence. Empty when every sentence is relevant (nothing stands out,
    e.g. every score 1: vanilla positions)."""
    if order not in ("rank", "text"):
        raise ValueError(f"move_order: order must be 'rank' or 'text', got {order!r}")
    rel = relevant_mask(sent_scores, s_low)
    if s_low >= 1 or bool(rel.all()):
        return []
    units = rel.nonzero().reshape(-1).tolist()
    if order == "text":
        return units
    return sorted(units, key=lambda i: (-int(ranks[i]), i))


def token_scores(token_sentence: torch.Tensor, sent_scores: torch.Tensor, s_low: float) -> torch.Tensor:
    """Every token inherits its sentence's score; tokens outside the context score 1.

    ``token_sentence[j]`` is the sentence index of token ``j`` or ``-1`` outside the
    context. Context tokens in sentences before the first relevant sentence score 1
    (the protected prefix).
    """
    ts = token_sentence.to(torch.long)
    out = torch.ones(ts.numel(), dtype=torch.float64)
    if sent_scores.numel() == 0:
        return out
    first = protected_prefix_end(sent_scores, s_low)
    protected = sent_scores.to(torch.float64).clone()
    protected[:first] = 1.0
    inside = ts >= 0
    out[inside] = protected[ts[inside]]
    return out
