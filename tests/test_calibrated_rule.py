"""The recipe a model without a preset gets, and its confidence rule in the model's own z units."""

from __future__ import annotations

import logging

import pytest

from qgpm import QGPM, HeadSet, QGPMConfig
from qgpm.calibrate import separating_cut
from qgpm.config import CALIBRATED, PRESETS, RECIPE, SMOLLM2_KEY
from qgpm.thresholds import calibrated_min_top_z, reranker_confidence

from qgpm_testing import tiny_model

CONTEXT = " ".join(f"Sentence {i} tells that the stall number {i} sold bread and cheese all day long." for i in range(60))
QUESTION = "What did stall number 7 sell?"
MOVING = dict(keep_length=0.0, term_ratio=None)  # a short context that the recipe would otherwise keep as it is
HEADS = dict(relevance="heads", **MOVING)  # the model's own heads rank (the recipe ranks with MiniLM)


def engine_with(tokenizer, confidence: dict | None) -> QGPM:
    meta = {"confidence": confidence} if confidence is not None else {}
    model = tiny_model("llama", len(tokenizer))
    return QGPM(model, tokenizer, heads=HeadSet("tiny", [(1, 0), (2, 1)], meta=meta))


def test_the_recipe_is_what_a_model_without_a_preset_gets(tokenizer):
    engine = engine_with(tokenizer, None)
    assert engine.config is RECIPE and RECIPE.remap == "reorder" and RECIPE.split_layer == 0 and RECIPE.min_top_z == CALIBRATED
    smollm2 = PRESETS[SMOLLM2_KEY]  # the recipe is the SmolLM2 preset but for the threshold (SmolLM2's z units) and the relevance source
    assert RECIPE.with_(min_top_z=smollm2.min_top_z, relevance=smollm2.relevance, provenance=smollm2.provenance) == smollm2
    assert smollm2 == QGPMConfig(k_sharp=4.0, s_low=0.45, anchor_ratio=2.0, min_top_z=2.5, keep_length=1024.0, remap="reorder", split_layer=0,
                                 term_ratio=0.6, split_run_ons=True, pass1_dtype="auto", relevance="minilm")  # the preset's values, written out
    assert RECIPE.relevance == "minilm"  # a model without a preset ranks with MiniLM: no pass 1, no head set needed
    assert QGPMConfig.paper().remap == "stride" and QGPMConfig(min_top_z=CALIBRATED).min_top_z == CALIBRATED
    with pytest.raises(ValueError, match="'calibrated'"):
        QGPMConfig(min_top_z="calibrate")
    with pytest.raises(ValueError, match="finite z-score"):
        QGPMConfig(min_top_z=True)


def test_the_head_sets_threshold_decides_flat_calls(tokenizer):
    high = engine_with(tokenizer, {"min_top_z": 1e6})
    res = high.answer(CONTEXT, QUESTION, config=high.config.with_(**HEADS), max_new_tokens=2)
    assert res.details["flat_relevance"]
    low = engine_with(tokenizer, {"min_top_z": -1e6})
    res = low.answer(CONTEXT, QUESTION, config=low.config.with_(**HEADS), max_new_tokens=2)
    assert not res.details["flat_relevance"]
    assert high.head_set.min_top_z == 1e6 and engine_with(tokenizer, None).head_set.min_top_z is None
    assert res.details.min_top_z == -1e6  # each call says which threshold it applied


def test_each_call_names_the_threshold_it_applied(tokenizer):
    from qgpm.thresholds import calibrated_min_top_z

    eng = engine_with(tokenizer, {"min_top_z": 1.5})
    minilm = calibrated_min_top_z("minilm", None)[0]
    assert minilm is not None
    assert eng.answer(CONTEXT, QUESTION, config=eng.config.with_(**HEADS), max_new_tokens=2).details.min_top_z == 1.5
    assert eng.answer(CONTEXT, QUESTION, config=RECIPE, max_new_tokens=2).details.min_top_z == minilm  # the recipe's MiniLM
    off = eng.answer(CONTEXT, QUESTION, config=eng.config.with_(relevance="bm25", **MOVING), max_new_tokens=2)
    assert off.details.min_top_z is None  # no threshold for BM25: the rule was off


