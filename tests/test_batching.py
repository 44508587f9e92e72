"""Many calls on one engine: answer_many keeps the requests' order and answers, aanswer bridges asyncio."""

from __future__ import annotations

import asyncio

import pytest

from qgpm import QGPM

from qgpm_testing import needle_context, NEEDLE_QUESTION, tiny_model


@pytest.fixture(scope="module")
def engine(tokenizer):
    return QGPM(tiny_model("llama", len(tokenizer)), tokenizer, heads=[(1, 0), (2, 1)])


def test_answer_many_keeps_order_and_answers(engine):
    reqs = [dict(context=needle_context(w, n=20), question=NEEDLE_QUESTION, method=m, max_new_tokens=5)
            for w, m in ((2, "vanilla"), (9, "qgpm"), (15, "vanilla"), (4, "qgpm"))]
    one_by_one = [engine.answer(**r).text for r in reqs]
    assert [r.text for r in engine.answer_many(reqs, max_concurrency=3)] == one_by_one
    assert [r.method for r in engine.answer_many(reqs)] == [r["method"] for r in reqs]
    assert asyncio.run(engine.aanswer(**reqs[1])).text == one_by_one[1]


def test_bad_batches_fail_before_any_call(engine, monkeypatch):
    monkeypatch.setattr(engine, "answer", lambda **kw: (_ for _ in ()).throw(AssertionError("a call ran")))
    with pytest.raises(TypeError, match="request 1"):
        engine.answer_many([{"context": "a", "question": "b"}, {"question": "b"}])
    with pytest.raises(TypeError, match="list of dicts"):
        engine.answer_many({"context": "a", "question": "b"})
    with pytest.raises(ValueError, match="max_concurrency"):
        engine.answer_many([], max_concurrency=True)
