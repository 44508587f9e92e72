"""Tests for qgpm.rerank: BM25, bundled MiniLM, cross-encoder wiring, LLM judge."""

from __future__ import annotations

import math
import socket
import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qgpm import rerank
from qgpm.rerank import (
    BM25Reranker,
    CrossEncoderReranker,
    EmbeddingReranker,
    LLMJudgeReranker,
    Reranker,
    get_reranker,
)

QUERY = "Who calibrated the new tide gauge at the north pier?"
GOLD = 2
PASSAGES = [
    "The harbor's winter ferry timetable starts on 3 November, with four daily crossings.",
    "The seagrass survey counted 412 juvenile cod in the eastern meadow.",
    "The new tide gauge at the north pier was calibrated by Ottilie Brandvold, a hydrographic engineer.",
    "Dredging of the inner basin was postponed because of the spring storms.",
]


def _argmax(xs: list[float]) -> int:
    return max(range(len(xs)), key=xs.__getitem__)


@pytest.fixture(scope="module")
def minilm() -> EmbeddingReranker:
    return get_reranker("minilm")  # type: ignore[return-value]


@pytest.fixture(scope="module")
def bm25() -> BM25Reranker:
    return get_reranker("bm25")  # type: ignore[return-value]


# ----------------------------------------------------------------- ranking quality


def test_bm25_ranks_gold_first(bm25):
    scores = bm25.score(QUERY, PASSAGES)
    assert len(scores) == len(PASSAGES)
    assert _argmax(scores) == GOLD
    assert all(math.isfinite(s) for s in scores)


def test_minilm_ranks_gold_first(minilm):
    scores = minilm.score(QUERY, PASSAGES)
    assert len(scores) == len(PASSAGES)
    assert _argmax(scores) == GOLD
    assert all(-1.0 - 1e-5 <= s <= 1.0 + 1e-5 for s in scores)


def test_minilm_scores_follow_passage_order(minilm):
    """Scores are returned in passage order, not sorted."""
    fwd = minilm.score(QUERY, PASSAGES)
    rev = minilm.score(QUERY, PASSAGES[::-1])
    assert rev == pytest.approx(fwd[::-1], abs=1e-5)
    assert [minilm.score(QUERY, [p])[0] for p in PASSAGES] == pytest.approx(fwd, abs=1e-5)


# ----------------------------------------------------------------- edge cases


@pytest.mark.parametrize("name", ["bm25", "minilm"])
def test_empty_passages_give_empty_list(name):
    assert get_reranker(name).score(QUERY, []) == []


@pytest.mark.parametrize("name", ["bm25", "minilm"])
def test_one_passage(name):
    scores = get_reranker(name).score(QUERY, [PASSAGES[GOLD]])
    assert len(scores) == 1 and math.isfinite(scores[0])
    if name == "bm25":
        assert scores[0] > 0.0


@pytest.mark.parametrize("name", ["bm25", "minilm", "judge"])
@pytest.mark.parametrize("query", ["", "   \n\t"])
def test_empty_query_raises(name, query):
    with pytest.raises(ValueError, match="query is empty"):
        get_reranker(name).score(query, PASSAGES)


def test_bare_string_passages_rejected(bm25):
    with pytest.raises(TypeError, match="not a single str"):
        bm25.score(QUERY, "one passage")


def test_bm25_no_overlap_gives_all_zeros(bm25):
    """Documented behaviour: no shared (non-stopword) term -> exactly 0.0 everywhere."""
    assert bm25.score("xylophone zeppelin quokka", PASSAGES) == [0.0] * len(PASSAGES)
    assert bm25.score("what is the", PASSAGES) == [0.0] * len(PASSAGES)  # stopwords only


def test_bm25_handles_empty_and_stopword_passages(bm25):
    scores = bm25.score(QUERY, ["", "the of and", PASSAGES[GOLD]])
    assert scores[0] == 0.0 and scores[1] == 0.0 and scores[2] > 0.0