def test_no_threshold_turns_the_rule_off_with_a_warning(tokenizer, caplog):
    none = engine_with(tokenizer, None)
    high = engine_with(tokenizer, {"min_top_z": 1e6})
    with caplog.at_level(logging.WARNING, logger="qgpm"):
        res = none.answer(CONTEXT, QUESTION, config=none.config.with_(**HEADS), max_new_tokens=2)
        bm25 = high.answer(CONTEXT, QUESTION, config=high.config.with_(relevance="bm25", **MOVING), max_new_tokens=2)
    assert not res.details["flat_relevance"] and not bm25.details["flat_relevance"]
    notes = [r.getMessage() for r in caplog.records if "min_top_z='calibrated' has no threshold" in r.getMessage()]
    assert any("stores no calibrated threshold" in n for n in notes) and any("reranker 'bm25'" in n for n in notes)
    # a set calibrated where no cut separated its samples: recalibrating the same way would not help
    caplog.clear()
    unseparated = engine_with(tokenizer, {"min_top_z": None, "found_top_z": [3.0, 4.0], "missed_top_z": []})
    with caplog.at_level(logging.WARNING, logger="qgpm"):
        unseparated.answer(CONTEXT, QUESTION, config=unseparated.config.with_(**HEADS), max_new_tokens=2)
    said = [r.getMessage() for r in caplog.records if "has no threshold" in r.getMessage()]
    assert said and "no threshold separated its samples" in said[0] and "set min_top_z" in said[0] and "recalibrate it" not in said[0]
    hand_made = engine_with(tokenizer, {"min_top_z": None})  # a confidence entry no calibration wrote: recalibrating is the advice
    assert "recalibrate it" in calibrated_min_top_z("heads", hand_made.head_set)[1]


def test_the_eval_fingerprint_names_the_calibrated_threshold(tokenizer):
    from qgpm.eval.hashes import config_hash, method_fingerprint

    a, b = engine_with(tokenizer, {"min_top_z": 1.5}), engine_with(tokenizer, {"min_top_z": 2.0})
    heads = RECIPE.with_(relevance="heads")
    fa, fb = method_fingerprint(a, "qgpm", config=heads), method_fingerprint(b, "qgpm", config=heads)
    assert fa["calibrated_min_top_z"] == 1.5 and config_hash(fa) != config_hash(fb)
    assert "calibrated_min_top_z" not in method_fingerprint(a, "qgpm", config=QGPMConfig.paper())


def test_separating_cut():
    assert separating_cut([3.0, 3.5, 4.0], [1.0, 2.0]) == (2.5, 1.0)
    t, j = separating_cut([1.0, 3.0, 3.5], [1.2, 2.0])  # one found value among the missed ones
    assert t == 2.5 and j == pytest.approx(2 / 3)
    assert separating_cut([1.0], []) is None and separating_cut([], [1.0]) is None


def test_the_shipped_head_sets_carry_their_thresholds():
    from qgpm.heads import shipped_head_dir

    for name in ("smollm2-135m-instruct.json", "gemma-3-270m.json"):
        hs = HeadSet.load(shipped_head_dir() / name)
        conf = hs.meta["confidence"]
        assert conf["samples"] == 54 and conf["min_top_z"] == hs.min_top_z
        assert separating_cut(conf["found_top_z"], conf["missed_top_z"])[0] == pytest.approx(hs.min_top_z, abs=1e-3)


def test_a_reranker_source_reads_the_rerankers_own_threshold_not_the_head_sets(tokenizer, monkeypatch):
    import qgpm.thresholds as thresholds

    engine = engine_with(tokenizer, {"min_top_z": -1e6})  # the heads' threshold would never call a context flat
    cfg = engine.config.with_(relevance="minilm", **MOVING)
    monkeypatch.setattr(thresholds, "reranker_confidence", lambda name: {"min_top_z": 1e6} if name == "minilm" else None)
    assert engine.answer(CONTEXT, QUESTION, config=cfg, max_new_tokens=2).details["flat_relevance"]
    monkeypatch.setattr(thresholds, "reranker_confidence", lambda name: {"min_top_z": -1e6} if name == "minilm" else None)
    assert not engine.answer(CONTEXT, QUESTION, config=cfg, max_new_tokens=2).details["flat_relevance"]


