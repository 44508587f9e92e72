"""Head sets and presets keyed by the model's fingerprint, not by a file name."""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch

from qgpm import QGPM, HeadSet, QGPMConfig
from qgpm.config import PRESET_NAMES, PRESETS, RECIPE, SMOLLM2_KEY
from qgpm.fingerprint import ModelFingerprint
from qgpm.heads import (
    HeadSetMismatchError,
    HeadSetMissingError,
    find_head_set,
    head_set_file_name,
    shipped_head_dir,
    stored_head_set_path,
)
from qgpm.loading import resolve_source, source_fingerprint

from qgpm_testing import save_tiny, tiny_model


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("QGPM_HOME", str(tmp_path / "home"))
    return tmp_path / "home" / "heads"


def _engine(tokenizer, name="final", seed=0, heads=((0, 0),), **overrides):
    return QGPM(tiny_model("llama", len(tokenizer), seed=seed, **overrides), tokenizer, heads=list(heads) if heads else None, name=name)


def test_same_name_different_config_gives_different_keys(tokenizer):
    a = _engine(tokenizer, num_hidden_layers=4)
    b = _engine(tokenizer, num_hidden_layers=6)
    c = _engine(tokenizer, hidden_size=96, intermediate_size=192)
    assert a.name == b.name == c.name == "final"
    assert len({a.fingerprint.key, b.fingerprint.key, c.fingerprint.key}) == 3
    assert a.fingerprint.arch["num_hidden_layers"] == 4 and b.fingerprint.arch["num_hidden_layers"] == 6


def test_gemma3_key_covers_layer_kinds_and_window(tokenizer):
    """Gemma 3's local/global layer pattern, window and both RoPE bases are part of the architecture."""
    base = QGPM(tiny_model("gemma3_text", len(tokenizer)), tokenizer, heads=[(1, 0)], name="g")
    arch = base.fingerprint.arch
    assert arch["model_type"] == "gemma3_text" and arch["sliding_window"] == 32
    assert arch["layer_types"] == ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
    assert arch["rope"]["full_attention"]["rope_theta"] == 1e6 and arch["rope"]["sliding_attention"]["rope_theta"] == 1e4
    other_kinds = QGPM(tiny_model("gemma3_text", len(tokenizer), layer_types=["full_attention", "sliding_attention"] * 2), tokenizer, heads=[(1, 0)], name="g")
    other_window = QGPM(tiny_model("gemma3_text", len(tokenizer), sliding_window=64), tokenizer, heads=[(1, 0)], name="g")
    assert len({base.fingerprint.key, other_kinds.fingerprint.key, other_window.fingerprint.key}) == 3
    assert "layer_types" not in _engine(tokenizer).fingerprint.arch  # other families' keys are unchanged


def test_key_ignores_weights_and_dtype_weights_digest_does_not(tokenizer):
    a = _engine(tokenizer, seed=0)
    b = _engine(tokenizer, seed=1)  # another "fine-tune" of the same architecture
    assert a.fingerprint.key == b.fingerprint.key
    assert a.fingerprint.weights != b.fingerprint.weights
    bf16 = QGPM(a.model.to(torch.bfloat16), tokenizer, heads=[(0, 0)])
    assert bf16.fingerprint.key == a.fingerprint.key and bf16.fingerprint.weights == a.fingerprint.weights
    a.model.to(torch.float32)


def test_head_set_made_for_another_model_is_rejected(tokenizer, tmp_path):
    a = _engine(tokenizer, num_hidden_layers=4)
    b = _engine(tokenizer, num_hidden_layers=6)
    hs = HeadSet("final", [(1, 0), (2, 1)], fingerprint=a.fingerprint.to_dict())
    path = hs.save(tmp_path / "a.json")
    with pytest.raises(HeadSetMismatchError, match=r"made for another model.*num_hidden_layers: 4 vs 6.*qgpm calibrate"):
        b.set_heads(str(path))
    with pytest.raises(HeadSetMismatchError):
        b.set_heads(hs)
    with pytest.raises(HeadSetMismatchError):
        QGPM(b.model, tokenizer, heads=path)
    a.set_heads(str(path))  # its own model takes it
    assert a.heads == [(1, 0), (2, 1)]
    b.set_heads([(1, 0), (5, 1)])  # a plain list is the caller's choice: only bounds are checked
    assert b.heads == [(1, 0), (5, 1)]


