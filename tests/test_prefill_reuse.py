"""Pass 1 going on as the answer's prefill (``QGPM.reuse_prefill``): the cost rule, the
reusable prefix of a plan, and answers equal to a full pass 2 on every tiny family and on
the real SmolLM2."""

from __future__ import annotations

import logging

import pytest
import torch

from qgpm import QGPM, QGPMConfig
from qgpm.prefill import prefill_reuse_pays
from qgpm.relevance import Pass1Stats, head_token_logits
from qgpm.runtime import decoder_layers
from qgpm_testing import NEEDLE_QUESTION, needle_context, FAMILIES, LAYERED_FAMILIES, tiny_model

QUESTION = NEEDLE_QUESTION
HEADS = [(1, 0), (2, 1)]
# one map on every layer, the two top sentences moved: pass 2 runs in slot order
ONE_MAP = QGPMConfig(remap="reorder", split_layer=0, k_sharp=2.0, s_low=0.1, min_top_z=None, decisive_margin=None)
FALLBACK = ONE_MAP.with_(min_top_z=1e6)  # no head signal is that peaked: every call keeps vanilla positions


context = needle_context


# ----------------------------------------------------------------------------- the cost rule
def test_continue_pays_charges_the_chunk_after_the_prefix():
    # 30 layers, pass 1 stopped at layer 23: going on costs 7/30 of a prefill, then the chunk
    # of the f = 1 - prefix/N tokens after the reused ones f * (1 + f/2)
    n, layers, deepest = 1000, 30, 23
    assert not prefill_reuse_pays(400, n, deepest, layers)  # f 0.6: 0.233 + 0.78 > 1
    assert prefill_reuse_pays(420, n, deepest, layers)  # f 0.58: 0.233 + 0.748 < 1
    assert prefill_reuse_pays(750, n, deepest, layers) and not prefill_reuse_pays(260, n, deepest, layers)
    assert prefill_reuse_pays(n, n, deepest, layers) and prefill_reuse_pays(n, n, 0, layers)  # nothing moves: one prefill in all
    assert not prefill_reuse_pays(0, n, deepest, layers)
    assert not prefill_reuse_pays(999, n, 0, layers)  # a head on layer 0: going on is a whole prefill, no saving
    paying = [p for p in range(1, n + 1) if prefill_reuse_pays(p, n, deepest, layers)]
    assert paying == list(range(paying[0], n + 1))  # a longer reusable prefix never stops paying


# ----------------------------------------------------------------------------- the reusable prefix
def test_vanilla_prefix_is_the_run_before_the_first_moved_token(tokenizer):
    model = tiny_model("llama", len(tokenizer))
    engine = QGPM(model, tokenizer, heads=HEADS, config=ONE_MAP, reuse_prefill=False)
    moved = engine.prepare(context(12), QUESTION, method="qgpm")
    order = moved.plan.feed_order()
    first = int((order != torch.arange(order.numel())).nonzero()[0])
    assert moved.plan.vanilla_prefix() == first > 0
    # the tokens before it are where they were; the token at that slot is not
    assert torch.equal(order[:first], torch.arange(first)) and int(order[first]) != first
    still = engine.prepare(context(12), QUESTION, method="qgpm", config=FALLBACK)
    assert still.plan.is_standard() and still.plan.vanilla_prefix() == still.num_tokens
    stride = engine.prepare(context(12), QUESTION, method="qgpm", config=ONE_MAP.with_(remap="stride", split_layer=None))
    assert not stride.plan.is_standard() and stride.plan.vanilla_prefix() == 0
    assert engine.generate_prepared(still, max_new_tokens=2).details["pass2"] == "standard"


