"""remap="reorder": positions and causal order both follow the moved slots, so pass 2 computes
exactly what the model computes on the prompt with the relevant sentences physically moved
before the question, while every token keeps its place in the input and the KV cache."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qgpm import QGPMConfig
from qgpm.plan import build_plan
from qgpm.positions import move_permutation
from qgpm.rope import PositionPlan, rotary_info
from qgpm.generation import score_prefill
from qgpm.runtime import apply_plan, decoder_layers

from qgpm_testing import FAMILIES, tiny_model

REORDER = QGPMConfig(s_low=0.3, anchor_ratio=1.0, remap="reorder")
# template (5 tokens), eight context units of uneven length, question and template tail (7 tokens)
SIZES = [6, 9, 4, 7, 5, 8, 3, 6]
EVIDENCE = (2, 5)


def _prompt(vocab: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ts = torch.tensor([-1] * 5 + [u for u, k in enumerate(SIZES) for _ in range(k)] + [-1] * 7)
    ids = torch.randint(10, vocab - 10, (1, ts.numel()), generator=g)
    rel = torch.zeros(len(SIZES), dtype=torch.float64)
    rel[list(EVIDENCE)] = 1.0
    return ids, ts, rel


def _plan(model, ts, rel, config=REORDER, steps=8):
    return build_plan(ts, rel, config=config, rotary=rotary_info(model), n_layers=len(decoder_layers(model)),
                      dense=True, capacity=ts.numel() + steps).plan


def _physical(ids, pi):
    moved = torch.empty_like(ids)
    moved[0, pi] = ids[0]
    return moved


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("family", FAMILIES)
def test_reorder_equals_the_physically_reordered_prompt(family, attn, tokenizer):
    model = tiny_model(family, len(tokenizer), attn_implementation=attn)
    ids, ts, rel = _prompt(len(tokenizer))
    plan = _plan(model, ts, rel)
    pi = move_permutation(ts, list(EVIDENCE))
    assert plan.orders and all(torch.equal(o, pi) for o in plan.orders)
    assert not torch.equal(pi, torch.arange(pi.numel()))  # the evidence really moves
    moved = _physical(ids, pi)
    with torch.inference_mode():
        want = model(moved).logits[0]
        with apply_plan(model, plan):
            got = model(ids).logits[0]
        text_order = model(ids).logits[0]
    # every prompt token's output equals that of its moved slot in the reordered prompt
    assert torch.allclose(got, want[pi], atol=1e-5), (got - want[pi]).abs().max()
    assert (text_order - want[pi]).abs().max() > 1e-3  # the reorder is live (text order differs)
    # decoding continues after the prompt exactly as on the reordered prompt
    kw = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    with torch.inference_mode():
        ref = model.generate(moved, attention_mask=torch.ones_like(moved), **kw)
        with apply_plan(model, plan):
            out = model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
    n = ids.shape[1]
    assert torch.equal(out.sequences[0, n:], ref.sequences[0, n:])
    assert torch.allclose(torch.stack(out.logits), torch.stack(ref.logits), atol=1e-5)
    # nothing stays behind: the model is the unpatched model again
    with torch.inference_mode():
        assert torch.equal(model(ids).logits[0], text_order)


@pytest.mark.parametrize("split", [None, 0])  # two maps that move the same sentences, one map
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_ends_placement_equals_the_physically_reordered_prompt(attn, split, tokenizer):
    """placement="ends" sends the second-best sentence to the first context slot: tokens
    there must see only the template before them, as in the physically reordered prompt."""
    model = tiny_model("llama", len(tokenizer), attn_implementation=attn)
    ids, ts, _ = _prompt(len(tokenizer))
    z = torch.tensor([0.1, 3.0, 0.3, 2.6, 0.0, 3.4, 0.2, 0.4], dtype=torch.float64)  # best 5, then 1, 3
    cfg = REORDER.with_(k_sharp=2.5, k_broad=3.0, t_sharp=0.0, t_broad=0.0, split_layer=split, placement="ends")
    plan = build_plan(ts, z, config=cfg, rotary=rotary_info(model), n_layers=len(decoder_layers(model)), capacity=ts.numel() + 8).plan
    pi = move_permutation(ts, [3, 5], [1])
    assert plan.orders and all(torch.equal(o, pi) for o in plan.orders)
    moved = _physical(ids, pi)
    assert torch.equal(ids[:, plan.feed_order()], moved)  # the slot-order forward feeds the physical reorder
    with torch.inference_mode():
        want = model(moved).logits[0]
        with apply_plan(model, plan):  # the per-layer causal masks
            got = model(ids).logits[0]
    assert torch.allclose(got, want[pi], atol=1e-5), (got - want[pi]).abs().max()


def test_reorder_without_relevant_sentences_is_vanilla(tokenizer):
    model = tiny_model("llama", len(tokenizer))
    ids, ts, rel = _prompt(len(tokenizer))
    plan = _plan(model, ts, rel * 0.0)  # nothing stands out: no move, no order, vanilla positions
    assert plan.orders == ()
    with torch.inference_mode():
        want = model(ids).logits
        with apply_plan(model, plan):
            got = model(ids).logits
    assert torch.allclose(got, want, atol=1e-6)


def test_reorder_refuses_what_it_cannot_do_before_any_forward(tokenizer):
    model = tiny_model("llama", len(tokenizer))
    ids, ts, rel = _prompt(len(tokenizer))
    plan = _plan(model, ts, rel)
    model.config._attn_implementation = "flash_attention_2"
    calls = []
    handle = decoder_layers(model)[0].register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(ValueError, match="attn_implementation='sdpa'"):
            with apply_plan(model, plan):
                model(ids)
    finally:
        handle.remove()
        model.config._attn_implementation = "eager"
    assert calls == [] and all(not layer._forward_pre_hooks for layer in decoder_layers(model))
    gemma = tiny_model("gemma3_text", len(tokenizer))
    with pytest.raises(ValueError, match="split_layer=0"):  # two maps on a layered model: masks not built
        _plan(gemma, ts, rel)
    with pytest.raises(ValueError, match="split_layer=0"):
        _plan(gemma, ts, rel, REORDER.with_(split_layer=0, unmodulated_layers=1))


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 5), min_size=1, max_size=7), pre=st.integers(0, 3), post=st.integers(1, 3),
       extra=st.integers(0, 3), data=st.data())
def test_causal_mask_follows_the_moved_slots(sizes, pre, post, extra, data):
    ts = torch.tensor([-1] * pre + [u for u, k in enumerate(sizes) for _ in range(k)] + [-1] * post)
    moved = data.draw(st.permutations(range(len(sizes))).map(lambda p: list(p)[: data.draw(st.integers(1, len(sizes)))]))
    pi = move_permutation(ts, moved)
    n = ts.numel()
    plan = PositionPlan(positions=[pi.double().reshape(1, -1)], layer_map=[0], rotary=None, orders=(pi,))  # type: ignore[arg-type]
    total = n + extra
    # a prefill over the prompt (and any teacher-forced continuation) at once
    m = plan.causal_mask(0, torch.arange(total).reshape(1, -1), total, torch.device("cpu"))
    assert m.shape == (1, 1, total, total) and m.dtype == torch.bool
    slot = torch.cat([pi, torch.arange(n, total)])
    for q in range(total):
        for k in range(total):
            assert bool(m[0, 0, q, k]) == bool(slot[k] <= slot[q])
    assert bool(m[0, 0].diagonal().all())  # every token sees itself
    # the same rows from a later forward that continues the cache (queries n-1.. only)
    part = plan.causal_mask(0, torch.arange(n - 1, total).reshape(1, -1), total, torch.device("cpu"))
    assert torch.equal(part[0, 0], m[0, 0, n - 1 :])
    # queries all after the prompt: the text order holds, no mask needed
    if extra:
        assert plan.causal_mask(0, torch.tensor([[n]]), n + 1, torch.device("cpu")) is None


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_reorder_refuses_a_mask_it_would_drop(attn, tokenizer):
    """Padding or a sliding window shorter than the prompt has no meaning in the moved order:
    the call raises instead of silently attending across them, and the model stays clean."""
    ids, ts, rel = _prompt(len(tokenizer))
    model = tiny_model("llama", len(tokenizer), attn_implementation=attn)
    plan = _plan(model, ts, rel)
    padded = torch.ones_like(ids)
    padded[0, :2] = 0
    with pytest.raises(ValueError, match="padding"):
        with apply_plan(model, plan), torch.inference_mode():
            model(ids, attention_mask=padded)
    window = tiny_model("mistral", len(tokenizer), attn_implementation=attn, sliding_window=16)
    with pytest.raises(ValueError, match="sliding window"):
        with apply_plan(window, _plan(window, ts, rel)), torch.inference_mode():
            window(ids)
    # Qwen2 with its first layers full and the others sliding: the sliding layers' own mask is checked too
    mixed = tiny_model("qwen2", len(tokenizer), attn_implementation=attn, use_sliding_window=True, sliding_window=16, max_window_layers=2)
    with pytest.raises(ValueError, match="sliding window"):
        with apply_plan(mixed, _plan(mixed, ts, rel)), torch.inference_mode():
            mixed(ids)
    assert all(not layer._forward_pre_hooks for m in (model, window, mixed) for layer in decoder_layers(m))
    with torch.inference_mode():  # unpadded, the same plan runs
        with apply_plan(model, plan):
            model(ids, attention_mask=torch.ones_like(ids))


@pytest.mark.parametrize("family, overrides", [
    ("mistral", {"sliding_window": 16}),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 2}),
])
def test_engine_refuses_the_mask_path_on_a_sliding_window_model_before_pass_1(family, overrides, tokenizer):
    """Per-layer reorder masks would drop the model's sliding window: refused with what to do
    before any forward; one map on every layer (slot order, the model's own attention) runs."""
    from qgpm import QGPM
    from qgpm.hooks import sliding_window_of

    model = tiny_model(family, len(tokenizer), attn_implementation="sdpa", **overrides)
    assert sliding_window_of(model) == 16
    assert sliding_window_of(tiny_model("qwen2", len(tokenizer))) is None and sliding_window_of(tiny_model("llama", len(tokenizer))) is None
    engine = QGPM(model, tokenizer, heads=[(1, 0), (2, 1)], config=REORDER)
    context = " ".join(f"Sentence {i} is about the weather in town {i}." for i in range(12))
    calls = []
    handle = decoder_layers(model)[0].register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(ValueError, match="sliding window of 16 tokens.*split_layer=0, unmodulated_layers=0"):
            engine.answer(context, "Which town is sentence 5 about?", max_new_tokens=3, config=REORDER.with_(unmodulated_layers=1))
        assert calls == []
        # also under a reranker source: refused before the reranker loads
        with mock.patch("qgpm.call_checks.get_reranker", side_effect=AssertionError("the reranker loaded")):
            with pytest.raises(ValueError, match="sliding window of 16 tokens"):
                engine.answer(context, "Which town is sentence 5 about?", max_new_tokens=3, config=REORDER.with_(unmodulated_layers=1, relevance="minilm"))
    finally:
        handle.remove()
    res = engine.answer(context, "Which town is sentence 5 about?", max_new_tokens=3, config=REORDER.with_(split_layer=0, keep_length=0))
    assert res.details.pass2 == "slot order"


def test_engine_refuses_reorder_on_an_attention_without_masks_before_pass_1(tokenizer):
    from qgpm import QGPM

    model = tiny_model("llama", len(tokenizer), attn_implementation="sdpa")
    engine = QGPM(model, tokenizer, heads=[(1, 0), (2, 1)], config=REORDER)
    context = " ".join(f"Sentence {i} is about the weather in town {i}." for i in range(12))
    res = engine.answer(context, "Which town is sentence 5 about?", max_new_tokens=3)  # sdpa: runs
    assert res.text is not None
    model.config._attn_implementation = "flash_attention_2"
    calls = []
    handle = decoder_layers(model)[0].register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(ValueError, match="remap='stride'"):
            engine.answer(context, "Which town is sentence 5 about?", max_new_tokens=3)
        assert calls == []  # refused before pass 1
    finally:
        handle.remove()
        model.config._attn_implementation = "sdpa"


# ----------------------------------------------------------------------------- slot-order pass 2
ONE_MAP = REORDER.with_(split_layer=0)
CONTEXT = " ".join(f"Sentence {i} is about the weather in town {i}." for i in range(12))
QUESTION = "Which town is sentence 5 about?"


def test_feed_order_only_where_one_order_covers_every_layer(tokenizer):
    """feed_order() gives the slot order exactly when a plain forward over it is the plan:
    one reorder on every layer; None for vanilla layers, two different orders, or strides."""
    model = tiny_model("llama", len(tokenizer))
    ids, ts, rel = _prompt(len(tokenizer))
    pi = move_permutation(ts, list(EVIDENCE))
    order = _plan(model, ts, rel).feed_order()  # Oracle: both maps move the evidence, one order
    assert order is not None and torch.equal(ids[:, order], _physical(ids, pi))
    assert _plan(model, ts, rel, REORDER.with_(unmodulated_layers=1)).feed_order() is None
    assert _plan(model, ts, rel, REORDER.with_(remap="stride")).feed_order() is None
    assert _plan(model, ts, rel * 0.0).feed_order() is None  # nothing moves: no order at all
    graded = torch.tensor([0.0, 0.2, 3.0, 0.1, 2.5, 0.3, 2.0, 1.5], dtype=torch.float64)  # heads: K_b 8 and K_s 2 move different sets
    two = build_plan(ts, graded, config=REORDER, rotary=rotary_info(model), n_layers=len(decoder_layers(model)), capacity=80).plan
    assert len(two.orders) == 2 and not torch.equal(two.orders[0], two.orders[1])
    assert two.feed_order() is None
    one = build_plan(ts, graded, config=ONE_MAP, rotary=rotary_info(model), n_layers=len(decoder_layers(model)), capacity=80).plan
    assert one.feed_order() is not None and torch.equal(torch.argsort(one.feed_order()), one.orders[1])


@pytest.mark.parametrize("family", FAMILIES)
def test_engine_feeds_one_map_reorder_in_slot_order_with_the_hooked_result(family, tokenizer):
    """With one map on every layer the engine runs pass 2 as a plain forward over the prompt in
    slot order (no hooks, no [N, N] mask): the answer and the gold log-prob equal those of the
    per-layer masks of apply_plan. (Without pass 1's continued prefill, so that the whole
    prompt goes in; tests/test_prefill_reuse.py covers the reuse.)"""
    from qgpm import QGPM

    model = tiny_model(family, len(tokenizer), attn_implementation="sdpa")
    engine = QGPM(model, tokenizer, heads=[(1, 0), (2, 1)], config=ONE_MAP.with_(min_top_z=None, decisive_margin=None), reuse_prefill=False)
    call = engine.prepare(CONTEXT, QUESTION, method="qgpm")
    order = call.plan.feed_order()
    assert order is not None and not torch.equal(order, torch.arange(order.numel()))
    fed, hooks = [], []
    h1 = model.register_forward_pre_hook(lambda m, a, kw: fed.append(kw["input_ids"].clone()), with_kwargs=True)
    h2 = decoder_layers(model)[0].register_forward_pre_hook(lambda m, a, kw: hooks.append(len(m._forward_pre_hooks)), with_kwargs=True)
    try:
        res = engine.generate_prepared(call, max_new_tokens=5, score=" town 5")
    finally:
        h1.remove()
        h2.remove()
    assert torch.equal(fed[0][0, : order.numel()], call.input_ids[0, order])  # slot order went in
    assert res.details["pass2"] == "slot order"
    assert "pass2" not in engine.answer(CONTEXT, QUESTION, method="vanilla", max_new_tokens=2).details
    two = engine.answer(CONTEXT, QUESTION, max_new_tokens=2, config=engine.config.with_(split_layer=None, k_broad=8.0, k_sharp=1.0))
    assert two.details["pass2"] == "masks"  # two maps moving different sentences: per-layer masks
    assert set(hooks) == {1}  # only this test's own hook: no plan installed
    score_ids = engine.tokenizer(" town 5", add_special_tokens=False).input_ids
    kw = dict(max_new_tokens=5, do_sample=False, pad_token_id=0)
    with torch.inference_mode():
        with apply_plan(model, call.plan):  # the per-layer masks on the text order
            want_lp, _ = score_prefill(model, call.input_ids, score_ids)
            want = model.generate(call.input_ids, attention_mask=torch.ones_like(call.input_ids), **kw)
    assert abs(res.details["score_logprob"] - want_lp) < 1e-3
    n = call.num_tokens
    assert res.text.strip() == engine.tokenizer.decode(want[0, n:], skip_special_tokens=True).strip()


def test_one_map_reorder_runs_on_an_attention_that_takes_no_mask(tokenizer):
    """An attention implementation without a custom mask (here sdpa reached through transformers'
    AttentionInterface with the mask dropped, causal by position as flash attention is) refuses
    two-map reorder before pass 1, and runs one-map reorder in slot order."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from qgpm import QGPM

    def causal_only(module, query, key, value, attention_mask, **kwargs):
        return sdpa_attention_forward(module, query, key, value, None, **kwargs)

    AttentionInterface.register("qgpm_test_causal_only", causal_only)
    model = tiny_model("llama", len(tokenizer), attn_implementation="qgpm_test_causal_only")
    engine = QGPM(model, tokenizer, heads=[(1, 0), (2, 1)], config=REORDER.with_(min_top_z=None, decisive_margin=None))
    with pytest.raises(ValueError, match="split_layer=0"):
        engine.answer(CONTEXT, QUESTION, max_new_tokens=3)
    cfg = ONE_MAP.with_(min_top_z=None, decisive_margin=None)
    call = engine.prepare(CONTEXT, QUESTION, method="qgpm", config=cfg)
    got = engine.generate_prepared(call, max_new_tokens=4, score=" town 5").details["score_logprob"]
    sdpa = tiny_model("llama", len(tokenizer), attn_implementation="sdpa")  # same seed, same weights
    ref = QGPM(sdpa, tokenizer, heads=[(1, 0), (2, 1)], config=cfg)
    with torch.inference_mode(), apply_plan(sdpa, call.plan):
        want, _ = score_prefill(sdpa, call.input_ids, ref.tokenizer(" town 5", add_special_tokens=False).input_ids)
    assert abs(got - want) < 1e-3


def test_one_map_reorder_on_gemma3_is_the_physically_reordered_prompt(tokenizer):
    """Gemma 3 (sliding-window and global layers, two rotary kinds): one-map reorder has one
    order on every layer, local ones included, and the engine's pass 2 and decoding equal the
    unpatched model on the prompt physically reordered, with the window shorter than the
    prompt; two maps are refused before pass 1."""
    from qgpm import QGPM

    model = tiny_model("gemma3_text", len(tokenizer), attn_implementation="sdpa")
    assert model.config.sliding_window < 60
    ids, ts, rel = _prompt(len(tokenizer))
    pi = move_permutation(ts, list(EVIDENCE))
    plan = _plan(model, ts, rel, ONE_MAP)
    assert set(plan.layer_map) == {1, 3}  # every layer, local ones included: the sharp map of each of the two kinds
    order = plan.feed_order()
    assert order is not None and torch.equal(ids[:, order], _physical(ids, pi))
    cfg = ONE_MAP.with_(min_top_z=None, decisive_margin=None)
    engine = QGPM(model, tokenizer, heads=[(1, 0), (2, 1)], config=cfg)
    context = " ".join(f"Sentence {i} is about the weather in town {i}, which lies by the sea." for i in range(12))
    call = engine.prepare(context, QUESTION, method="qgpm")
    order = call.plan.feed_order()
    assert order is not None and not torch.equal(order, torch.arange(order.numel()))
    assert call.num_tokens > 2 * model.config.sliding_window
    res = engine.generate_prepared(call, max_new_tokens=6)
    assert res.details["pass2"] == "slot order"
    moved = call.input_ids[:, order]
    with torch.inference_mode():
        want = model.generate(moved, attention_mask=torch.ones_like(moved), max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert res.text.strip() == engine.tokenizer.decode(want[0, moved.shape[1]:], skip_special_tokens=True).strip()
    calls = []
    handle = decoder_layers(model)[0].register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(ValueError, match="split_layer=0"):
            engine.answer(context, QUESTION, max_new_tokens=2, config=cfg.with_(split_layer=None))
    finally:
        handle.remove()
    assert calls == []  # refused before pass 1


def test_gold_logprob_and_answer_on_gemma3_past_its_sliding_window(tokenizer, caplog):
    """The log-prob prefill's KV cache is rewound for generation on sliding-window layers too
    (a prompt longer than the window): the answer equals the one without scoring, and no
    rewind fallback is logged."""
    import logging

    from qgpm import QGPM

    model = tiny_model("gemma3_text", len(tokenizer), attn_implementation="sdpa")
    engine = QGPM(model, tokenizer, heads=[(1, 0), (2, 1)], config=ONE_MAP.with_(min_top_z=None, decisive_margin=None))
    context = " ".join(f"Sentence {i} is about the weather in town {i}, which lies by the sea." for i in range(12))
    for method in ("vanilla", "qgpm"):
        call = engine.prepare(context, QUESTION, method=method)
        assert call.num_tokens > 2 * model.config.sliding_window
        plain = engine.generate_prepared(call, max_new_tokens=6)
        with caplog.at_level(logging.WARNING, logger="qgpm"):
            scored = engine.generate_prepared(call, max_new_tokens=6, score=" town 5")
        assert not [r for r in caplog.records if "rewound" in r.getMessage()]
        assert scored.text == plain.text and scored.details["score_logprob"] < 0
        ids = call.input_ids if method == "vanilla" else call.input_ids[:, call.plan.feed_order()]
        with torch.inference_mode():
            want, _ = score_prefill(engine.model, ids, engine.tokenizer(" town 5", add_special_tokens=False).input_ids)
        assert abs(scored.details["score_logprob"] - want) < 1e-4