def test_without_a_head_set_the_error_names_the_reranker_way_and_that_way_answers(tokenizer, home):
    """A model with no stored head set: a call that reads heads fails before any model work,
    naming calibration and relevance='minilm'; with relevance='minilm' (the recipe's) the same
    call answers."""
    eng = _engine(tokenizer, num_hidden_layers=4, heads=None)
    context = " ".join(["The depot opens at six."] * 20 + ["The spare key hangs in the blue cabinet."] + ["Trucks leave at nine."] * 20)
    with pytest.raises(HeadSetMissingError, match="qgpm calibrate.*relevance='minilm'.*needs no head set"):
        eng.answer(context, "Where does the spare key hang?", max_new_tokens=2, config=eng.config.with_(relevance="heads"))
    assert eng.config.relevance == "minilm"
    res = eng.answer(context, "Where does the spare key hang?", max_new_tokens=2, config=eng.config.with_(keep_length=0))
    assert res.details.relevance_source == "minilm" and res.details.s_low < 1.0
    assert "spare key" in res.top_sentences(1)[0].text


def test_stored_sets_are_found_by_fingerprint_not_by_name(tokenizer, home):
    a = _engine(tokenizer, num_hidden_layers=4, heads=None)
    assert a.head_set is None
    with pytest.raises(HeadSetMissingError, match="no head set is stored for model final \\[key"):
        a.heads
    hs = HeadSet("final", [(1, 0)], fingerprint=a.fingerprint.to_dict())
    path = hs.save(home / head_set_file_name(a.fingerprint))
    assert path.name == f"final--{a.fingerprint.key}-{a.fingerprint.weights[:8]}.json"
    assert _engine(tokenizer, num_hidden_layers=4, heads=None).heads == [(1, 0)]
    # same readable name, other architecture: not found
    other = _engine(tokenizer, num_hidden_layers=6, heads=None)
    assert other.head_set is None and find_head_set(other.fingerprint) is None
    assert stored_head_set_path(a.fingerprint) == path and stored_head_set_path("final") == path


def test_a_head_set_that_fails_its_checks_leaves_the_engine_as_it_was(tokenizer, home):
    """set_heads with heads the model does not have raises and changes nothing: an engine without
    a head set still says why (the stored set it looked for), one with a set keeps it."""
    bare = _engine(tokenizer, num_hidden_layers=4, heads=None)
    with pytest.raises(ValueError):
        bare.set_heads([(9, 0)])
    assert bare.head_set is None
    with pytest.raises(HeadSetMissingError, match="no head set is stored for model final \\[key"):
        bare.heads
    kept = _engine(tokenizer, num_hidden_layers=4, heads=[(1, 0)])
    with pytest.raises(ValueError):
        kept.set_heads([(1, 0), (9, 0)])
    assert kept.heads == [(1, 0)]


def test_other_weights_warn_and_exact_weights_win(tokenizer, home, caplog):
    base = _engine(tokenizer, seed=0, heads=None)
    HeadSet("base", [(1, 0)], fingerprint=base.fingerprint.to_dict()).save(home / head_set_file_name(base.fingerprint))
    with caplog.at_level(logging.WARNING, logger="qgpm"):
        tuned = _engine(tokenizer, seed=1, heads=None, name="tuned")
    assert tuned.heads == [(1, 0)]
    assert any("other weights" in r.getMessage() for r in caplog.records)
    HeadSet("tuned", [(2, 1)], fingerprint=tuned.fingerprint.to_dict()).save(home / head_set_file_name(tuned.fingerprint))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="qgpm"):
        assert _engine(tokenizer, seed=1, heads=None, name="tuned").heads == [(2, 1)]
        assert _engine(tokenizer, seed=0, heads=None, name="base").heads == [(1, 0)]
    assert not caplog.records


def test_a_float16_load_finds_the_set_of_its_own_weights_without_a_warning(tokenizer, home, caplog):
    """Rounding float16 values to bfloat16 lands on another bfloat16 value for some of them, so a
    float16 load's bfloat16 digest differs from the float32 one; its float16 digest does not."""
    base = _engine(tokenizer, seed=0, heads=None)
    HeadSet("base", [(1, 0)], fingerprint=base.fingerprint.to_dict()).save(home / head_set_file_name(base.fingerprint))
    HeadSet("other", [(2, 1)], fingerprint=_engine(tokenizer, seed=1, heads=None).fingerprint.to_dict()).save(home / "other.json")
    caplog.clear()  # building the other engine warned: base's set is another's weights for it
    with caplog.at_level(logging.WARNING, logger="qgpm"):
        half = QGPM(tiny_model("llama", len(tokenizer), seed=0).to(torch.float16), tokenizer, heads=None, name="final")
    assert half.fingerprint.weights != base.fingerprint.weights  # the double rounding this test is about
    assert half.fingerprint.weights_fp16 == base.fingerprint.weights_fp16
    assert half.heads == [(1, 0)] and not caplog.records
    assert not half.fingerprint.same_weights(_engine(tokenizer, seed=1, heads=None).fingerprint.to_dict())