# ----------------------------------------------------------------------------- pass 1 going on
def test_pass1_goes_on_through_every_layer_only_when_asked(tokenizer):
    from transformers import DynamicCache

    model = tiny_model("llama", len(tokenizer))
    engine = QGPM(model, tokenizer, heads=HEADS, config=ONE_MAP)
    call = engine.prepare(context(12), QUESTION, method="qgpm", config=FALLBACK)
    ids, rows = call.prompt.input_ids, call.prompt.query_rows
    stop, go = Pass1Stats(), Pass1Stats()
    a = head_token_logits(model, ids, HEADS, rows, stats=stop)
    cache = DynamicCache(config=model.config)
    b = head_token_logits(model, ids, HEADS, rows, stats=go, go_on=lambda tl: True, cache=cache)
    assert torch.equal(a, b)  # the same relevance
    assert stop.layers_run == go.layers_run == [0, 1, 2] and stop.layers_continued == []
    assert go.layers_continued == [3] and cache.get_seq_length() == ids.shape[1]
    with torch.inference_mode():  # the cache holds the vanilla prefill's states
        full = model(ids, use_cache=True)
    for layer in range(len(decoder_layers(model))):
        assert torch.allclose(cache.layers[layer].keys, full.past_key_values.layers[layer].keys, atol=1e-5)
    told = Pass1Stats()
    head_token_logits(model, ids, HEADS, rows, stats=told, go_on=lambda tl: False, cache=DynamicCache(config=model.config))
    assert told.layers_run == [0, 1, 2] and told.layers_continued == []
    with pytest.raises(ValueError, match="go together"):
        head_token_logits(model, ids, HEADS, rows, go_on=lambda tl: True)


@pytest.mark.parametrize("family", FAMILIES + LAYERED_FAMILIES)
def test_reused_prefill_gives_the_full_pass2_answer(family, tokenizer):
    """On every family (Gemma 3: a sliding window shorter than the prompt): the same answer and
    gold log-prob with and without the reuse, for a call that falls back (everything but the
    last prompt token reused) and for calls moved in slot order (reused where the prefix pays).
    The heads sit on the last layer, so going on pays once the moved sentence starts after
    about 42 % of the prompt; which sentence random heads rank first differs by family, so
    head pairs and needle places are tried until a moved call reuses (every call tried is
    checked)."""
    model = tiny_model(family, len(tokenizer), attn_implementation="sdpa")
    one = ONE_MAP.with_(k_sharp=1.0)
    moved_reused = 0
    for heads in ([(3, 0), (3, 1)], [(3, 1), (3, 2)], [(3, 2), (3, 3)], [(3, 0), (3, 3)]):
        on = QGPM(model, tokenizer, heads=heads, config=one)
        off = QGPM(model, tokenizer, heads=heads, config=one, reuse_prefill=False)
        for cfg, where in ((FALLBACK, 12), *((one, w) for w in (2, 12, 24))):
            ctx = context(where)
            a = on.prepare(ctx, QUESTION, method="qgpm", config=cfg)
            b = off.prepare(ctx, QUESTION, method="qgpm", config=cfg)
            assert torch.equal(a.z, b.z) and torch.equal(a.plan.positions[0], b.plan.positions[0])
            pays = prefill_reuse_pays(a.plan.vanilla_prefix(), a.num_tokens, 3, 4)
            assert a.details["pass1_continued"] is pays and not b.details["pass1_continued"]
            assert pays or cfg is not FALLBACK
            ra = on.generate_prepared(a, max_new_tokens=6, score=" tangerine")
            rb = off.generate_prepared(b, max_new_tokens=6, score=" tangerine")
            want = min(a.plan.vanilla_prefix(), a.num_tokens - 1) if pays else 0  # generation computes the last prompt token
            assert ra.details["prefill_reused"] == want and rb.details["prefill_reused"] == 0
            moved_reused += not a.plan.is_standard() and want > 0
            assert ra.text == rb.text
            assert abs(ra.details["score_logprob"] - rb.details["score_logprob"]) < 1e-4
            assert ra.timings.prefill_s >= ra.details["prefill_continued_s"] and (ra.details["prefill_continued_s"] > 0) is (want > 0)
            # without score= too (generation straight from the reused cache), and streamed
            again = on.answer(ctx, QUESTION, config=cfg, max_new_tokens=6)
            assert again.text == rb.text and again.details["prefill_reused"] == want
            assert (f"{want} prompt tokens' prefill taken from pass 1" in again.to_html()) is (want > 0)
            with on.stream(ctx, QUESTION, config=cfg, max_new_tokens=6) as s:
                streamed = "".join(s)
            assert streamed == rb.text.strip() and s.result.details["prefill_reused"] == want
        if moved_reused:
            break
    assert moved_reused >= 1