def test_the_shipped_minilm_threshold_decides_on_minilms_top_z(tokenizer):
    from qgpm.rerank import get_reranker
    from qgpm.sources import reranker_relevance

    engine = engine_with(tokenizer, {"min_top_z": 1e6})
    threshold = calibrated_min_top_z("minilm", engine.head_set)[0]
    harbor = ("The harbor opened in 1820. Gulls nest on the old pier. The ferry leaves at noon. Fishermen mend nets in spring. "
              "The lighthouse was painted red. A storm closed the port in 1901. The market sells smoked fish. "
              "The ferry office stands by the customs house.")
    flat = []
    for question in ("When did the harbor open?", "What is the capital of Peru?"):
        res = engine.answer(harbor, question, config=engine.config.with_(relevance="minilm", **MOVING), max_new_tokens=2)
        prompt_sentences = [s.text for s in sorted(res.relevance, key=lambda s: s.index)]
        top = float(reranker_relevance(get_reranker("minilm"), question, prompt_sentences).max())
        assert res.details["flat_relevance"] == (top < threshold), (question, top, threshold)
        flat.append(res.details["flat_relevance"])
    assert flat == [False, True]  # one sentence answers the first question; none the second


def test_calibrated_min_top_z_by_source():
    high = HeadSet("tiny", [(1, 0)], meta={"confidence": {"min_top_z": 3.25}})
    conf = reranker_confidence("minilm")
    assert conf is not None and conf["relevance"] == "minilm" and conf["samples"] == 54
    assert separating_cut(conf["found_top_z"], conf["missed_top_z"])[0] == pytest.approx(conf["min_top_z"], abs=1e-3)
    assert calibrated_min_top_z("minilm", high) == (conf["min_top_z"], None)
    assert calibrated_min_top_z("embedding", None) == (conf["min_top_z"], None)  # the same reranker spelled otherwise
    assert calibrated_min_top_z("heads", high) == (3.25, None)
    value, why = calibrated_min_top_z("heads", HeadSet("tiny", [(1, 0)]))
    assert value is None and "qgpm calibrate" in why
    value, why = calibrated_min_top_z("bm25", high)
    assert value is None and "--relevance bm25 --write" in why
    value, why = calibrated_min_top_z("heads+minilm", high)
    assert value is None and "fuses" in why
    assert reranker_confidence("cross-encoder:/some/path") is None


def test_the_eval_fingerprint_names_the_sources_threshold(tokenizer):
    from qgpm.eval.hashes import config_hash, method_fingerprint

    engine = engine_with(tokenizer, {"min_top_z": 1.5})
    minilm = method_fingerprint(engine, "qgpm", config=RECIPE.with_(relevance="minilm"))
    assert minilm["calibrated_min_top_z"] == reranker_confidence("minilm")["min_top_z"]
    assert method_fingerprint(engine, "qgpm", config=RECIPE.with_(relevance="heads+bm25"))["calibrated_min_top_z"] is None
    assert config_hash(minilm) != config_hash(method_fingerprint(engine, "qgpm", config=RECIPE.with_(relevance="minilm", min_top_z=None)))


def test_flat_relevance_threshold_checks_its_source_first(tokenizer):
    from qgpm.calibrate import flat_relevance_threshold

    engine = engine_with(tokenizer, None)
    with pytest.raises(ValueError, match="not a fusion"):
        flat_relevance_threshold(engine, [], [(1, 0)], relevance="heads+bm25")
    with pytest.raises(ValueError, match="needs the heads"):
        flat_relevance_threshold(engine, [], None)


@pytest.mark.parametrize("args, says", [
    (["--relevance", "heads+bm25"], "not a fusion"),
    (["--relevance", "minilm", "--head-set", "set.json"], "--head-set is needed with --relevance heads, and only then"),
    ([], "--head-set is needed with --relevance heads, and only then"),
])
def test_the_threshold_script_checks_its_arguments_before_loading(args, says, capsys):
    from qgpm_testing import benchmark_module

    script = benchmark_module("confidence_threshold", folder="scripts")
    with pytest.raises(SystemExit) as info:
        script.main(["--model", "no/such-model", *args])
    assert info.value.code == 2 and says in capsys.readouterr().err
