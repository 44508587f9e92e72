"""The plan's confidence rules and scores at their boundaries, each expectation read from the
rule's docstring (qgpm/plan.py) or docs/configuration.md: a margin met exactly counts, a
two-sentence context can be decisive, a split at the last layer is allowed, a sentence without
tokens is never relevant, and ``promoted`` names only what the layers read."""

from __future__ import annotations

import math

import torch

from qgpm import plan as P
from qgpm.config import QGPMConfig
from qgpm.rope import RotaryInfo

ROT = RotaryInfo(1.0 / (1e4 ** (torch.arange(0, 16, 2, dtype=torch.float32) / 16)), 1.0, "default", 16)


def f64(*v: float) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.float64)


def test_a_margin_met_exactly_counts_and_two_sentences_can_be_decisive():
    assert P.is_decisive(f64(3.0, 0.0), QGPMConfig(decisive_margin=1.0))  # two sentences are enough
    assert P.is_solo(f64(2.0, 1.0, 0.0), QGPMConfig(solo_margin=1.0))  # gap 1.0 = margin 1.0: "at least"
    assert not P.is_solo(f64(2.0, 1.5, 0.0), QGPMConfig(solo_margin=1.0))


def test_a_split_at_the_last_layer_is_one_map_everywhere_and_needs_no_masks():
    assert P.split_layer(4, QGPMConfig(split_layer=4)) == 4
    assert not P.reorder_needs_masks(QGPMConfig(remap="reorder", split_layer=4), 4)
    assert not P.reorder_needs_masks(QGPMConfig(remap="reorder", split_layer=0), 4)


def test_no_context_keeps_vanilla_positions_and_no_sentences_are_not_tied():
    assert P.effective_s_low(0, QGPMConfig(keep_length=1024.0, s_low=0.3)) == 1.0
    assert not P.is_tied(torch.zeros(0, dtype=torch.float64))


def test_the_relevant_anchor_basis_reads_the_calls_own_s_low():
    units = torch.tensor([0, 0, 1, 1, 2, 2, -1, -1])
    # with this call's s_low 0.8 only unit 2 (score 1.0) and unit 1 (0.85) are above it: 4 tokens
    assert P.anchor_basis_length(units, f64(0.8, 0.85, 1.0), QGPMConfig(anchor_basis="relevant", s_low=0.2), s_low=0.8) == 4


def test_a_sentence_without_tokens_is_never_relevant_and_does_not_rescale_the_others():
    units = torch.tensor([-1, 0, 0, 0, 1, 1, 1, 3, 3, 3, -1])  # unit 2 has no tokens: z = -inf
    cfg = QGPMConfig(remap="stride", k_sharp=4.0, k_broad=5.0, t_sharp=0.0, split_layer=0, s_low=0.3)
    made = P.build_plan(units, f64(2.0, 0.5, -math.inf, -0.5), config=cfg, rotary=ROT, n_layers=2)
    assert made.promoted == (0, 1, 3)
    assert float(made.unit_scores[1][2]) == 0.3  # s_low, the floor


def test_equal_scores_promote_nothing():
    cfg = QGPMConfig(remap="stride", k_sharp=8.0, k_broad=9.0, t_sharp=0.0, split_layer=0, s_low=0.3)
    made = P.build_plan(torch.tensor([-1, 0, 0, 1, 1, 2, 2, -1]), f64(1.0, 0.0, -1.0), config=cfg, rotary=ROT, n_layers=2)
    assert made.promoted == () and made.kept_reason == "nothing_promoted"


def test_gold_labels_are_never_flat_or_tied():
    units = torch.tensor([-1, 0, 0, 1, 1, -1])
    for labels in (f64(1.0, 1.0), f64(0.0, 0.0)):
        made = P.build_plan(units, labels, config=QGPMConfig(s_low=0.3), rotary=ROT, n_layers=2, dense=True)
        assert not made.flat and not made.tied and made.kept_reason == "nothing_promoted"


def test_promoted_names_the_sentences_of_the_maps_the_layers_read():
    units = torch.tensor([-1] + [u for u in range(6) for _ in range(2)] + [-1])
    cfg = QGPMConfig(remap="stride", k_broad=4.0, t_broad=0.0, k_sharp=2.0, t_sharp=0.0, split_layer=2, unmodulated_layers=2, s_low=0.3)
    made = P.build_plan(units, f64(5.0, 4.0, 3.0, 2.0, 1.0, 0.0), config=cfg, rotary=ROT, n_layers=4)
    assert made.plan.layer_map == [None, None, 1, 1]  # the broad map (top 4) is read by no layer
    assert made.promoted == (0, 1)


def _layer_positions(cfg: QGPMConfig) -> list[torch.Tensor]:
    """What the layers read under ``cfg``: each layer's position table, and a reorder's slot orders."""
    units = torch.tensor([-1] + [u for u in range(8) for _ in range(5)] + [-1, -1])
    made = P.build_plan(units, f64(0.3, 2.5, -0.4, 0.1, 1.2, -1.0, 0.6, 3.0), config=cfg, rotary=ROT, n_layers=4)
    read = [m for m in made.plan.layer_map if m is not None]
    return [made.plan.positions[m] for m in read] + [made.plan.orders[m] for m in read if made.plan.orders]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


OTHER_VALUE = {"eps": 0.5, "anchor_ratio": 4.0, "anchor_basis": "relevant", "tau": 0.0, "local_window": 8.0, "k_broad": 16.0, "t_broad": 8.0}


def test_an_inert_field_changes_no_position_and_the_others_do():
    bases = [QGPMConfig(remap="reorder", split_layer=0, k_sharp=3.0, s_low=0.45), QGPMConfig(remap="move", split_layer=0, k_sharp=3.0, s_low=0.3),
             QGPMConfig(remap="stride", split_layer=0, k_sharp=3.0, s_low=0.3), QGPMConfig(remap="stride", k_sharp=3.0, s_low=0.3)]
    assert set(P.inert_fields(bases[0])) == set(OTHER_VALUE)
    assert set(P.inert_fields(bases[1])) == {"eps", "k_broad", "t_broad"}
    assert set(P.inert_fields(bases[2])) == {"k_broad", "t_broad"} and P.inert_fields(bases[3]) == {}
    assert P.inert_fields(bases[1].with_(anchor_basis="relevant")) == {"eps": P.inert_fields(bases[1])["eps"]}
    for base in bases:
        ref = _layer_positions(base)
        for name, value in OTHER_VALUE.items():
            changed = _layer_positions(base.with_(**{name: value}))
            assert _same(ref, changed) == (name in P.inert_fields(base)), (base.remap, base.split_layer, name)