def test_an_early_moved_sentence_stops_pass1_and_prefills_everything(tokenizer):
    """Where the first moved sentence comes too early for going on to pay, pass 1 stops at the
    deepest head's layer as without the reuse, and pass 2 prefills the whole prompt. (Four
    sentences move, so the first of them is early for most needle places; the random heads
    decide which, so the places are searched.)"""
    model = tiny_model("llama", len(tokenizer))
    cfg = ONE_MAP.with_(k_sharp=4.0)
    on = QGPM(model, tokenizer, heads=HEADS, config=cfg)
    deepest = max(layer for layer, _ in HEADS)
    stopped = 0
    for where in (0, 6, 12, 18):
        call = on.prepare(context(where), QUESTION, method="qgpm")
        if prefill_reuse_pays(call.plan.vanilla_prefix(), call.num_tokens, deepest, on.n_layers):
            continue
        stopped += 1
        assert call.prefill is None and not call.details["pass1_continued"] and call.details["layers_run"] == deepest + 1
        assert on.generate_prepared(call, max_new_tokens=2).details["prefill_reused"] == 0
    assert stopped >= 1


def test_replans_share_the_prefill_and_never_read_overwritten_states(tokenizer):
    """A prepared call and its replans share pass 1's cache: a generation that reused P tokens
    appends after them, so a later generation reuses at most P (its own answer still equals a
    full pass 2's)."""
    model = tiny_model("llama", len(tokenizer))
    on = QGPM(model, tokenizer, heads=HEADS, config=ONE_MAP)
    off = QGPM(model, tokenizer, heads=HEADS, config=ONE_MAP, reuse_prefill=False)
    ctx = context(22)
    still = on.prepare(ctx, QUESTION, method="qgpm", config=FALLBACK)
    moved = on.replan(still, ONE_MAP)
    prefix = moved.plan.vanilla_prefix()
    assert moved.prefill is still.prefill and 0 < prefix < still.num_tokens - 1
    ref_moved = off.generate_prepared(off.replan(off.prepare(ctx, QUESTION, method="qgpm", config=FALLBACK), ONE_MAP), max_new_tokens=4, score=" tangerine")
    ref_still = off.generate_prepared(off.prepare(ctx, QUESTION, method="qgpm", config=FALLBACK), max_new_tokens=4, score=" tangerine")
    first = on.generate_prepared(moved, max_new_tokens=4, score=" tangerine")
    assert first.details["prefill_reused"] == prefix
    second = on.generate_prepared(still, max_new_tokens=4, score=" tangerine")  # could reuse N - 1, only P is left
    assert second.details["prefill_reused"] == prefix
    assert abs(first.details["score_logprob"] - ref_moved.details["score_logprob"]) < 1e-4
    assert abs(second.details["score_logprob"] - ref_still.details["score_logprob"]) < 1e-4
    assert second.text == ref_still.text and first.text == ref_moved.text
    assert on.answer_logprob(ctx, QUESTION, " tangerine", config=FALLBACK) == pytest.approx(ref_still.details["score_logprob"], abs=1e-4)


def test_a_fault_in_generation_leaves_the_model_and_later_calls_right(tokenizer):
    from transformers import StoppingCriteria, StoppingCriteriaList

    class Boom(Exception):
        pass

    class RaiseAtStep2(StoppingCriteria):
        def __init__(self):
            self.n = 0

        def __call__(self, input_ids, scores, **kwargs):
            self.n += 1
            if self.n == 2:
                raise Boom
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    model = tiny_model("llama", len(tokenizer))
    on = QGPM(model, tokenizer, heads=HEADS, config=ONE_MAP)
    off = QGPM(model, tokenizer, heads=HEADS, config=ONE_MAP, reuse_prefill=False)
    call = on.prepare(context(12), QUESTION, method="qgpm", config=FALLBACK)
    with pytest.raises(Boom):
        on.generate_prepared(call, max_new_tokens=6, stopping_criteria=StoppingCriteriaList([RaiseAtStep2()]))
    assert all(not layer._forward_pre_hooks and not layer.self_attn._forward_pre_hooks for layer in decoder_layers(model))
    want = off.generate_prepared(off.prepare(context(12), QUESTION, method="qgpm", config=FALLBACK), max_new_tokens=6, score=" tangerine")
    got = on.generate_prepared(call, max_new_tokens=6, score=" tangerine")  # the same call again, after the fault
    assert got.text == want.text and abs(got.details["score_logprob"] - want.details["score_logprob"]) < 1e-4


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_a_fault_inside_a_forward_leaves_the_shared_prefill_usable(tokenizer, attn):
    """Stopped inside a decoder layer's forward, a generation leaves the layers it reached one
    token longer than the rest; the same prepared call answers as before the fault."""

    class Boom(Exception):
        pass

    model = tiny_model("llama", len(tokenizer), attn_implementation=attn)
    on = QGPM(model, tokenizer, heads=HEADS, config=ONE_MAP)
    call = on.prepare(context(12), QUESTION, method="qgpm", config=FALLBACK)
    want = on.generate_prepared(call, max_new_tokens=6, score=" tangerine")
    assert want.details["prefill_reused"] > 0

    def boom(module, args, kwargs):
        raise Boom

    hook = decoder_layers(model)[2].register_forward_pre_hook(boom, with_kwargs=True)
    try:
        with pytest.raises(Boom):
            on.generate_prepared(call, max_new_tokens=6)
    finally:
        hook.remove()
    assert len({layer.get_seq_length() for layer in call.prefill.cache.layers}) > 1  # the fault's uneven cache
    got = on.generate_prepared(call, max_new_tokens=6, score=" tangerine")
    assert got.text == want.text and abs(got.details["score_logprob"] - want.details["score_logprob"]) < 1e-4


