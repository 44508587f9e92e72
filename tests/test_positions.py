"""Property and hand-computed tests of the position math (Eq. 3, 6-8) and shaping."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from qgpm.config import QGPMConfig
from qgpm.plan import build_plan, effective_s_low, oracle_units
from qgpm.positions import (
    boundary_plane, boundary_plane_plain, continuation_positions, cumulative_positions,
    frequency_gate, positions_at, strides,
)
from qgpm.rope import RotaryInfo, rope_angles, rope_tables
from qgpm.shaping import (
    MapParams, dense_ranks, fuse_heads, protected_prefix_end, rank_sentences, rank_shape,
    relevant_mask, sentence_scores, token_scores, within_z_window,
)


def plain_inv_freq(d: int = 64, theta: float = 1e5) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))


scores_st = st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=1, max_size=60)


@settings(max_examples=60, deadline=None)
@given(scores=scores_st, m_star=st.floats(0, 31), tau=st.floats(0, 4), eps=st.floats(0.01, 1.0))
def test_positions_strictly_increase_and_slow_planes_stay(scores, m_star, tau, eps):
    s = torch.tensor(scores, dtype=torch.float64)
    gate = frequency_gate(32, m_star, tau)
    p = cumulative_positions(strides(s, gate, eps))
    assert p.shape == (32, len(scores))
    assert torch.all(p[:, 0] == 0)
    assert torch.all(p[:, 1:] - p[:, :-1] >= eps - 1e-12)  # strictly increasing (stride floor)
    assert torch.all(p[:, 1:] - p[:, :-1] <= 1 + 1e-12)  # never beyond the original layout
    # A plane's stride is monotone in the gate: slower planes are at least as close to arange.
    n = torch.arange(len(scores), dtype=torch.float64)
    dev = (n - p).abs().max(dim=1).values
    assert torch.all(dev[1:] <= dev[:-1] + 1e-9)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 300), m_star=st.floats(-5, 40), tau=st.floats(0, 3), eps=st.floats(0.01, 1.0))
def test_all_scores_one_is_exact_arange(n, m_star, tau, eps):
    p = cumulative_positions(strides(torch.ones(n), frequency_gate(32, m_star, tau), eps))
    assert torch.equal(p, torch.arange(n, dtype=torch.float64).expand(32, n))


def test_slow_planes_keep_the_original_layout():
    s = torch.full((500,), 0.1, dtype=torch.float64)
    p = cumulative_positions(strides(s, frequency_gate(32, m_star=10.0, tau=0.5), eps=0.05))
    n = torch.arange(500, dtype=torch.float64)
    assert torch.allclose(p[31], n, atol=1e-6 * 500)  # slowest plane ~ original
    assert (p[0] - 0.1 * n).abs().max() < 1.0  # fastest plane compressed to s_low per token


def test_question_distances_preserved_exactly():
    # context tokens 0..9 low relevance, question tokens 10..19 score 1
    s = torch.tensor([0.2] * 10 + [1.0] * 10, dtype=torch.float64)
    p = cumulative_positions(strides(s, frequency_gate(32, 12.0, 1.0), eps=0.05))
    d = p[:, 11:] - p[:, 10:-1]
    assert torch.allclose(d, torch.ones_like(d), rtol=0, atol=1e-9)  # exact up to float64 rounding


def test_hand_computed_small_case():
    # two planes, gate 0 on plane 0 and 1 on plane 1 (hard step at m* = 1)
    s = torch.tensor([1.0, 0.5, 0.25, 1.0], dtype=torch.float64)
    gate = frequency_gate(2, 1.0, 0.0)
    assert gate.tolist() == [0.0, 1.0]
    delta = strides(s, gate, eps=0.3)
    # plane 0: max(s, 0.3) = [1, .5, .3, 1]; plane 1: unit stride
    assert delta.tolist() == [[1.0, 0.5, 0.3, 1.0], [1.0, 1.0, 1.0, 1.0]]
    p = cumulative_positions(delta)
    assert p.tolist() == [[0.0, 0.5, 0.8, 1.8], [0.0, 1.0, 2.0, 3.0]]
    cont = continuation_positions(p, 2)
    assert cont.tolist() == [[2.8, 3.8], [4.0, 5.0]]


def test_decode_continuation_and_positions_at():
    p = torch.tensor([[0.0, 0.5, 0.8], [0.0, 1.0, 2.0]], dtype=torch.float64)
    got = positions_at(p, torch.tensor([[1, 2, 3, 5]]))
    assert got[:, 0].tolist() == [[0.5, 0.8, 1.8, 3.8], [1.0, 2.0, 3.0, 5.0]]
    with pytest.raises(ValueError):
        positions_at(p, torch.tensor([[-1]]))


@pytest.mark.parametrize("theta,d", [(1e4, 64), (1e5, 64), (5e5, 128)])
@pytest.mark.parametrize("D", [50.0, 1000.0, 4096.0, 30000.0])
def test_boundary_plane_matches_eq3_for_plain_rope(theta, d, D):
    got = boundary_plane(D, plain_inv_freq(d, theta))
    assert got == pytest.approx(boundary_plane_plain(D, d, theta), abs=1e-3)


def test_boundary_plane_follows_scaled_wavelengths():
    inv = plain_inv_freq(64, 1e5).clone()
    inv[20:] /= 8.0  # llama3-style: slow planes stretched 8x
    lam = 2 * math.pi / inv.double()
    target = float(lam[24])
    assert boundary_plane(target, inv) == pytest.approx(24.0, abs=1e-6)
    assert boundary_plane(target, inv) != pytest.approx(boundary_plane_plain(target, 64, 1e5), abs=0.5)


def test_rope_tables_equal_hf_for_integer_positions():
    inv = plain_inv_freq(64, 1e5)
    n = 37
    p = torch.arange(n, dtype=torch.float64).expand(32, n).unsqueeze(1)  # [planes, 1, n]
    cos, sin = rope_tables(rope_angles(p, inv), attention_scaling=1.0)
    freqs = torch.arange(n)[None, :, None].float() * inv.float()
    emb = torch.cat((freqs, freqs), dim=-1)
    assert torch.equal(cos, emb.cos()) and torch.equal(sin, emb.sin())


def test_rank_shape_and_sentence_scores():
    ranks = torch.arange(6)
    hard = rank_shape(ranks, MapParams(2, 0))
    assert hard.tolist() == [1, 1, 0, 0, 0, 0]
    s = sentence_scores(hard, 0.1)
    assert s.tolist() == pytest.approx([1, 1, 0.1, 0.1, 0.1, 0.1])
    soft = sentence_scores(rank_shape(ranks, MapParams(3, 1.0)), 0.2)
    assert soft[0] == pytest.approx(1.0) and soft[-1] == pytest.approx(0.2)
    assert torch.all(soft[1:] <= soft[:-1])
    assert sentence_scores(torch.ones(3), 0.1).tolist() == [1, 1, 1]


def test_fuse_heads_zscores_and_ranks():
    logits = torch.tensor([[1.0, 3.0, 2.0], [10.0, 30.0, 20.0], [0.0, float("-inf"), 1.0]])
    z = fuse_heads(logits)
    assert int(torch.argmax(z)) == 1 or int(torch.argmax(z)) == 2
    assert rank_sentences(torch.tensor([0.1, 0.9, 0.5])).tolist() == [2, 0, 1]
    assert dense_ranks(torch.tensor([1.0, 0.0, 1.0, 0.0])).tolist() == [0, 1, 0, 1]
    # equal heads: z-scores identical whatever the scale
    z1 = fuse_heads(torch.tensor([[1.0, 2.0, 3.0]]))
    z2 = fuse_heads(torch.tensor([[10.0, 20.0, 30.0]]))
    assert torch.allclose(z1, z2)


def test_protected_prefix():
    sent = torch.tensor([0.1, 0.1, 1.0, 0.1])
    assert protected_prefix_end(sent, 0.1) == 2
    ts = torch.tensor([-1, 0, 0, 1, 2, 2, 3, -1])
    t = token_scores(ts, sent, 0.1)
    assert t.tolist() == pytest.approx([1, 1, 1, 1, 1, 1, 0.1, 1])


def test_build_plan_layers_and_oracle_units():
    inv = plain_inv_freq(16, 1e4)
    rot = RotaryInfo(inv, 1.0, "default", 16)
    ts = torch.tensor([-1, 0, 0, 1, 1, 2, 2, -1])
    ev = torch.tensor([0, 0, 0, 0, 1, 0, 0, 0], dtype=torch.bool)
    units, rel = oracle_units(ts, ev)
    assert units.tolist() == [-1, 0, 0, 1, 2, 3, 3, -1]
    assert rel.tolist() == [0, 0, 1, 0]
    cfg = QGPMConfig(s_low=0.1, eps=0.05, anchor_ratio=1.0, tau=0.5)
    mr = build_plan(units, rel, config=cfg, rotary=rot, n_layers=6, dense=True)
    assert mr.plan.layer_map == [0, 0, 0, 1, 1, 1]
    for t in mr.token_scores:  # evidence 1, everything else s_low, except protected prefix
        assert t.tolist() == pytest.approx([1, 1, 1, 1, 1, 0.1, 0.1, 1])


def test_plan_is_immutable_and_takes_its_capacity_from_build_plan():
    import dataclasses

    rot = RotaryInfo(plain_inv_freq(16, 1e4), 1.0, "default", 16)
    ts = torch.tensor([-1, 0, 0, 1, 1, 2, 2, -1])
    mr = build_plan(ts, torch.tensor([0.0, 2.0, 1.0]), config=QGPMConfig(), rotary=rot, n_layers=4, capacity=40)
    assert mr.plan.capacity == 40
    with pytest.raises(dataclasses.FrozenInstanceError):
        mr.plan.capacity = 50
    cos, _ = mr.plan.full_tables(0, torch.device("cpu"), torch.float32, need=9)
    assert cos.shape[0] == max(40, mr.plan.num_tokens + 64)  # tables built up to the planned capacity


@settings(max_examples=40, deadline=None)
@given(m_star=st.floats(min_value=-2, max_value=40), m_local=st.floats(min_value=-2, max_value=40), tau=st.sampled_from([0.0, 0.5, 1.0, 3.0]))
def test_band_gate_keeps_fast_and_slow_planes(m_star, m_local, tau):
    from qgpm.positions import protect_fast_planes

    g = frequency_gate(32, m_star, tau)
    band = protect_fast_planes(g, m_local, tau)
    assert band.shape == g.shape and bool((band >= g).all()) and bool((band <= 1).all())
    m = torch.arange(32, dtype=torch.float64)
    if tau == 0:
        assert bool((band[m < m_local] == 1).all())  # fast planes: unit stride
        assert torch.equal(band[m >= m_local], g[m >= m_local])
    # no band (m_local far below plane 0): the plain gate
    assert torch.allclose(protect_fast_planes(g, -1e6, tau), g) if tau > 0 else True


def test_local_window_plan_leaves_fast_planes_at_unit_stride():
    inv = plain_inv_freq(64, 1e5)
    rot = RotaryInfo(inv, 1.0, "default", 64)
    ts = torch.tensor([-1] + [i // 10 for i in range(400)] + [-1])
    rel = torch.zeros(40, dtype=torch.float64)
    rel[20] = 1.0
    cfg = QGPMConfig(s_low=0.2, anchor_ratio=2.0, tau=0.0)
    plain = build_plan(ts, rel, config=cfg, rotary=rot, n_layers=4, dense=True)
    band = build_plan(ts, rel, config=cfg.with_(local_window=64), rotary=rot, n_layers=4, dense=True)
    m_local = boundary_plane(64, inv)
    lam = 2 * math.pi / inv.double()
    ar = torch.arange(ts.numel(), dtype=torch.float64)
    for p_plain, p_band in zip(plain.plan.positions, band.plan.positions):
        for m in range(32):
            if lam[m] < 64:  # band: unit stride on the fastest planes; plain gate compresses them
                assert m < m_local and torch.equal(p_band[m], ar) and not torch.equal(p_plain[m], ar)
            elif lam[m] < 2 * 400:  # inside the band: the same compression as the plain gate
                assert torch.equal(p_band[m], p_plain[m]) and p_band[m][-1] < ts.numel() - 1
            else:
                assert torch.equal(p_band[m], ar)
    with pytest.raises(ValueError, match="local_window"):
        QGPMConfig(local_window=-1)
    with pytest.raises(ValueError, match="unmodulated_layers"):
        QGPMConfig(unmodulated_layers=-1)
    with pytest.raises(ValueError, match="exceeds"):
        build_plan(ts, rel, config=cfg.with_(unmodulated_layers=5), rotary=rot, n_layers=4, dense=True)


def test_relevant_anchor_follows_the_first_relevant_sentence():
    inv = plain_inv_freq(64, 1e5)
    rot = RotaryInfo(inv, 1.0, "default", 64)
    n_sent, per = 40, 10
    ts = torch.tensor([-1] * 5 + [i // per for i in range(n_sent * per)] + [-1] * 15)  # 5 prefix, 15 question tokens
    cfg = QGPMConfig(s_low=0.3, anchor_ratio=1.0, tau=0.0)
    lengths = {}
    for where in (5, 35):
        rel = torch.zeros(n_sent, dtype=torch.float64)
        rel[where] = 1.0
        ctx = build_plan(ts, rel, config=cfg, rotary=rot, n_layers=4, dense=True)
        mine = build_plan(ts, rel, config=cfg.with_(anchor_basis="relevant"), rotary=rot, n_layers=4, dense=True)
        assert ctx.anchor_length == n_sent * per  # the paper's L: context tokens
        assert mine.anchor_length == ts.numel() - (5 + where * per)  # first relevant token to the prompt's end
        assert mine.boundary_plane == pytest.approx(boundary_plane(mine.anchor_length, inv))
        lengths[where] = mine.anchor_length
    assert lengths[35] < lengths[5]  # near evidence: fewer planes modulated
    with pytest.raises(ValueError, match="anchor_basis"):
        QGPMConfig(anchor_basis="question")


def test_min_top_z_falls_back_to_vanilla_positions_on_flat_relevance():
    inv = plain_inv_freq(32, 1e4)
    rot = RotaryInfo(inv, 1.0, "default", 32)
    ts = torch.tensor([-1] + [i // 5 for i in range(50)] + [-1])
    peaked = torch.zeros(10, dtype=torch.float64)
    peaked[4] = 3.0  # fused z of the top sentence
    cfg = QGPMConfig(s_low=0.2, anchor_ratio=1.0, min_top_z=2.5)
    mr = build_plan(ts, peaked, config=cfg, rotary=rot, n_layers=2)
    assert not mr.flat and mr.token_scores[1].min() < 1
    low = build_plan(ts, peaked * 0.5, config=cfg, rotary=rot, n_layers=2)  # top z 1.5 < 2.5
    assert low.flat
    ar = torch.arange(ts.numel(), dtype=torch.float64)
    for t, p in zip(low.token_scores, low.plan.positions):
        assert bool((t == 1).all()) and all(torch.equal(p[m], ar) for m in range(p.shape[0]))
    assert not build_plan(ts, peaked * 0.5, config=cfg.with_(min_top_z=None), rotary=rot, n_layers=2).flat
    # the Oracle's labels are not a head signal: never flat
    assert not build_plan(ts, (peaked > 0).double(), config=cfg.with_(min_top_z=5.0), rotary=rot, n_layers=2, dense=True).flat
    with pytest.raises(ValueError, match="min_top_z"):
        QGPMConfig(min_top_z=float("nan"))


@pytest.mark.parametrize("min_top_z", [None, 2.5])
@pytest.mark.parametrize("remap", ["stride", "reorder"])
def test_a_signal_that_ranks_no_sentence_keeps_vanilla_positions(min_top_z, remap):
    """Every sentence scoring the same (a lexical source that found none of the question's words)
    ranks nothing: the plan keeps vanilla positions, whatever min_top_z, instead of promoting the
    first sentences in text order."""
    inv = plain_inv_freq(32, 1e4)
    rot = RotaryInfo(inv, 1.0, "default", 32)
    ts = torch.tensor([-1] + [i // 5 for i in range(50)] + [-1])
    cfg = QGPMConfig(s_low=0.2, anchor_ratio=1.0, min_top_z=min_top_z, remap=remap, split_layer=0 if remap == "reorder" else None)
    ar = torch.arange(ts.numel(), dtype=torch.float64)
    for z in (torch.zeros(10, dtype=torch.float64), torch.full((10,), float("-inf"), dtype=torch.float64)):
        out = build_plan(ts, z, config=cfg, rotary=rot, n_layers=2)
        assert out.flat and out.tied and out.promoted == () and out.kept_reason == "flat"
        assert all(torch.equal(p[m], ar) for p in out.plan.positions for m in range(p.shape[0]))
    one_up = torch.zeros(10, dtype=torch.float64)
    one_up[4] = 3.0
    out = build_plan(ts, one_up, config=cfg, rotary=rot, n_layers=2)
    assert not out.flat and not out.tied and 4 in out.promoted
    # a context the short-context rule keeps: vanilla positions for that reason, whatever the signal (no confidence rule fires)
    for z in (torch.full((10,), float("-inf"), dtype=torch.float64), torch.zeros(10, dtype=torch.float64), one_up):
        short = build_plan(ts, z, config=cfg.with_(keep_length=1e6, decisive_margin=0.5, solo_margin=0.5), rotary=rot, n_layers=2)
        assert (short.tied, short.flat, short.decisive, short.solo) == (False, False, False, False)
        assert short.kept_reason == "keep_length" and short.promoted == () and short.s_low == 1.0
        assert all(torch.equal(p[m], ar) for p in short.plan.positions for m in range(p.shape[0]))


def test_decisive_margin_keeps_vanilla_positions_when_one_sentence_stands_out():
    inv = plain_inv_freq(32, 1e4)
    rot = RotaryInfo(inv, 1.0, "default", 32)
    ts = torch.tensor([-1] + [i // 5 for i in range(50)] + [-1])
    z = torch.zeros(10, dtype=torch.float64)
    z[4], z[7] = 3.0, 2.2  # margin 0.8: look-alikes compete
    cfg = QGPMConfig(s_low=0.2, anchor_ratio=1.0, decisive_margin=1.0)
    mr = build_plan(ts, z, config=cfg, rotary=rot, n_layers=2)
    assert not mr.decisive and not mr.flat and mr.token_scores[1].min() < 1
    z2 = z.clone()
    z2[7] = 2.0  # margin exactly 1.0: decisive (>=)
    dec = build_plan(ts, z2, config=cfg, rotary=rot, n_layers=2)
    assert dec.decisive and not dec.flat and dec.s_low == 1.0
    ar = torch.arange(ts.numel(), dtype=torch.float64)
    for t, p in zip(dec.token_scores, dec.plan.positions):
        assert bool((t == 1).all()) and all(torch.equal(p[m], ar) for m in range(p.shape[0]))
    # the margin is between the top two finite values, wherever they sit
    z3 = z2.flip(0)
    z3[0] = float("nan")
    assert build_plan(ts, z3, config=cfg, rotary=rot, n_layers=2).decisive
    assert not build_plan(ts, z2, config=cfg.with_(decisive_margin=None), rotary=rot, n_layers=2).decisive
    assert not build_plan(ts, z2, config=cfg.with_(decisive_margin=1.01), rotary=rot, n_layers=2).decisive
    # flat relevance wins over dominance (one reason per call); the Oracle's labels never count
    flat = build_plan(ts, z2, config=cfg.with_(min_top_z=5.0), rotary=rot, n_layers=2)
    assert flat.flat and not flat.decisive
    assert not build_plan(ts, (z2 > 2.5).double() * 5, config=cfg, rotary=rot, n_layers=2, dense=True).decisive
    # a single sentence is not "decisive": there is nothing to stand out from
    one = build_plan(torch.tensor([-1, 0, 0, 0, -1]), torch.tensor([4.0], dtype=torch.float64), config=cfg, rotary=rot, n_layers=2)
    assert not one.decisive
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="decisive_margin"):
            QGPMConfig(decisive_margin=bad)
    with pytest.raises(TypeError, match="decisive_margin"):
        QGPMConfig(decisive_margin="1")


def test_z_window_keeps_only_sentences_near_the_top_z():
    """z_window: within K, only sentences whose z is within the window of the top one stay
    relevant; ties with the top stay together; None and the Oracle are unchanged."""
    inv = plain_inv_freq(32, 1e4)
    rot = RotaryInfo(inv, 1.0, "default", 32)
    ts = torch.tensor([-1] + [i // 5 for i in range(50)] + [-1])
    z = torch.zeros(10, dtype=torch.float64)
    z[2], z[4], z[6], z[7] = 3.6, 2.8, 2.7, 3.4  # the top (2), one near it (7), two look-alikes 0.8+ below
    cfg = QGPMConfig(s_low=0.3, k_sharp=4.0, anchor_ratio=1.0, remap="reorder", split_layer=0)
    rel = lambda mr: set(relevant_mask(mr.unit_scores[1], mr.s_low).nonzero().reshape(-1).tolist())
    assert rel(build_plan(ts, z, config=cfg, rotary=rot, n_layers=2)) == {2, 4, 6, 7}
    win = build_plan(ts, z, config=cfg.with_(z_window=0.5), rotary=rot, n_layers=2)
    assert rel(win) == {2, 7}
    assert win.unit_scores[1][[4, 6]].tolist() == [0.3, 0.3]  # dropped ones get s_low
    moved = win.plan.orders[1][ts >= 0]
    assert moved[10:15].tolist() == [46, 47, 48, 49, 50]  # the top unit (2) ends next to the question
    assert moved[35:40].tolist() == [41, 42, 43, 44, 45]  # unit 7 just before it; 4 and 6 stay in text order
    assert rel(build_plan(ts, z, config=cfg.with_(z_window=0.9), rotary=rot, n_layers=2)) == {2, 4, 6, 7}
    assert rel(build_plan(ts, z, config=cfg.with_(z_window=0.15), rotary=rot, n_layers=2)) == {2}
    # the window never adds beyond K
    assert rel(build_plan(ts, z, config=cfg.with_(z_window=5.0, k_sharp=2.0), rotary=rot, n_layers=2)) == {2, 7}
    # the Oracle's 0/1 labels: every evidence unit ties with the top, so the window keeps them all
    labels = (z > 2.7).double()
    assert rel(build_plan(ts, labels, config=cfg.with_(z_window=0.1), rotary=rot, n_layers=2, dense=True)) == {2, 4, 7}
    assert within_z_window(torch.tensor([1.0, float("nan"), 0.4]), 0.5).tolist() == [1.0, 0.0, 0.0]
    assert within_z_window(torch.tensor([float("nan")]), 0.5).tolist() == [1.0]
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="z_window"):
            QGPMConfig(z_window=bad)
    with pytest.raises(TypeError, match="z_window"):
        QGPMConfig(z_window=True)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(min_value=0, max_value=20000), s_low=st.floats(min_value=0.0, max_value=1.0),
       keep=st.floats(min_value=0.0, max_value=5000.0))
def test_effective_s_low_rule(n, s_low, keep):
    cfg = QGPMConfig(s_low=s_low, keep_length=keep)
    s = effective_s_low(n, cfg)
    assert s_low <= s <= 1.0
    if keep == 0:
        assert s == s_low  # off: the configured strength
    elif n <= keep:
        assert s == 1.0  # short context: vanilla
    else:
        assert s == pytest.approx(max(s_low, keep / n))
        assert n * s >= keep - 1e-9  # never compressed below keep_length tokens
    if keep > 0 and n > 0:
        assert effective_s_low(2 * n, cfg) <= s  # longer context, same or stronger compression


def test_keep_length_keeps_short_contexts_vanilla_and_scales_longer_ones():
    inv = plain_inv_freq(32, 1e4)
    rot = RotaryInfo(inv, 1.0, "default", 32)
    rel = torch.zeros(40, dtype=torch.float64)
    rel[20] = 1.0
    cfg = QGPMConfig(s_low=0.3, anchor_ratio=2.0, keep_length=200.0)
    short = torch.tensor([-1] * 3 + [i // 5 for i in range(200)] + [-1] * 4)  # 200 context tokens
    mr = build_plan(short, rel, config=cfg, rotary=rot, n_layers=2, dense=True)
    assert mr.s_low == 1.0 and not mr.flat
    ar = torch.arange(short.numel(), dtype=torch.float64)
    for t, p in zip(mr.token_scores, mr.plan.positions):
        assert bool((t == 1).all()) and all(torch.equal(p[m], ar) for m in range(p.shape[0]))
    long = torch.tensor([-1] * 3 + [i // 10 for i in range(400)] + [-1] * 4)  # 400 tokens: s_low' = 0.5
    mr = build_plan(long, rel, config=cfg, rotary=rot, n_layers=2, dense=True)
    assert mr.s_low == pytest.approx(0.5)
    assert float(mr.token_scores[1].min()) == pytest.approx(0.5)
    off = build_plan(long, rel, config=cfg.with_(keep_length=0.0), rotary=rot, n_layers=2, dense=True)
    assert off.s_low == 0.3 and float(off.token_scores[1].min()) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="keep_length"):
        QGPMConfig(keep_length=-1.0)


# ----------------------------------------------------------------------------- remap="move"


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(min_value=1, max_value=6), min_size=1, max_size=9), pre=st.integers(0, 4), post=st.integers(0, 4),
       data=st.data())
def test_move_permutation_puts_moved_units_last_in_order(sizes, pre, post, data):
    from qgpm.positions import move_permutation

    ts = torch.tensor([-1] * pre + [u for u, k in enumerate(sizes) for _ in range(k)] + [-1] * post)
    moved = data.draw(st.permutations(range(len(sizes))).map(lambda p: list(p)[: data.draw(st.integers(0, len(sizes)))]))
    pi = move_permutation(ts, moved)
    n = ts.numel()
    assert sorted(pi.tolist()) == list(range(n))  # a permutation
    outside = (ts < 0).nonzero().reshape(-1)
    assert torch.equal(pi[outside], outside)  # template and question tokens keep their index
    # reading the context slots in order gives: the kept units in text order, then the moved units in the given order
    inv = torch.empty_like(pi)
    inv[pi] = torch.arange(n)
    slots = (ts >= 0).nonzero().reshape(-1)
    read = ts[inv[slots]].tolist()
    kept = [u for u in range(len(sizes)) if u not in moved]
    want = [u for u in kept for _ in range(sizes[u])] + [u for u in moved for _ in range(sizes[u])]
    assert read == want
    for u in range(len(sizes)):  # each unit's tokens stay consecutive and in text order
        p = pi[ts == u]
        assert torch.equal(p, torch.arange(int(p[0]), int(p[0]) + p.numel()))
    with pytest.raises(ValueError, match="repeat"):
        move_permutation(ts, [0, 0])


def test_moved_positions_blend_text_order_and_moved_order_by_gate():
    from qgpm.positions import move_permutation, moved_positions

    ts = torch.tensor([-1, 0, 0, 1, 1, 1, 2, -1])
    pi = move_permutation(ts, [1])
    assert pi.tolist() == [0, 1, 2, 4, 5, 6, 3, 7]
    p = moved_positions(pi, torch.tensor([0.0, 0.25, 1.0]))
    ar = torch.arange(8, dtype=torch.float64)
    assert torch.equal(p[0], pi.double()) and torch.equal(p[2], ar)
    assert torch.allclose(p[1], 0.25 * ar + 0.75 * pi.double())


def test_move_order_moves_the_relevant_sentences_best_last():
    from qgpm.shaping import move_order

    scores = torch.tensor([0.3, 1.0, 0.6, 0.9, 0.3])
    ranks = torch.tensor([3, 0, 2, 1, 4])
    assert move_order(ranks, scores, 0.3) == [3, 1]  # relevant: >= 0.65; worst-ranked first, the top one last
    assert move_order(ranks, torch.ones(5, dtype=torch.float64), 0.3) == []  # nothing stands out
    assert move_order(ranks, scores, 1.0) == []  # s_low 1: vanilla strength
    tied = torch.tensor([0, 1, 0, 1])  # the Oracle's dense ranks: evidence in text order
    assert move_order(tied, torch.tensor([1.0, 0.2, 1.0, 0.2]), 0.2) == [0, 2]
    assert move_order(ranks, scores, 0.3, "text") == [1, 3]  # moved_order="text": the context's order
    assert move_order(tied, torch.tensor([1.0, 0.2, 1.0, 0.2]), 0.2, "text") == [0, 2]
    with pytest.raises(ValueError, match="'rank' or 'text'"):
        move_order(ranks, scores, 0.3, "random")


def test_moved_order_text_keeps_the_moved_sentences_in_context_order():
    rot = RotaryInfo(plain_inv_freq(16, 1e4), 1.0, "default", 16)
    ts = torch.tensor([-1] * 3 + [u for u in range(8) for _ in range(5)] + [-1] * 4)
    z = torch.tensor([0.1, 3.6, 0.2, 3.4, 0.0, 2.7, 0.3, 2.5], dtype=torch.float64)  # ranks: 1, 3, 5, 7 best
    cfg = QGPMConfig(s_low=0.3, k_sharp=4.0, k_broad=8.0, t_sharp=0.5, remap="reorder", split_layer=0)
    read = lambda mr: ts[mr.plan.feed_order()][3:-4].unique_consecutive().tolist()  # units in slot order
    assert read(build_plan(ts, z, config=cfg, rotary=rot, n_layers=2)) == [0, 2, 4, 6, 7, 5, 3, 1]
    text = build_plan(ts, z, config=cfg.with_(moved_order="text"), rotary=rot, n_layers=2)
    assert read(text) == [0, 2, 4, 6, 1, 3, 5, 7]  # the same four moved, in the context's order
    with pytest.raises(ValueError, match="moved_order must be"):
        QGPMConfig(moved_order="best")
    with pytest.raises(ValueError, match="placement='ends'"):
        QGPMConfig(remap="reorder", placement="ends", moved_order="text")


def test_move_plan_moves_the_evidence_next_to_the_question_on_fast_planes_only():
    inv = plain_inv_freq(64, 1e5)
    rot = RotaryInfo(inv, 1.0, "default", 64)
    ts = torch.tensor([-1] * 3 + [i // 10 for i in range(400)] + [-1] * 6)
    rel = torch.zeros(40, dtype=torch.float64)
    rel[12] = 1.0
    cfg = QGPMConfig(s_low=0.3, anchor_ratio=1.0, tau=0.0, remap="move")
    mr = build_plan(ts, rel, config=cfg, rotary=rot, n_layers=4, dense=True)
    lam = 2 * math.pi / inv.double()
    ar = torch.arange(ts.numel(), dtype=torch.float64)
    ev = (ts == 12).nonzero().reshape(-1)
    for p in mr.plan.positions:
        for m in range(32):
            if lam[m] < 400:  # modulated: the evidence takes the last context slots (393..402), the rest closes up
                assert p[m][ev].tolist() == list(range(393, 403))
                assert sorted(p[m].tolist()) == ar.tolist()
                assert torch.equal(p[m][ts == 13], ar[ts == 13] - 10)
            else:  # slow planes: text order
                assert torch.equal(p[m], ar)
    # the stride map on the same call compresses instead; both leave template and question tokens' spacing
    stride = build_plan(ts, rel, config=cfg.with_(remap="stride"), rotary=rot, n_layers=4, dense=True)
    assert stride.plan.positions[1][0][-1] < ts.numel() - 1 and mr.plan.positions[1][0][-1] == ts.numel() - 1
    # flat relevance (head signal): vanilla positions under either remap
    flat = build_plan(ts, rel * 0.5, config=cfg.with_(min_top_z=2.5), rotary=rot, n_layers=4)
    assert flat.flat and all(torch.equal(p[m], ar) for p in flat.plan.positions for m in range(32))
    with pytest.raises(ValueError, match="remap"):
        QGPMConfig(remap="swap")


# ----------------------------------------------------------------------------- lead_tokens


def test_with_leads_takes_the_sentences_before_each_moved_one_best_first():
    from qgpm.positions import with_leads

    ts = torch.tensor([-1, -1] + [u for u in range(10) for _ in range(10)] + [-1])  # ten units of 10 tokens
    assert with_leads(ts, [7, 3], 0) == [7, 3]
    # unit 3 (best, last) takes 2 and 1 (20 tokens; 0 would make 30 > 25); unit 7 takes 6 and 5
    assert with_leads(ts, [7, 3], 25) == [5, 6, 7, 1, 2, 3]
    assert with_leads(ts, [7, 3], 9) == [7, 3]  # no whole sentence fits
    # a lead stops at a moved unit; the best unit's lead is taken before the others'
    assert with_leads(ts, [4, 5], 100) == [0, 1, 2, 3, 4, 5]
    assert with_leads(ts, [5, 8], 30) == [2, 3, 4, 5, 6, 7, 8]  # 8 takes 7, 6 first and stops at 5
    assert with_leads(ts, [8, 5], 30) == [6, 7, 8, 2, 3, 4, 5]  # 5 takes 4, 3, 2 first; 8 takes 7, 6
    assert with_leads(ts, [], 50) == []
    with pytest.raises(ValueError, match="lead_tokens"):
        with_leads(ts, [1], -1)
    with pytest.raises(ValueError, match="text order"):
        with_leads(torch.tensor([0, 0, 2, 1]), [2], 5)


@settings(max_examples=80, deadline=None)
@given(sizes=st.lists(st.integers(min_value=1, max_value=6), min_size=1, max_size=10), lead=st.integers(0, 15), data=st.data())
def test_with_leads_groups_are_disjoint_contiguous_and_end_with_their_unit(sizes, lead, data):
    from qgpm.positions import move_permutation, with_leads

    ts = torch.tensor([-1] * 2 + [u for u, k in enumerate(sizes) for _ in range(k)] + [-1] * 3)
    moved = data.draw(st.permutations(range(len(sizes))).map(lambda p: list(p)[: data.draw(st.integers(1, len(sizes)))]))
    out = with_leads(ts, moved, lead)
    assert len(set(out)) == len(out) and set(moved) <= set(out)
    # the output is the moved units in their order, each preceded by a run of the units just before it
    owner, i = {}, 0
    groups = []
    for k, u in enumerate(moved):
        j = out.index(u)
        lead_units = out[i:j]
        assert lead_units == list(range(u - len(lead_units), u))  # contiguous, in text order, right before u
        assert sum(sizes[v] for v in lead_units) <= lead
        assert not set(lead_units) & set(moved)
        owner.update({v: k for v in lead_units + [u]})
        groups.append(lead_units)
        i = j + 1
    assert i == len(out)
    # a lead stops only where the next sentence is moved, belongs to a better unit's group, or would not fit
    for k, (u, lead_units) in enumerate(zip(moved, groups)):
        v = u - len(lead_units) - 1
        if v >= 0 and not (v in moved or owner.get(v, -1) > k):
            assert sum(sizes[w] for w in lead_units) + sizes[v] > lead
    pi = move_permutation(ts, out)
    assert sorted(pi.tolist()) == list(range(ts.numel()))
    best = moved[-1]
    ctx_end = int((ts >= 0).nonzero().max())
    assert int(pi[ts == best].max()) == ctx_end  # the best unit still ends next to the question


def test_lead_tokens_needs_a_moving_remap_and_moves_text_with_the_evidence():
    with pytest.raises(ValueError, match="remap='move' or 'reorder'"):
        QGPMConfig(lead_tokens=64)
    with pytest.raises(ValueError, match="lead_tokens"):
        QGPMConfig(remap="reorder", lead_tokens=-1)
    with pytest.raises(TypeError, match="lead_tokens"):
        QGPMConfig(remap="reorder", lead_tokens=1.5)
    rot = RotaryInfo(plain_inv_freq(16, 1e4), 1.0, "default", 16)
    ts = torch.tensor([-1] * 3 + [u for u in range(8) for _ in range(5)] + [-1] * 4)
    rel = torch.zeros(8, dtype=torch.float64)
    rel[5] = 1.0
    cfg = QGPMConfig(s_low=0.3, remap="reorder", split_layer=0)
    plain = build_plan(ts, rel, config=cfg, rotary=rot, n_layers=2, dense=True).plan.orders[0]
    led = build_plan(ts, rel, config=cfg.with_(lead_tokens=10), rotary=rot, n_layers=2, dense=True).plan.orders[0]
    read = lambda pi: ts[torch.argsort(pi)][3:-4].unique_consecutive().tolist()  # units in slot order
    assert read(plain) == [0, 1, 2, 3, 4, 6, 7, 5]
    assert read(led) == [0, 1, 2, 6, 7, 3, 4, 5]  # units 3 and 4 (10 tokens) move along, before 5


# ----------------------------------------------------------------------------- placement="ends"


def test_ends_placement_alternates_like_long_context_reorder():
    from qgpm.positions import ends_placement

    ranks = torch.tensor([4, 0, 2, 1, 3, 5])  # unit 1 best, then 3, 2, 4, 0, 5
    assert ends_placement([], ranks) == ([], [])
    assert ends_placement([1], ranks) == ([1], [])
    # best last: 2nd best (3) opens the context, 4th (4) after it; 3rd (2) right before the best
    assert ends_placement([4, 2, 3, 1], ranks) == ([2, 1], [3, 4])
    assert ends_placement([5, 0, 4, 2, 3, 1], ranks) == ([0, 2, 1], [3, 4, 5])  # ..., 5th, 3rd, best
    tied = torch.tensor([0, 1, 0, 1, 0])  # the Oracle's dense ranks: every evidence unit ties with the best
    assert ends_placement([0, 2, 4], tied) == ([0, 2, 4], [])


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(min_value=1, max_value=5), min_size=1, max_size=9), data=st.data())
def test_ends_placement_keeps_every_moved_unit_once_and_the_best_next_to_the_question(sizes, data):
    from qgpm.positions import ends_placement, move_permutation

    n_units = len(sizes)
    ranks = torch.tensor(data.draw(st.permutations(range(n_units))))
    k = data.draw(st.integers(1, n_units))
    moved = sorted(range(n_units), key=lambda u: -int(ranks[u]))[-k:]  # the k best, best last (as move_order gives)
    back, front = ends_placement(moved, ranks)
    assert sorted(back + front) == sorted(moved) and back[-1] == moved[-1]
    assert len(front) == k // 2 and len(back) == k - len(front)
    # the front opens with the second best; ranks grow along the front and towards the context's middle from the back
    assert [int(ranks[u]) for u in front] == sorted(int(ranks[u]) for u in front)
    assert [int(ranks[u]) for u in back] == sorted((int(ranks[u]) for u in back), reverse=True)
    if k > 1:
        assert int(ranks[front[0]]) == 1
    ts = torch.tensor([-1] * 2 + [u for u, c in enumerate(sizes) for _ in range(c)] + [-1] * 3)
    pi = move_permutation(ts, back, front)
    inv = torch.argsort(pi)
    slots = (ts >= 0).nonzero().reshape(-1)
    read = ts[inv[slots]].tolist()
    kept = [u for u in range(n_units) if u not in moved]
    assert read == [u for u in front + kept + back for _ in range(sizes[u])]
    with pytest.raises(ValueError, match="repeat"):
        move_permutation(ts, [0], [0])


def test_placement_needs_a_moving_remap_and_splits_the_moved_sentences():
    with pytest.raises(ValueError, match="placement must be"):
        QGPMConfig(remap="reorder", placement="middle")
    with pytest.raises(ValueError, match="remap='move' or 'reorder'"):
        QGPMConfig(placement="ends")
    with pytest.raises(ValueError, match="lead_tokens"):
        QGPMConfig(remap="reorder", placement="ends", lead_tokens=64)
    rot = RotaryInfo(plain_inv_freq(16, 1e4), 1.0, "default", 16)
    ts = torch.tensor([-1] * 3 + [u for u in range(8) for _ in range(5)] + [-1] * 4)
    z = torch.tensor([0.1, 3.6, 0.2, 3.4, 0.0, 2.7, 0.3, 2.5], dtype=torch.float64)  # ranks: 1, 3, 5, 7 best
    cfg = QGPMConfig(s_low=0.3, k_sharp=4.0, k_broad=8.0, t_sharp=0.5, remap="reorder", split_layer=0)
    read = lambda mr: ts[mr.plan.feed_order()][3:-4].unique_consecutive().tolist()  # units in slot order, every layer
    assert read(build_plan(ts, z, config=cfg, rotary=rot, n_layers=2)) == [0, 2, 4, 6, 7, 5, 3, 1]
    ends = build_plan(ts, z, config=cfg.with_(placement="ends"), rotary=rot, n_layers=2)
    assert read(ends) == [3, 7, 0, 2, 4, 6, 5, 1]  # 2nd and 4th open the context, 3rd before the best
    # under remap="move" the fast planes read the same slots, the slow planes the text order
    moved = build_plan(ts, z, config=cfg.with_(remap="move", placement="ends", anchor_ratio=1.0, tau=0.0), rotary=rot, n_layers=2)
    pos = moved.plan.positions[0]
    assert torch.equal(pos[0], ends.plan.orders[0].double())
    assert torch.equal(pos[-1], torch.arange(ts.numel(), dtype=torch.float64))
    # the Oracle's tied evidence all stays next to the question
    rel = torch.zeros(8, dtype=torch.float64)
    rel[[2, 5]] = 1.0
    oracle = build_plan(ts, rel, config=cfg.with_(placement="ends"), rotary=rot, n_layers=2, dense=True)
    assert read(oracle) == [0, 1, 3, 4, 6, 7, 2, 5]


def test_solo_margin_keeps_only_the_top_sentence_when_it_stands_out():
    rot = RotaryInfo(plain_inv_freq(16, 1e4), 1.0, "default", 16)
    ts = torch.tensor([-1] * 3 + [u for u in range(8) for _ in range(5)] + [-1] * 4)
    cfg = QGPMConfig(s_low=0.3, k_sharp=4.0, k_broad=8.0, t_sharp=0.5, remap="reorder", split_layer=0,
                     decisive_margin=1.3, solo_margin=0.4)
    read = lambda mr: ts[mr.plan.feed_order()][3:-4].unique_consecutive().tolist()  # units in slot order, every layer
    apart = torch.tensor([0.1, 3.6, 0.2, 2.9, 0.0, 2.7, 0.3, 2.5], dtype=torch.float64)  # top 0.7 above the second
    mr = build_plan(ts, apart, config=cfg, rotary=rot, n_layers=2)
    assert mr.solo and not mr.decisive
    assert read(mr) == [0, 2, 3, 4, 5, 6, 7, 1]  # the top sentence alone moves
    close = torch.tensor([0.1, 3.6, 0.2, 3.4, 0.0, 2.7, 0.3, 2.5], dtype=torch.float64)  # 0.2 apart: K_s 4 move
    mr = build_plan(ts, close, config=cfg, rotary=rot, n_layers=2)
    assert not mr.solo and read(mr) == [0, 2, 4, 6, 7, 5, 3, 1]
    off = build_plan(ts, apart, config=cfg.with_(solo_margin=None), rotary=rot, n_layers=2)
    assert not off.solo and read(off) == [0, 2, 4, 6, 7, 5, 3, 1]
    far = torch.tensor([0.1, 4.6, 0.2, 2.9, 0.0, 2.7, 0.3, 2.5], dtype=torch.float64)  # dominance rule first: vanilla
    mr = build_plan(ts, far, config=cfg, rotary=rot, n_layers=2)
    assert mr.decisive and not mr.solo and mr.plan.orders == ()
    labels = torch.tensor([0, 1, 0, 1, 0, 0, 0, 0], dtype=torch.float64)  # the Oracle's labels: never solo
    mr = build_plan(ts, labels, config=cfg.with_(decisive_margin=None, solo_margin=0.5), rotary=rot, n_layers=2, dense=True)
    assert not mr.solo and read(mr) == [0, 2, 4, 5, 6, 7, 1, 3]
    with pytest.raises(ValueError, match="solo_margin"):
        QGPMConfig(solo_margin=0.0)
    with pytest.raises(TypeError, match="solo_margin"):
        QGPMConfig(solo_margin="0.4")


# ----------------------------------------------------------------------------- term_ratio


def test_term_filter_drops_low_overlap_candidates_only():
    from qgpm.shaping import term_filter

    ranks = torch.tensor([2, 0, 5, 1, 3, 4])
    lex = torch.tensor([1.0, 8.0, 9.0, 2.0, 7.5, 0.0], dtype=torch.float64)
    # candidates: ranks 0-3 = units 1, 3, 0, 4; best lexical among them 8.0 -> keep >= 4.0
    assert term_filter(ranks, lex, 4.0, 0.5).tolist() == [0.0, 1.0, 1.0, 0.0, 1.0, 1.0]  # unit 2 (rank 5) is no candidate
    assert term_filter(ranks, lex, 4.0, None).tolist() == [1.0] * 6
    assert term_filter(ranks, torch.zeros(6, dtype=torch.float64), 4.0, 0.5).tolist() == [1.0] * 6  # no shared word: no filter
    # the heads' top can go: the best lexical candidate stays whatever its rank
    assert term_filter(ranks, torch.tensor([0.0, 1.0, 0.0, 6.0, 0.0, 0.0]), 2.0, 0.5).tolist() == [1.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="lexical scores"):
        term_filter(ranks, lex[:3], 4.0, 0.5)


def test_term_ratio_moves_only_the_candidates_that_carry_the_question_words():
    with pytest.raises(ValueError, match="term_ratio"):
        QGPMConfig(term_ratio=0.0)
    with pytest.raises(ValueError, match="term_ratio"):
        QGPMConfig(term_ratio=1.5)
    with pytest.raises(TypeError, match="term_ratio"):
        QGPMConfig(term_ratio="high")
    rot = RotaryInfo(plain_inv_freq(16, 1e4), 1.0, "default", 16)
    ts = torch.tensor([-1] * 3 + [u for u in range(8) for _ in range(5)] + [-1] * 4)
    z = torch.tensor([0.1, 3.6, 0.2, 3.4, 0.0, 2.7, 0.3, 2.5], dtype=torch.float64)  # heads: 1, 3, 5, 7 on top
    lex = torch.tensor([0.0, 2.0, 0.0, 9.0, 0.0, 1.0, 0.0, 8.0], dtype=torch.float64)  # the question's words: 3 and 7
    cfg = QGPMConfig(s_low=0.3, k_sharp=4.0, k_broad=8.0, t_sharp=0.5, remap="reorder", split_layer=0)
    read = lambda mr: ts[mr.plan.feed_order()][3:-4].unique_consecutive().tolist()  # units in slot order
    assert read(build_plan(ts, z, config=cfg, rotary=rot, n_layers=2)) == [0, 2, 4, 6, 7, 5, 3, 1]
    mr = build_plan(ts, z, config=cfg.with_(term_ratio=0.5), rotary=rot, n_layers=2, unit_lexical=lex)
    assert read(mr) == [0, 1, 2, 4, 5, 6, 7, 3]  # 1 and 5 stay in place; 7 and 3 move, 3 (better ranked) next to the question
    assert mr.term_dropped == (1, 5)  # the sharp map's drops (the broad map is used by no layer here)
    with pytest.raises(ValueError, match="unit_lexical"):
        build_plan(ts, z, config=cfg.with_(term_ratio=0.5), rotary=rot, n_layers=2)
    # the Oracle's labels are not filtered
    rel = torch.zeros(8, dtype=torch.float64)
    rel[[1, 5]] = 1.0
    oracle = build_plan(ts, rel, config=cfg.with_(term_ratio=0.5), rotary=rot, n_layers=2, dense=True)
    assert read(oracle) == [0, 2, 3, 4, 6, 7, 1, 5] and oracle.term_dropped == ()


# ----------------------------------------------------------------------------- pinned choices and boundaries
# Values below are worked out by hand from the formulas (DESIGN.md) and the docstrings.


def test_fuse_heads_uses_the_population_sigma_and_averages_a_missing_head_as_zero():
    s15 = math.sqrt(1.5)  # (1 - 2) / sqrt(2/3): the population standard deviation of 1, 2, 3
    assert fuse_heads(torch.tensor([[1.0, 2.0, 3.0]])).tolist() == pytest.approx([-s15, 0.0, s15])
    # sentence 1 has no usable token in head 2: that head adds 0 for it, and the mean still counts 3 heads
    z = fuse_heads(torch.tensor([[1.0, 3.0, 2.0], [10.0, 30.0, 20.0], [0.0, float("-inf"), 1.0]]))
    assert z.tolist() == pytest.approx([(-2 * s15 - 1) / 3, 2 * s15 / 3, 1 / 3])


def test_rank_ties_keep_text_order_and_the_flat_rule_is_strictly_below():
    from qgpm.plan import is_flat

    assert rank_sentences(torch.tensor([1.0, 2.0, 1.0])).tolist() == [1, 0, 2]
    assert not is_flat(torch.tensor([2.0, 0.0, -2.0]), QGPMConfig(min_top_z=2.0))  # at the threshold is not below it
    assert is_flat(torch.tensor([1.999, 0.0, -1.999]), QGPMConfig(min_top_z=2.0))
    assert is_flat(torch.tensor([float("-inf"), float("nan")]), QGPMConfig(min_top_z=2.0))  # sentences, no finite score
    assert not is_flat(torch.tensor([]), QGPMConfig(min_top_z=2.0))  # no sentences: no signal to judge
    assert not is_flat(torch.tensor([float("-inf")]), QGPMConfig(min_top_z=None))  # None: never


def test_a_score_exactly_at_the_midpoint_is_relevant_and_ends_the_protected_prefix():
    s = torch.tensor([1.0, 0.6, 0.2])  # s_low 0.2: the midpoint (1 + 0.2) / 2 is 0.6
    assert relevant_mask(s, 0.2).tolist() == [True, True, False]
    assert protected_prefix_end(torch.tensor([0.2, 0.6, 1.0]), 0.2) == 1
    # sentences before the first relevant one score 1; the first relevant one keeps its own score
    assert token_scores(torch.tensor([-1, 0, 1, 2]), torch.tensor([0.1, 0.7, 1.0]), 0.1).tolist() == pytest.approx([1.0, 1.0, 0.7, 1.0])


def test_term_filter_drops_only_what_is_strictly_below_the_ratio():
    from qgpm.shaping import term_filter

    ranks, lexical = torch.tensor([0, 1, 2]), torch.tensor([2.0, 1.0, 0.0])
    assert term_filter(ranks, lexical, 3, 0.5).tolist() == [1, 1, 0]  # 1.0 is not below 0.5 * 2
    assert term_filter(ranks, lexical, 3, 1.0).tolist() == [1, 0, 0]  # the best one always stays


def test_rope_tables_scale_cos_and_sin_by_the_attention_scaling():
    inv = plain_inv_freq(8, 1e4)
    p = torch.arange(5, dtype=torch.float64).expand(4, 5)
    angles = rope_angles(p, inv)
    cos, sin = rope_tables(angles, attention_scaling=0.5)
    emb = torch.cat((angles, angles), dim=-1)
    assert torch.allclose(cos, 0.5 * emb.cos()) and torch.allclose(sin, 0.5 * emb.sin())


def test_a_plan_is_standard_only_when_every_map_a_layer_reads_is():
    from qgpm.rope import PositionPlan

    rot = RotaryInfo(plain_inv_freq(8, 1e4), 1.0, "default", 8)
    std = torch.arange(6, dtype=torch.float64).expand(4, 6).clone()
    assert not PositionPlan(positions=[std, 0.5 * std], layer_map=[0, 0, 1, 1], rotary=rot).is_standard()
    assert PositionPlan(positions=[std, 0.5 * std], layer_map=[0, 0, 0, 0], rotary=rot).is_standard()
    assert PositionPlan(positions=[std, 0.5 * std], layer_map=[0, 0, None, None], rotary=rot).is_standard()


def test_tables_reach_past_the_planned_capacity_when_generation_does():
    rot = RotaryInfo(plain_inv_freq(16, 1e4), 1.0, "default", 16)
    plan = build_plan(torch.tensor([-1, 0, 0, 1, 1, 2, 2, -1]), torch.tensor([0.0, 2.0, 1.0]), config=QGPMConfig(), rotary=rot,
                      n_layers=4).plan
    n = plan.num_tokens
    cos, _ = plan.full_tables(0, torch.device("cpu"), torch.float32, need=n + 100)
    assert cos.shape[0] >= n + 100
    far, _ = plan.tables(0, torch.tensor([[n + 80]]), torch.device("cpu"), torch.float32)
    assert far.shape == (1, 1, 16)


def test_split_layer_floors_an_odd_layer_count():
    from qgpm.plan import split_layer

    rot = RotaryInfo(plain_inv_freq(16, 1e4), 1.0, "default", 16)
    assert split_layer(5, QGPMConfig()) == 2
    out = build_plan(torch.tensor([-1, 0, 0, 1, 1, 2, 2, -1]), torch.tensor([0.0, 2.0, 1.0]), config=QGPMConfig(), rotary=rot, n_layers=5)
    assert out.plan.layer_map == [0, 0, 1, 1, 1]


def test_the_relevant_anchor_is_read_from_the_broad_map():
    """anchor_basis='relevant': L runs from the broad map's first relevant unit to the end of the
    prompt. Broad K 3 makes units 2, 3, 1 relevant (first token 3: L 7), sharp K 1 only unit 2
    (first token 5: L 5); c = 2."""
    rot = RotaryInfo(plain_inv_freq(16, 1e4), 1.0, "default", 16)
    cfg = QGPMConfig(anchor_basis="relevant", k_broad=3, t_broad=0, k_sharp=1, t_sharp=0, anchor_ratio=2.0, keep_length=0,
                     min_top_z=None, z_window=None, term_ratio=None, solo_margin=None, decisive_margin=None)
    out = build_plan(torch.tensor([-1, 0, 0, 1, 1, 2, 2, 3, 3, -1]), torch.tensor([0.0, 1.0, 3.0, 2.0]), config=cfg, rotary=rot, n_layers=4)
    assert out.anchor_length == pytest.approx(14.0)


def test_stride_positions_follow_eq7_with_the_default_soft_gate():
    """Eq. 7-8 end to end with the default tau = 1: p'_{m,0} = 0 and p'_{m,j} = sum_{k<=j}
    max(s_k + (1 - s_k) sigmoid((m - m*) / tau), eps), from the plan's own token scores and m*."""
    rot = RotaryInfo(plain_inv_freq(16, 1e4), 1.0, "default", 16)
    cfg = QGPMConfig()
    assert cfg.remap == "stride" and cfg.tau == 1.0
    out = build_plan(torch.tensor([-1, 0, 0, 1, 1, 2, 2, 3, 3, -1]), torch.tensor([0.0, 3.0, 1.0, 0.5]), config=cfg, rotary=rot, n_layers=4)
    s = out.token_scores[0]
    assert 0 < float(s.min()) < 1  # some tokens are compressed
    m = torch.arange(8, dtype=torch.float64).reshape(-1, 1)
    gate = 1 / (1 + torch.exp(-(m - out.boundary_plane) / cfg.tau))
    delta = torch.clamp(s.reshape(1, -1) + (1 - s.reshape(1, -1)) * gate, min=cfg.eps)
    want = torch.zeros_like(delta)
    want[:, 1:] = torch.cumsum(delta[:, 1:], dim=1)
    assert torch.allclose(out.plan.positions[0], want, atol=1e-12)


def test_reciprocal_rank_of_the_best_gold_unit_with_ties_at_their_expected_rank():
    """App. A's head score: 1 / (a + 1 + t / 2), a units above the best gold one, t other units tied with it."""
    from qgpm.heads import reciprocal_rank

    assert reciprocal_rank(torch.tensor([3.0, 1.0, 2.0]), [2]) == 0.5  # one unit above
    assert reciprocal_rank(torch.tensor([3.0, 1.0, 2.0]), [0, 2]) == 1.0  # the best of the gold units counts
    assert reciprocal_rank(torch.tensor([1.0, 1.0, 1.0, 0.0]), [0]) == 0.5  # two tied: expected rank 2
    assert reciprocal_rank(torch.tensor([1.0, 1.0, 0.0]), [0, 1]) == 1.0  # tied gold units are no competitors


def test_the_hard_cut_keeps_the_ranks_below_k():
    ranks = torch.arange(5)
    assert rank_shape(ranks, MapParams(2, 0)).tolist() == [1, 1, 0, 0, 0]
    assert rank_shape(ranks, MapParams(2.3, 0)).tolist() == [1, 1, 1, 0, 0]  # a fractional K rounds up
