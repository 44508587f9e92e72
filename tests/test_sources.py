"""QGPMConfig.relevance: sentence relevance from the heads, a reranker, or both."""

from __future__ import annotations

import pytest
import torch

from qgpm import QGPM, QGPMConfig
from qgpm.rerank import BM25Reranker
from qgpm.sources import fuse_sources, parse_source, reranker_relevance
from qgpm_testing import NEEDLE, NEEDLE_QUESTION, needle_context, tiny_model


@pytest.mark.parametrize("spec, heads, reranker", [
    ("heads", True, None), ("HEADS", True, None), ("minilm", False, "minilm"), ("bm25", False, "bm25"),
    ("heads+bm25", True, "bm25"), ("cross-encoder:/models/ce", False, "cross-encoder:/models/ce"),
])
def test_parse_source(spec, heads, reranker):
    s = parse_source(spec)
    assert (s.heads, s.reranker) == (heads, reranker)


@pytest.mark.parametrize("bad", ["", "  ", None, 3, "bm25+heads", "heads+", "heads+heads", "heads+bm25+minilm"])
def test_bad_source_is_rejected_by_the_config(bad):
    with pytest.raises(ValueError, match="relevance"):
        QGPMConfig(relevance=bad)


def test_reranker_relevance_is_the_standardized_score():
    sentences = ["The door is blue.", "The password for the blue door is tangerine.", "Cats sleep a lot."]
    z = reranker_relevance(BM25Reranker(), "What is the password for the blue door?", sentences)
    raw = torch.tensor(BM25Reranker().score("What is the password for the blue door?", sentences), dtype=torch.float64)
    assert torch.allclose(z, (raw - raw.mean()) / raw.std(unbiased=False))
    assert int(z.argmax()) == 1
    assert torch.equal(fuse_sources(z, -z), torch.zeros(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="fuse"):
        fuse_sources(z, z[:2])


def test_reranker_source_runs_no_pass1_and_needs_no_head_set(tokenizer, monkeypatch, one_thread):
    model = tiny_model("llama", len(tokenizer))
    engine = QGPM(model, tokenizer, name="model-without-heads")  # no head set stored for it
    context = needle_context(5)
    cfg = QGPMConfig(relevance="bm25", remap="reorder", split_layer=0, k_sharp=1.0, k_broad=2.0)
    from qgpm import HeadSetMissingError

    with pytest.raises(HeadSetMissingError):
        engine.answer(context, NEEDLE_QUESTION, config=cfg.with_(relevance="heads"), max_new_tokens=2)
    with pytest.raises(HeadSetMissingError):
        engine.answer(context, NEEDLE_QUESTION, config=cfg.with_(relevance="heads+bm25"), max_new_tokens=2)

    def no_pass1(*a, **k):
        raise AssertionError("pass 1 must not run with a reranker source")

    monkeypatch.setattr("qgpm.pass1.head_token_logits", no_pass1)
    res = engine.answer(context, NEEDLE_QUESTION, config=cfg, max_new_tokens=2)
    assert res.details["relevance_source"] == "bm25" and res.details["layers_run"] == 0 and res.details["heads"] == 0
    assert res.top_sentences(1)[0].text == NEEDLE
    assert "ranked by bm25" in res.explain()
    call = engine.prepare(context, NEEDLE_QUESTION, config=cfg)
    expected = reranker_relevance(BM25Reranker(), call.prompt.question_text, [s.text for s in call.prompt.sentences])
    assert torch.equal(call.z, expected)


def test_chosen_heads_that_the_config_does_not_read_are_said_once(tokenizer, caplog, one_thread):
    model = tiny_model("llama", len(tokenizer))
    cfg = QGPMConfig(relevance="bm25", remap="reorder", split_layer=0, keep_length=0.0)
    context = needle_context(5)
    stored = QGPM(model, tokenizer, name="model-without-heads", config=cfg)  # no head set given: nothing to say
    with caplog.at_level("WARNING", logger="qgpm"):
        stored.answer(context, NEEDLE_QUESTION, max_new_tokens=2)
    assert "reads no head" not in caplog.text
    engine = QGPM(model, tokenizer, name="model-without-heads", heads=[(0, 0), (1, 1)], config=cfg)
    with caplog.at_level("WARNING", logger="qgpm"):
        engine.answer(context, NEEDLE_QUESTION, max_new_tokens=2)
        engine.answer(context, NEEDLE_QUESTION, max_new_tokens=2)
        engine.answer(context, NEEDLE_QUESTION, config=cfg.with_(relevance="heads+bm25"), max_new_tokens=2)
    assert caplog.text.count("relevance='bm25', which reads no head") == 1


@pytest.mark.parametrize("spec", ["nosuch", "minlm", "heads+nope", "bm25:x", "cross-encoder", "cross-encoder:"])
def test_unknown_relevance_source_fails_when_the_config_is_built(spec):
    with pytest.raises(ValueError, match=r"is not a relevance source; use 'heads', a reranker \(bm25, minilm"):
        QGPMConfig(relevance=spec)


@pytest.mark.parametrize("spec", ["embedding", "llm-judge", "judge:some/model", "cross-encoder:some/model", "heads+Embedding:/a/path"])
def test_known_reranker_kinds_build_without_loading(spec, monkeypatch):
    from qgpm import rerank

    monkeypatch.setattr(rerank, "_RERANKERS", {})
    assert QGPMConfig(relevance=spec).relevance == spec
    assert rerank._RERANKERS == {}  # nothing was built


def test_unknown_reranker_fails_before_model_work(tokenizer, monkeypatch):
    engine = QGPM(tiny_model("llama", len(tokenizer)), tokenizer, heads=[(0, 0)])
    monkeypatch.setattr("qgpm.preparing.build_prompt", lambda *a, **k: (_ for _ in ()).throw(AssertionError("no prompt work")))
    monkeypatch.setattr("qgpm.preparing.edit_context", lambda *a, **k: (_ for _ in ()).throw(AssertionError("no context edit")))
    for method in ("topk", "reorder"):
        with pytest.raises(ValueError, match="unknown reranker 'nosuch'; choose one of: bm25, minilm"):
            engine.answer("A. B.", "q?", method=method, reranker="nosuch")


@pytest.mark.real_model
def test_fused_source_on_the_real_model(smollm, one_thread):
    context = needle_context(9)
    cfg = smollm.config.with_(relevance="heads+bm25", pass1_dtype=None)
    call = smollm.prepare(context, NEEDLE_QUESTION, config=cfg)
    heads_only = smollm.prepare(context, NEEDLE_QUESTION, config=cfg.with_(relevance="heads"))
    bm25 = reranker_relevance(BM25Reranker(), call.prompt.question_text, [s.text for s in call.prompt.sentences])
    assert torch.allclose(call.z, (heads_only.z + bm25) / 2)
    assert call.details["relevance_source"] == "heads+bm25" and call.details["layers_run"] > 0
    assert "relevance_source" not in heads_only.details
    res = smollm.generate_prepared(call, max_new_tokens=8)
    assert res.top_sentences(1)[0].text == NEEDLE