def test_bm25_does_not_print_debug_lines_at_info(bm25, caplog):
    """bm25s sets its logger to DEBUG on import; an app logging at INFO must not get
    "Building index from IDs" on every call (QGPM's term filter scores every prompt)."""
    import logging

    with caplog.at_level(logging.INFO):
        bm25.score(QUERY, PASSAGES)
    assert not [r for r in caplog.records if r.name.startswith("bm25s")]
    assert logging.getLogger("bm25s").getEffectiveLevel() == logging.getLogger().getEffectiveLevel()


@pytest.mark.parametrize("when", ["before", "after"])
def test_bm25_keeps_a_level_the_application_sets_on_its_logger(bm25, monkeypatch, when):
    """Only bm25s's own DEBUG-on-import is put back, and only the first time: a level the
    application sets on the ``bm25s`` logger, before the first BM25 call or after it, is kept."""
    import logging

    from qgpm import lexical

    log = logging.getLogger("bm25s")
    monkeypatch.setattr(log, "level", log.level)  # restored after the test
    if when == "before":
        monkeypatch.setattr(lexical, "_QUIETED", False)  # as in a process that has not scored with BM25 yet
        log.setLevel(logging.ERROR)
        bm25.score(QUERY, PASSAGES)
        assert log.level == logging.ERROR
    else:
        bm25.score(QUERY, PASSAGES)
        log.setLevel(logging.DEBUG)  # the application asks for bm25s's debug lines
        bm25.score(QUERY, PASSAGES)
        assert log.level == logging.DEBUG


def test_minilm_no_overlap_is_finite(minilm):
    scores = minilm.score("xylophone zeppelin quokka", PASSAGES)
    assert len(scores) == len(PASSAGES) and all(math.isfinite(s) for s in scores)


# ----------------------------------------------------------------- factory


def test_get_reranker_aliases_and_cache():
    assert get_reranker("minilm") is get_reranker("embedding")
    assert get_reranker("bm25") is get_reranker(" BM25 ")
    judge = get_reranker("judge")
    assert judge is get_reranker("llm-judge") is get_reranker("judge:smollm2")
    assert isinstance(judge, LLMJudgeReranker) and judge.name == "judge:SmolLM2-135M-Instruct"
    assert isinstance(get_reranker("bm25"), Reranker)


def test_get_reranker_model_specs_are_lazy():
    """A judge spec with a model id builds the reranker without loading (or downloading) it."""
    r = get_reranker("llm-judge:Qwen/Qwen3-Reranker-4B")
    assert r is get_reranker("judge: Qwen/Qwen3-Reranker-4B")
    assert isinstance(r, LLMJudgeReranker) and r.qwen3_format and r._model is None
    assert r.name == "judge:Qwen3-Reranker-4B"
    assert get_reranker("judge:SmolLM2-135M-Instruct") is get_reranker("judge")


def test_get_reranker_passes_instances_through():
    r = BM25Reranker(k1=1.2)
    assert get_reranker(r) is r


@pytest.mark.parametrize("spec", ["nope", "cross-encoder:", "bm26"])
def test_get_reranker_unknown_lists_choices(spec):
    with pytest.raises(ValueError) as err:
        get_reranker(spec)
    msg = str(err.value)
    for choice in ("bm25", "minilm", "judge", "cross-encoder:<path-or-id>"):
        assert choice in msg


def test_check_reranker_spec_names_what_get_reranker_accepts_without_building_it(monkeypatch):
    monkeypatch.setattr(rerank, "_RERANKERS", {})
    for spec in ("bm25", " BM25 ", "minilm", "embedding", "embedding:some/model", "judge", "llm-judge", "judge:some/model",
                 "cross-encoder:some/model"):
        assert rerank.check_reranker_spec(spec) == spec
    r = BM25Reranker()
    assert rerank.check_reranker_spec(r) is r
    for spec in ("minlm", "nope", "cross-encoder:", "bm25:", "bm26"):
        with pytest.raises(ValueError, match="unknown reranker"):
            rerank.check_reranker_spec(spec)
    with pytest.raises(TypeError, match="a spec string or a Reranker"):
        rerank.check_reranker_spec(42)
    assert rerank._RERANKERS == {}  # nothing was built