def test_reuse_prefill_is_checked_and_an_unknown_attention_prefills_everything(tokenizer, caplog):
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    model = tiny_model("llama", len(tokenizer))
    with pytest.raises(TypeError, match="reuse_prefill"):
        QGPM(model, tokenizer, heads=HEADS, reuse_prefill="yes")
    with pytest.raises(TypeError, match="reuse_prefill"):
        QGPM.from_pretrained(reuse_prefill=1)  # before any weights load

    def causal_only(module, query, key, value, attention_mask, **kwargs):  # causal by position alone
        return sdpa_attention_forward(module, query, key, value, None, **kwargs)

    AttentionInterface.register("qgpm_test_prefix_unknown", causal_only)
    custom = tiny_model("llama", len(tokenizer), attn_implementation="qgpm_test_prefix_unknown")
    engine = QGPM(custom, tokenizer, heads=HEADS, config=FALLBACK)
    with caplog.at_level(logging.WARNING, logger="qgpm"):
        res = engine.answer(context(12), QUESTION, max_new_tokens=3)
        engine.answer(context(12), QUESTION, max_new_tokens=3)
    notes = [r for r in caplog.records if "reuse_prefill is not applied" in r.getMessage()]
    assert len(notes) == 1 and res.details["prefill_reused"] == 0 and not res.details["pass1_continued"]


@pytest.mark.real_model
def test_real_smollm2_reused_prefill_answers_as_a_full_pass2(smollm):
    """The embedded SmolLM2 with its shipped heads and preset, pass 1 at the model's precision
    (the only one the reuse applies to; the preset's "auto" keeps it for contexts within
    keep_length): a call that falls back reuses all but the last prompt token, and the answer
    and gold log-prob equal those of a full pass 2."""
    ctx = context(32, n=40)  # the needle late: moving it leaves most of the prompt in place
    exact = smollm.config.with_(relevance="heads", pass1_dtype=None)
    off = QGPM(smollm.model, smollm.tokenizer, heads=smollm.heads, config=exact, reuse_prefill=False)
    for cfg in (exact.with_(min_top_z=1e6), exact.with_(min_top_z=None, decisive_margin=None)):
        a = smollm.prepare(ctx, QUESTION, method="qgpm", config=cfg)
        b = off.prepare(ctx, QUESTION, method="qgpm", config=cfg)
        ra = smollm.generate_prepared(a, max_new_tokens=12, score=" tangerine")
        rb = off.generate_prepared(b, max_new_tokens=12, score=" tangerine")
        assert ra.text == rb.text
        assert abs(ra.details["score_logprob"] - rb.details["score_logprob"]) < 1e-3
        if a.plan.is_standard():
            assert ra.details["prefill_reused"] == a.num_tokens - 1
        else:
            assert "tangerine" in ra.text.lower()  # the needle moved next to the question
            assert ra.details["prefill_reused"] == a.plan.vanilla_prefix() > a.num_tokens // 2
