"""Relevance -> scores -> positions -> plan: the middle of QGPM's data flow.

:func:`build_plan` takes one relevance value per context unit (sentence, or evidence
run for Oracle), shapes it into the broad and sharp maps, turns token scores into
per-plane positions and returns the :class:`~qgpm.rope.PositionPlan` for pass 2.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import QGPMConfig
from .positions import boundary_plane, cumulative_positions, ends_placement, frequency_gate, move_permutation, moved_positions, protect_fast_planes, strides, with_leads
from .rope import PositionPlan, RotaryInfo
from .shaping import dense_ranks, move_order, term_filter, protected_prefix_end, rank_sentences, rank_shape, relevant_mask, sentence_scores, token_scores, within_z_window

__all__ = ["PlanOutcome", "KEPT_REASONS", "promoted_units", "front_units", "kept_reason", "build_plan", "slot_order", "check_local_layers", "is_flat", "is_tied", "is_decisive", "effective_s_low", "anchor_basis_length", "split_layer", "inert_fields", "oracle_units", "reorder_needs_masks"]


REORDER_LAYERED_ERROR = ("remap='reorder' on a model with several rotary kinds (Gemma 3's sliding-window and global layers) "
                         "runs only as a plain forward over the prompt in slot order: use one map on every layer "
                         "(split_layer=0, unmodulated_layers=0), or remap='stride' or 'move'; per-layer reorder masks "
                         "that also follow the sliding window are not built")


@dataclass
class PlanOutcome:
    """Everything computed for one plan, kept for explanations and tests."""

    ranks: torch.Tensor  # [units]
    unit_scores: list[torch.Tensor]  # per map, [units]
    token_scores: list[torch.Tensor]  # per map, [N]
    boundary_plane: float  # m* (Eq. 3); on a model with several rotary kinds, that of the first modulated kind
    anchor_length: float
    plan: PositionPlan
    flat: bool = False  # relevance too flat (top z below config.min_top_z, or tied): every score 1, vanilla positions
    tied: bool = False  # flat because no sentence ranks above another (every finite z the same)
    decisive: bool = False  # one sentence stands out (z margin >= config.decisive_margin): every score 1, vanilla positions
    s_low: float = 0.0  # the low score this call used (effective_s_low); 1.0 = vanilla positions
    solo: bool = False  # the top sentence alone is relevant (z margin >= config.solo_margin)
    term_dropped: tuple[int, ...] = ()  # units the query-term filter (config.term_ratio) dropped from the top K of a map some layer uses
    promoted: tuple[int, ...] = ()  # units the plan acts on in a map some layer uses: moved (move, reorder) or kept a full step (stride)
    moves: bool = False  # the remap moves the promoted units (move, reorder); under stride they keep a full step
    front: tuple[int, ...] = ()  # promoted units moved to the context's start (placement="ends"), not next to the question
    kept_reason: str | None = None  # why nothing was promoted (vanilla positions): one of KEPT_REASONS; None when a unit was


KEPT_REASONS = ("flat", "decisive", "keep_length", "s_low", "nothing_promoted")
"""Why a plan promotes nothing and keeps vanilla positions (``PlanOutcome.kept_reason``): the
confidence rule (``min_top_z``), the dominance rule (``decisive_margin``), the short-context
rule (``keep_length``), ``s_low`` 1 as configured, or no unit left relevant after the z window,
the solo rule and the query-term filter."""


def promoted_units(ranks: torch.Tensor, unit_scores: torch.Tensor, s_low: float, config: QGPMConfig) -> list[int]:
    """The units one map acts on: those ``remap="move"`` / ``"reorder"`` moves next to the
    question (:func:`~qgpm.shaping.move_order`), or under ``"stride"`` the relevant ones that
    keep a full position step while others are compressed; none when every unit scores alike."""
    if config.remap in ("move", "reorder"):
        return sorted(move_order(ranks, unit_scores, s_low, config.moved_order))
    rel = relevant_mask(unit_scores, s_low)
    if s_low >= 1 or bool(rel.all()):
        return []
    return rel.nonzero().reshape(-1).tolist()


def kept_reason(planned: "PlanOutcome", config: QGPMConfig) -> str | None:
    """Why ``planned`` promotes nothing (one of :data:`KEPT_REASONS`), ``None`` when it promotes a unit."""
    if planned.promoted:
        return None
    if planned.flat:
        return "flat"
    if planned.decisive:
        return "decisive"
    if planned.s_low >= 1:
        return "s_low" if config.s_low >= 1 else "keep_length"
    return "nothing_promoted"


def split_layer(n_layers: int, config: QGPMConfig) -> int:
    """``l_s``: first layer of the sharp map (``floor(n_layers / 2)`` unless configured)."""
    ls = n_layers // 2 if config.split_layer is None else config.split_layer
    if not 0 <= ls <= n_layers:
        raise ValueError(f"split_layer must be in [0, {n_layers}], got {ls}")
    return ls


_GATE_FIELDS = ("eps", "anchor_ratio", "anchor_basis", "tau", "local_window")


def inert_fields(config: QGPMConfig) -> dict[str, str]:
    """The shaping fields that change no position under ``config``, each with the reason (a search
    over them repeats one trial): under ``remap="reorder"`` the stride floor and the frequency
    gate (every plane moves); under ``"move"`` the stride floor; with one map on every layer
    (``split_layer=0``) the broad map, unless ``anchor_basis="relevant"`` reads it for a remap
    with a gate."""
    out: dict[str, str] = {}
    if config.remap == "reorder":
        out.update(dict.fromkeys(_GATE_FIELDS, "remap='reorder' moves sentences on every plane: no stride, no frequency gate"))
    elif config.remap == "move":
        out["eps"] = "remap='move' sets no strides (eps is the stride floor of remap='stride')"
    if config.split_layer == 0 and (config.remap == "reorder" or config.anchor_basis == "context"):
        out.update(dict.fromkeys(("k_broad", "t_broad"), "split_layer=0 runs the sharp map on every layer: no broad map"))
    return out


def reorder_needs_masks(config: QGPMConfig, n_layers: int) -> bool:
    """Whether ``remap="reorder"`` under ``config`` needs per-layer causal masks (refused on a
    model with a sliding window, :func:`qgpm.hooks.sliding_window_of`; hooks that
    swap the attention mask: sdpa or eager attention only). With one map on every layer
    (``split_layer`` 0 or ``n_layers``, no ``unmodulated_layers``) pass 2 runs as a plain
    forward over the prompt in slot order instead, on any attention implementation; with two
    maps it does so only in calls where both maps happen to move the same sentences."""
    ls = split_layer(n_layers, config)
    return config.unmodulated_layers > 0 or 0 < ls < n_layers


def check_local_layers(config: QGPMConfig, rotary: RotaryInfo) -> None:
    """``config.local_layers`` is for models with sliding-window layers: raise ``ValueError``
    when it is set on a model with one rotary kind on every layer (nothing to apply it to)."""
    if not rotary.layered and config.local_layers is not None:
        raise ValueError(f"local_layers={config.local_layers!r} applies to models with sliding-window layers (Gemma 3); "
                         "this model has one rotary kind on every layer: leave local_layers=None")


def is_flat(z: torch.Tensor, config: QGPMConfig) -> bool:
    """Confidence rule: the head signal is too flat to act on when the top sentence's fused
    z-score (Eq. 5; standard deviations above the mean sentence) is below
    ``config.min_top_z`` (``None``: never), or when ``z`` holds sentences but no finite score
    (no sentences: not flat, there is no signal to judge). A signal that ranks no
    sentence above another is flat whatever ``min_top_z`` (:func:`is_tied`; :func:`build_plan`
    applies both, the tie only where the short-context rule does not keep vanilla positions)."""
    if z.numel() == 0 or config.min_top_z is None:
        return False
    finite = z[torch.isfinite(z)]
    return finite.numel() == 0 or float(finite.max()) < config.min_top_z


def is_tied(z: torch.Tensor) -> bool:
    """No sentence ranks above another: ``z`` holds sentences but no finite score, or every
    finite score is the same."""
    finite = z[torch.isfinite(z)]
    return z.numel() > 0 and (finite.numel() == 0 or bool((finite == finite[0]).all()))


def top_gap(z: torch.Tensor) -> float | None:
    """How far the top fused z-score (Eq. 5) lies above the second one; ``None`` with fewer
    than two finite scores."""
    finite = z[torch.isfinite(z)]
    if finite.numel() < 2:
        return None
    top2 = torch.topk(finite.to(torch.float64), 2).values
    return float(top2[0] - top2[1])


def is_decisive(z: torch.Tensor, config: QGPMConfig) -> bool:
    """Dominance rule: one sentence already stands out when the top fused z-score (Eq. 5)
    exceeds the second one by at least ``config.decisive_margin``. ``None`` (default)
    never applies; fewer than two sentences with a finite z never count as decisive."""
    if config.decisive_margin is None:
        return False
    gap = top_gap(z)
    return gap is not None and gap >= config.decisive_margin


def is_solo(z: torch.Tensor, config: QGPMConfig) -> bool:
    """Solo rule: the top sentence alone is relevant in every map when its fused z-score
    (Eq. 5) exceeds the second one by at least ``config.solo_margin`` (and the call is
    not already vanilla by the dominance rule, which the caller checks first). ``None``
    (default) never applies."""
    if config.solo_margin is None:
        return False
    gap = top_gap(z)
    return gap is not None and gap >= config.solo_margin


def effective_s_low(context_len: int, config: QGPMConfig) -> float:
    """Strength rule for short contexts: the low score of this call,
    ``s_low' = min(1, max(s_low, keep_length / N))`` for ``N`` context tokens.

    With ``keep_length = 0`` (off) this is ``s_low``. Otherwise the irrelevant text is
    compressed no further than to about ``keep_length`` tokens: a context of at most
    ``keep_length`` tokens gets ``s_low' = 1`` (every score 1, vanilla positions), and the
    configured ``s_low`` applies in full from ``N = keep_length / s_low`` up.
    """
    if config.keep_length <= 0:
        return float(config.s_low)
    if context_len <= 0:
        return 1.0
    return float(min(1.0, max(config.s_low, config.keep_length / context_len)))


def anchor_basis_length(token_unit: torch.Tensor, unit_scores: torch.Tensor, config: QGPMConfig, s_low: float | None = None) -> int:
    """The length ``L`` in ``L_a = c * L`` (Eq. 3's anchor), in tokens.

    ``anchor_basis="context"`` (the paper): the number of context tokens.
    ``anchor_basis="relevant"`` (per-call rule): the distance from the first relevant unit
    (the end of the protected prefix, under the broad map's scores ``unit_scores``) to the
    end of the prompt, i.e. the span the remapping can compress. Far evidence opens the gate
    to slower planes; evidence next to the question leaves only fast planes modulated.
    """
    context_len = int((token_unit >= 0).sum())
    if config.anchor_basis == "context" or unit_scores.numel() == 0:
        return context_len
    first = protected_prefix_end(unit_scores, config.s_low if s_low is None else s_low)
    where = (token_unit >= first).nonzero()
    if where.numel() == 0:
        return context_len
    return int(token_unit.numel() - int(where[0]))


def front_units(ranks: torch.Tensor, unit_scores: torch.Tensor, s_low: float, config: QGPMConfig) -> list[int]:
    """The units one map moves to the context's start (``placement="ends"``,
    :func:`~qgpm.positions.ends_placement`'s ``front``); none under any other placement."""
    if config.remap not in ("move", "reorder") or config.placement != "ends":
        return []
    return ends_placement(move_order(ranks, unit_scores, s_low, config.moved_order), ranks)[1]


def slot_order(token_unit: torch.Tensor, ranks: torch.Tensor, unit_scores: torch.Tensor, s_low: float, config: QGPMConfig) -> torch.Tensor:
    """One map's slot order under ``remap="move"`` / ``"reorder"``: ``pi[j]`` is the slot of
    token ``j``. The map's relevant units (:func:`~qgpm.shaping.move_order`, in
    ``config.moved_order``) go before the
    question (``placement="question"``, with their leads when ``lead_tokens`` is set) or to
    both ends of the context (``placement="ends"``, :func:`~qgpm.positions.ends_placement`)."""
    order = move_order(ranks, unit_scores, s_low, config.moved_order)
    if config.placement == "ends":
        back, front = ends_placement(order, ranks)
        return move_permutation(token_unit, back, front)
    return move_permutation(token_unit, with_leads(token_unit, order, config.lead_tokens))


def build_plan(
    token_unit: torch.Tensor,
    unit_relevance: torch.Tensor,
    *,
    config: QGPMConfig,
    rotary: RotaryInfo,
    n_layers: int,
    dense: bool = False,
    capacity: int = 0,
    unit_lexical: torch.Tensor | None = None,
) -> PlanOutcome:
    """Shape unit relevance into broad/sharp token scores and per-plane positions.

    ``token_unit[j]`` is the unit (sentence) of token ``j`` or -1 outside the context;
    ``unit_relevance`` is ``z_i`` (higher = more relevant). ``dense=True`` gives tied
    units one shared rank (Oracle). ``capacity``: the plan's
    :attr:`~qgpm.rope.PositionPlan.capacity` (prompt plus generation budget, in tokens).
    ``unit_lexical``: one lexical score per unit for the question (BM25), needed only with
    ``config.term_ratio`` (the query-term filter).
    """
    n_units = unit_relevance.numel()
    ranks = dense_ranks(unit_relevance) if dense else rank_sentences(unit_relevance)
    context_s_low = effective_s_low(int((token_unit >= 0).sum()), config)  # 1: keep_length (or s_low 1) keeps vanilla positions
    # The confidence rules read the relevance signal only (the Oracle's labels are not one), and
    # only where the context would be modulated: a context kept by keep_length (or s_low 1) keeps
    # vanilla positions whatever the signal, and says so (kept_reason), not that it was flat.
    rules = not dense and context_s_low < 1
    tied = rules and is_tied(unit_relevance)
    flat = tied or (rules and is_flat(unit_relevance, config))
    decisive = rules and not flat and is_decisive(unit_relevance, config)
    vanilla = flat or decisive
    solo = rules and not vanilla and is_solo(unit_relevance, config)
    s_low = 1.0 if vanilla else context_s_low
    unit_scores = []
    window = within_z_window(unit_relevance, config.z_window)  # the Oracle's 0/1 labels: every evidence unit ties with the top
    if not dense:  # a sentence without a score (no token of its own) is never relevant: moving it moves nothing
        window = window * torch.isfinite(unit_relevance).to(torch.float64)
    if solo:  # the top sentence stands out from the second: it alone is relevant
        window = window * (ranks == 0).to(torch.float64)
    use_terms = config.term_ratio is not None and not (dense or vanilla or s_low >= 1)  # s_low 1: every score 1, nothing to filter
    if use_terms and (unit_lexical is None or unit_lexical.numel() != n_units):
        raise ValueError("config.term_ratio needs unit_lexical: one lexical score per unit (the engine computes BM25 scores for the question)")
    dropped: list[list[int]] = []  # per map: the top-K units the query-term filter dropped (of those the z window and solo rule left)
    for params in (config.broad, config.sharp):
        f = rank_shape(ranks, params) * window if n_units else torch.zeros(0, dtype=torch.float64)
        terms = term_filter(ranks, unit_lexical, params.k, config.term_ratio) if use_terms and n_units else None
        dropped.append([] if terms is None else ((terms == 0) & (window > 0)).nonzero().reshape(-1).tolist())
        if terms is not None:
            f = f * terms
        unit_scores.append(torch.ones(n_units, dtype=torch.float64) if vanilla else sentence_scores(f, s_low))
    anchor = max(config.anchor_ratio * max(anchor_basis_length(token_unit, unit_scores[0], config, s_low), 1), 1e-6)
    tok_scores = [token_scores(token_unit, s, s_low) for s in unit_scores]
    # One table set per (rotary kind, map): each kind gets its own boundary plane and gate
    # (Eq. 3, 7) on its own wavelengths. One-kind models have the single kind ``None``.
    kinds: tuple[str | None, ...] = rotary.modulated_kinds if rotary.layered else (None,)
    check_local_layers(config, rotary)
    if rotary.layered and config.local_layers == "modulated":  # the global kind first, then the local kinds
        kinds = tuple(rotary.modulated_kinds) + tuple(k for k in sorted(rotary.kinds) if k not in rotary.modulated_kinds)
    if config.remap == "reorder" and rotary.layered:
        # Only a slot-order forward (PositionPlan.feed_order) runs a layered reorder: one map
        # on every layer, and every kind in it, since a physical reorder reaches the local
        # (sliding-window) layers too; the window then applies over the slot order.
        if reorder_needs_masks(config, n_layers):
            raise ValueError(REORDER_LAYERED_ERROR)
        kinds = tuple(sorted(rotary.kinds))
    # move / reorder: each map's slot order (pi[j] = the slot of token j), the same for every kind
    pis = [slot_order(token_unit, ranks, s, s_low, config) for s in unit_scores] if config.remap in ("move", "reorder") else []
    positions, table_rotary, m_stars, orders = [], [], [], []
    for kind in kinds:
        rot = rotary.for_kind(kind)
        m_star = boundary_plane(anchor, rot.inv_freq)
        gate = frequency_gate(rot.inv_freq.numel(), m_star, config.tau)
        if config.local_window > 0:
            gate = protect_fast_planes(gate, boundary_plane(config.local_window, rot.inv_freq), config.tau)
        m_stars.append(m_star)
        for k, t in enumerate(tok_scores):
            if config.remap == "move":  # relevant units take the last context slots on the modulated planes
                positions.append(moved_positions(pis[k], gate))
            elif config.remap == "reorder":  # the same slots on every plane, and the causal order follows them
                positions.append(moved_positions(pis[k], torch.zeros_like(gate)))
                orders.append(pis[k])
            else:  # Eq. 7-8: strides, cumulated
                positions.append(cumulative_positions(strides(t, gate, config.eps)))
            table_rotary.append(rot)
    ls = split_layer(n_layers, config)
    if config.unmodulated_layers > n_layers:
        raise ValueError(f"unmodulated_layers={config.unmodulated_layers} exceeds the model's {n_layers} layers")
    layer_map: list[int | None] = [0] * ls + [1] * (n_layers - ls)
    layer_map[: config.unmodulated_layers] = [None] * config.unmodulated_layers
    if rotary.layered:
        if rotary.layer_kinds is None or len(rotary.layer_kinds) != n_layers:
            raise ValueError(f"rotary information covers {len(rotary.layer_kinds or ())} layers, the model has {n_layers}")
        for i, kind in enumerate(rotary.layer_kinds):
            if layer_map[i] is not None:  # layers of an unmodulated kind keep standard positions
                layer_map[i] = 2 * kinds.index(kind) + layer_map[i] if kind in kinds else None
    plan = PositionPlan(positions=positions, layer_map=layer_map, rotary=rotary, capacity=capacity,
                        table_rotary=tuple(table_rotary) if rotary.layered else (),
                        orders=tuple(orders) if any(bool((o != torch.arange(o.numel())).any()) for o in orders) else ())
    used = {m % 2 for m in layer_map if m is not None}  # the maps some layer reads
    out = PlanOutcome(ranks, unit_scores, tok_scores, m_stars[0], anchor, plan, flat=flat, tied=tied, decisive=decisive, s_low=s_low, solo=solo,
                      term_dropped=tuple(sorted({u for m in used for u in dropped[m]})),
                      promoted=tuple(sorted({u for m in used for u in promoted_units(ranks, unit_scores[m], s_low, config)})),
                      moves=config.remap in ("move", "reorder"),
                      front=tuple(sorted({u for m in used for u in front_units(ranks, unit_scores[m], s_low, config)})))
    out.kept_reason = kept_reason(out, config)
    return out


def oracle_units(token_sentence: torch.Tensor, evidence_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-level Oracle units: maximal runs of context tokens that are all evidence or
    all not, never crossing a sentence. Returns ``(token_unit, unit_relevance)`` with
    relevance 1 for evidence runs and 0 otherwise.
    """
    units = torch.full_like(token_sentence, -1)
    rel: list[float] = []
    prev = None
    for j in range(token_sentence.numel()):
        sid = int(token_sentence[j])
        if sid < 0:
            prev = None
            continue
        key = (sid, bool(evidence_tokens[j]))
        if key != prev:
            rel.append(1.0 if key[1] else 0.0)
            prev = key
        units[j] = len(rel) - 1
    return units, torch.tensor(rel, dtype=torch.float64)