def test_get_reranker_rejects_other_types():
    with pytest.raises(TypeError):
        get_reranker(42)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "module, factory, hint",
    [("bm25s", BM25Reranker, r"one of qgpm's own dependencies.*pip install 'bm25s"),  # core: the preset's term filter needs it
     ("sentence_transformers", EmbeddingReranker, r"one of qgpm's own dependencies.*sentence-transformers"),
     ("sentence_transformers", lambda: CrossEncoderReranker("x"), r"one of qgpm's own dependencies.*sentence-transformers")],
)
def test_missing_dependencies_point_to_install_hint(monkeypatch, module, factory, hint):
    import sys

    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` fail
    with pytest.raises(ImportError, match=hint):
        factory()


# ----------------------------------------------------------------- offline safety


def test_minilm_loads_without_network(monkeypatch):
    """The bundled MiniLM comes from its local folder: any network access fails the test."""

    def no_network(*args, **kwargs):
        raise AssertionError("network access attempted while loading the bundled MiniLM")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    r = EmbeddingReranker()
    assert _argmax(r.score(QUERY, PASSAGES)) == GOLD


def test_bundled_minilm_path_points_into_package():
    path = rerank.bundled_minilm_path()
    assert path.name == "model" and (path / "config.json").is_file()


def test_cross_encoder_from_local_folder(tmp_path):
    """Wiring test on a tiny random BERT cross-encoder saved locally (no weights download)."""
    import shutil

    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)

    src = rerank.bundled_minilm_path()
    for f in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(src / f, tmp_path / f)
    cfg = BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, num_labels=1,
        initializer_range=0.5,  # large random weights, so passages get clearly different scores
    )
    BertForSequenceClassification(cfg).save_pretrained(tmp_path)
    r = CrossEncoderReranker(tmp_path)
    assert r.name.startswith("cross-encoder:")
    scores = r.score(QUERY, PASSAGES)
    assert len(scores) == len(PASSAGES) and all(math.isfinite(s) for s in scores)
    assert r.score(QUERY, []) == []
    alone = [r.score(QUERY, [p])[0] for p in PASSAGES]  # scores map to their own passages
    assert alone == pytest.approx(scores, abs=1e-5)
    assert max(scores) - min(scores) > 1e-3


# ----------------------------------------------------------------- LLM judge (no weights)


def test_qwen3_reranker_detected_from_name_without_loading():
    r = LLMJudgeReranker("Qwen/Qwen3-Reranker-4B")
    assert r.qwen3_format and r._model is None
    assert not LLMJudgeReranker("HuggingFaceTB/SmolLM2-360M-Instruct").qwen3_format


def test_qwen3_raw_prompt_layout():
    """The raw prompt is exactly the Qwen3-Reranker model-card layout."""
    r = LLMJudgeReranker(object(), tokenizer=object(), instruction="Find the answer", qwen3_format=True)
    before, after = r.prompt_parts("Q?")
    expected = (
        "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
        'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
        "<Instruct>: Find the answer\n<Query>: Q?\n<Document>: some doc"
        "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    assert before + " some doc" + after == expected


@pytest.mark.parametrize("kwargs", [{"batch_size": 0}, {"max_length": 4}, {"instruction": "  "}])
def test_judge_bad_settings(kwargs):
    with pytest.raises(ValueError):
        LLMJudgeReranker(**kwargs)


# ----------------------------------------------------------------- LLM judge on SmolLM2


@pytest.fixture(scope="module")
def judge() -> LLMJudgeReranker:
    return get_reranker("judge").load()  # type: ignore[union-attr]


# Obvious question / answer-sentence pairs; each answer is a distractor for the other questions.
FACTS = [
    ("What is the capital of France?", "Paris is the capital of France."),
    ("Which planet is known as the Red Planet?", "Mars is known as the Red Planet."),
    ("Who calibrated the new tide gauge?", "The new tide gauge was calibrated by Ottilie Brandvold."),
    ("How many juvenile cod did the survey count?", "The survey counted 412 juvenile cod."),
    ("When does the winter ferry timetable start?", "The winter ferry timetable starts on 3 November."),
    ("What color is the sky on a clear day?", "The sky is blue on a clear day."),
]


@pytest.mark.real_model
def test_judge_smollm2_scores_are_probabilities(judge):
    scores = judge.score(QUERY, PASSAGES)
    assert len(scores) == len(PASSAGES)
    assert all(math.isfinite(s) and 0.0 < s < 1.0 for s in scores)
    assert judge.score(QUERY, []) == []
    one = judge.score(QUERY, [PASSAGES[GOLD]])
    assert len(one) == 1 and one[0] == pytest.approx(scores[GOLD], abs=1e-4)


@pytest.mark.real_model
def test_judge_smollm2_prefers_the_answer_sentence(judge):
    """SmolLM2-135M is a weak judge: it does not reliably put the gold first among
    similar sentences, but over a small question x answer matrix the answer beats the
    other answers in most pairs (measured 0.77 here; swapping yes/no gives 0.23)."""
    answers = [a for _, a in FACTS]
    wins = pairs = 0
    gold_mean = other_mean = 0.0
    for qi, (question, _) in enumerate(FACTS):
        scores = judge.score(question, answers)
        assert all(0.0 < s < 1.0 for s in scores)
        for di, s in enumerate(scores):
            if di == qi:
                gold_mean += s / len(FACTS)
            else:
                pairs += 1
                wins += scores[qi] > s
                other_mean += s / (len(FACTS) * (len(FACTS) - 1))
    assert wins / pairs >= 0.65
    assert gold_mean > other_mean


@pytest.mark.real_model
def test_judge_score_independent_of_batching(judge):
    """Left padding + mask-derived position ids: a passage's score does not depend on its batch."""
    ref = judge.score(QUERY, PASSAGES)
    small = LLMJudgeReranker(judge.model, judge.tokenizer, batch_size=1)
    assert small.score(QUERY, PASSAGES) == pytest.approx(ref, abs=1e-4)


@pytest.mark.real_model
def test_judge_truncates_long_passages_from_the_end(judge):
    short = LLMJudgeReranker(judge.model, judge.tokenizer, max_length=160)
    long_doc = PASSAGES[GOLD] + " " + " ".join(["The pier was repainted in blue."] * 200)
    longer_doc = long_doc + " Completely different trailing text about volcanoes." * 50
    a, b = short.score(QUERY, [long_doc, longer_doc])
    assert math.isfinite(a) and a == pytest.approx(b, abs=1e-5)
    with pytest.raises(ValueError, match="query too long"):
        short.score(" ".join(["word"] * 400) + "?", PASSAGES)


@pytest.mark.real_model
def test_judge_prompt_pieces_tokenize_like_the_full_prompt(judge):
    """prefix + passage + suffix token ids equal a joint tokenization of the prompt."""
    tok = judge.tokenizer
    before, after = judge.prompt_parts(QUERY)
    doc = PASSAGES[GOLD]
    pieces = (
        tok.encode(before, add_special_tokens=False)
        + tok.encode(" " + doc, add_special_tokens=False)
        + tok.encode(after, add_special_tokens=False)
    )
    assert pieces == tok.encode(before + " " + doc + after, add_special_tokens=False)
    assert before.startswith("<|im_start|>system\nJudge whether the Document")
    assert after.endswith("<|im_start|>assistant\n")


def test_term_filter_without_bm25s_fails_before_pass_1(monkeypatch, tokenizer):
    """The preset's query-term filter needs bm25s: a broken install is reported before any
    forward pass, with the install hint, and the model is left as it was."""
    import sys

    from qgpm import QGPM, QGPMConfig

    from qgpm_testing import tiny_model

    engine = QGPM(tiny_model("llama", len(tokenizer)), tokenizer, heads=[(1, 0)])
    calls = []
    from qgpm.runtime import decoder_layers

    hook = decoder_layers(engine.model)[0].register_forward_pre_hook(lambda *a: calls.append(1))  # pass 1 runs the layers
    monkeypatch.setitem(sys.modules, "bm25s", None)
    with pytest.raises(ImportError, match="bm25s"):
        engine.answer(" ".join(f"Sentence {i} is here." for i in range(8)), "Which sentence?", config=QGPMConfig(term_ratio=0.6), max_new_tokens=2)
    assert calls == []
    engine.answer(" ".join(f"Sentence {i} is here." for i in range(8)), "Which sentence?", config=QGPMConfig.paper(),
                  max_new_tokens=2)  # without the filter it runs
    assert calls
    hook.remove()


def test_the_query_term_filter_and_the_bm25_reranker_share_one_scorer(monkeypatch):
    """qgpm.lexical.bm25_scores is the one BM25: the reranker and the plan's term filter both call it."""
    import qgpm.lexical
    import qgpm.preparing
    import qgpm.rerank
    from qgpm.config import QGPMConfig

    calls = []
    real = qgpm.lexical.bm25_scores

    def spy(query, passages, **kw):
        calls.append(len(passages))
        return real(query, passages, **kw)

    monkeypatch.setattr(qgpm.rerank, "bm25_scores", spy)
    monkeypatch.setattr(qgpm.preparing, "bm25_scores", spy)
    passages = ["the blue door password is tangerine", "bread is baked daily", "the market opens early"]
    assert BM25Reranker().score("password for the blue door", passages) == real("password for the blue door", passages)
    prompt = types.SimpleNamespace(question_text="password for the blue door", sentences=[types.SimpleNamespace(text=p) for p in passages])
    lexical = qgpm.preparing._unit_lexical(prompt, QGPMConfig(term_ratio=0.6))
    assert lexical.tolist() == real("password for the blue door", passages) and calls == [3, 3]
    assert lexical.argmax().item() == 0


# ----------------------------------------------------------------------------- BM25 terms beyond English


@pytest.mark.parametrize("text, want", [
    ("The U.S. had 3.14 v2.1.0 hello_world", ["the", "had", "14", "v2", "hello_world"]),  # as before: words of 2+ characters
    ("中国的首都", ["中国", "国的", "的首", "首都"]),  # no spaces: overlapping pairs
    ("iPhone 的价格", ["iphone", "的价", "价格"]),
    ("भारत की राजधानी", ["भारत", "की", "राजधानी"]),  # vowel signs stay in their word
    ("ｉＰｈｏｎｅ noe\u0308l", ["iphone", "noël"]),  # NFKC: full-width letters, composed accents
    ("猫", ["猫"]),
])
def test_bm25_terms(text, want):
    from qgpm.lexical import words

    assert words(text.lower()) == want


def test_bm25_matches_chinese_and_decomposed_accents():
    from qgpm.lexical import bm25_scores

    price = bm25_scores("iPhone 的价格是多少？", ["iPhone 于 2023 年发布。", "它的价格是 999 美元。"])
    assert price[1] > price[0] > 0  # the sentence that holds 价格 (price) ranks first
    assert bm25_scores("Noël", ["Noe\u0308l arrived.", "Nothing here."])[0] > 0
    assert bm25_scores("Where is the key?", ["The key is blue.", "Nothing here."]) [1] == 0.0


@given(st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=200))
@settings(max_examples=200, deadline=None)
def test_bm25_terms_of_ascii_text_are_the_bm25s_default_ones(text):
    """On ASCII text the terms are bm25s' own default (words of two or more word characters)."""
    import re

    from qgpm.lexical import words

    assert words(text.lower()) == re.findall(r"(?u)\b\w\w+\b", text.lower())