def test_legacy_set_without_fingerprint_is_used_by_name_with_a_warning(tokenizer, home, caplog):
    HeadSet("Legacy", [(3, 1)]).save(home / "legacy.json")
    with caplog.at_level(logging.WARNING, logger="qgpm"):
        e = _engine(tokenizer, heads=None, name="Legacy")
    assert e.heads == [(3, 1)]
    assert any("carries no model fingerprint" in r.getMessage() for r in caplog.records)


def test_direct_construction_finds_the_same_stored_set_and_name(tokenizer, home):
    a = _engine(tokenizer, heads=None, name="my-model")
    HeadSet("my-model", [(2, 0)], fingerprint=a.fingerprint.to_dict()).save(home / head_set_file_name(a.fingerprint))
    b = QGPM(a.model, tokenizer)  # no name=
    assert b.name == "my-model" and b.heads == [(2, 0)] and b.fingerprint.key == a.fingerprint.key


def test_source_fingerprint_matches_the_loaded_model(tokenizer, tmp_path):
    d = save_tiny(tmp_path / "run1" / "final", tokenizer)
    src = resolve_source(str(d))
    fp = source_fingerprint(src)
    engine = QGPM.from_pretrained(str(d), heads=[(0, 0)])
    assert fp.key == engine.fingerprint.key and fp.weights is None and engine.fingerprint.weights


def test_gguf_names_keep_the_version(tmp_path):
    for name in ("Llama-3.1-8B.Q4_K_M.gguf", "Llama-3.2-1B.Q4_K_M.gguf"):
        (tmp_path / name).write_bytes(b"")
    a = resolve_source(str(tmp_path / "Llama-3.1-8B.Q4_K_M.gguf"))
    b = resolve_source(str(tmp_path / "Llama-3.2-1B.Q4_K_M.gguf"))
    assert (a.name, b.name) == ("Llama-3.1-8B", "Llama-3.2-1B")


def test_presets_are_keyed_by_fingerprint():
    assert PRESET_NAMES[SMOLLM2_KEY] == "SmolLM2-135M-Instruct"
    assert QGPMConfig.for_model(SMOLLM2_KEY) is PRESETS[SMOLLM2_KEY]
    assert QGPMConfig.for_model("smollm2-135m-instruct") is PRESETS[SMOLLM2_KEY]  # readable name still works
    assert QGPMConfig.for_model("0000000000000000") is RECIPE  # a model without a preset gets the measured recipe
    assert QGPMConfig.paper() == QGPMConfig() and QGPMConfig.paper().remap == "stride"  # the paper's method, one call away
    fp = ModelFingerprint(key=SMOLLM2_KEY, name="x", arch={}, tokenizer="")
    assert QGPMConfig.for_model(fp) is PRESETS[SMOLLM2_KEY]


def test_shipped_head_set_carries_the_smollm2_key():
    d = json.loads((shipped_head_dir() / "smollm2-135m-instruct.json").read_text())
    assert d["fingerprint"]["key"] == SMOLLM2_KEY and d["fingerprint"]["name"] == "SmolLM2-135M-Instruct"


@pytest.mark.real_model
def test_engine_without_name_finds_the_same_preset_and_heads_as_from_pretrained(smollm):
    assert smollm.fingerprint.key == SMOLLM2_KEY
    direct = QGPM(smollm.model, smollm.tokenizer)
    assert direct.name == smollm.name == "SmolLM2-135M-Instruct"
    assert direct.config is smollm.config is PRESETS[SMOLLM2_KEY]
    assert direct.heads == smollm.heads
    assert os.path.samefile(stored_head_set_path(direct.fingerprint), shipped_head_dir() / "smollm2-135m-instruct.json")


def test_an_unreadable_head_set_file_is_named_once(tokenizer, home, caplog):
    from qgpm.heads import user_head_dir

    eng = _engine(tokenizer, num_hidden_layers=4, heads=None)
    user_head_dir().mkdir(parents=True, exist_ok=True)
    bad = user_head_dir() / "broken.json"
    bad.write_text('{"model": "final", "heads": [[1, 0]')  # cut off mid-write
    with caplog.at_level(logging.WARNING, logger="qgpm"):
        assert find_head_set(eng.fingerprint) is None
        find_head_set(eng.fingerprint)
    assert caplog.text.count("skipping head-set file") == 1 and "broken.json" in caplog.text
