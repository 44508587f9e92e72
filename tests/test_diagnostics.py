"""A call's facts as a typed Diagnostics (result.details): fields for the readers, a mapping of
the facts set for metadata and JSON, baseline settings and adapter notes kept apart."""

from __future__ import annotations

import copy
import json
import pickle

import pytest

from qgpm import QGPM
from qgpm.diagnostics import FIELDS, Diagnostics
from qgpm.results import QGPMResult

from qgpm_testing import NEEDLE_QUESTION, needle_context, tiny_model


def test_fields_and_the_mapping_of_set_facts_agree():
    d = Diagnostics(s_low=0.45, flat_relevance=False)
    assert d.s_low == 0.45 and d["s_low"] == 0.45 and d.get("anchor_length") is None and "anchor_length" not in d
    assert dict(d) == {"s_low": 0.45, "flat_relevance": False}  # False is a fact; None is not
    d["pass2"] = "slot order"
    assert d.pass2 == "slot order"
    d["llama_index"] = {"step": "plain"}  # not a field: what an adapter records
    assert d.extra == {"llama_index": {"step": "plain"}} and d["llama_index"]["step"] == "plain"
    del d["s_low"]
    assert d.s_low is None and "s_low" not in d
    with pytest.raises(KeyError):
        del d["s_low"]
    d.settings.update(shift=3)
    assert d["shift"] == 3 and d == {"flat_relevance": False, "pass2": "slot order", "shift": 3, "llama_index": {"step": "plain"}}
    c = d.copy()
    c.settings["shift"] = 4
    c.extra["llama_index"] = 1
    assert d["shift"] == 3 and d["llama_index"] == {"step": "plain"}  # a copy owns its dicts
    assert json.loads(json.dumps(dict(d))) == dict(d)
    assert "settings" not in FIELDS and "extra" not in FIELDS and "score_logprob" in FIELDS
    r = QGPMResult(text="", method="none", details={"empty_context": True})
    assert isinstance(r.details, Diagnostics) and r.details.empty_context is True
    with pytest.raises(TypeError, match="mapping"):
        Diagnostics.of(["s_low"])


def test_a_key_that_is_not_a_named_fact_says_how_to_read_it():
    d = Diagnostics(s_low=0.45)
    d.settings.update(shift=3)
    d["llama_index"] = {"step": "qa"}
    with pytest.raises(AttributeError, match=r"'shift' is a baseline's setting, not a named fact: read it with details.get\('shift'\)"):
        d.shift
    with pytest.raises(AttributeError, match=r"'llama_index' is an adapter's record"):
        d.llama_index
    with pytest.raises(AttributeError, match=r"no fact 'kept_reasn': did you mean 'kept_reason'\? the named facts are qgpm.diagnostics.FIELDS"):
        d.kept_reasn
    with pytest.raises(AttributeError, match=r"no fact 'zzqq': the named facts"):
        d.zzqq
    assert d.kept_reason is None and not hasattr(d, "shift") and d.get("shift") == 3
    assert copy.deepcopy(d) == d and pickle.loads(pickle.dumps(d)) == d  # copying never reaches the message


def test_a_call_reports_typed_facts(tokenizer, one_thread):
    engine = QGPM(tiny_model("llama", len(tokenizer)), tokenizer, heads=[(1, 0), (2, 1)])
    ctx = needle_context(4, 16)
    cfg = engine.config.with_(keep_length=0.0, min_top_z=None, decisive_margin=None, relevance="heads")
    res = engine.answer(ctx, NEEDLE_QUESTION, config=cfg, max_new_tokens=2)
    d = res.details
    assert isinstance(d, Diagnostics) and d.heads == 2 and d.layers_run == 3 and d.pass2 in ("slot order", "standard")
    assert 0 < d.s_low < 1 and d.flat_relevance is False and d.relevance_source is None and not d.settings
    call = engine.prepare(ctx, NEEDLE_QUESTION, config=cfg, max_new_tokens=2)
    scored = engine.generate_prepared(call, max_new_tokens=2, score=" tangerine")
    assert scored.details.score_tokens > 0 and scored.details.score_logprob < 0 and call.details.score_logprob is None
    base = engine.answer(ctx, NEEDLE_QUESTION, method="string", max_new_tokens=2)
    assert {"shift", "local_window"} <= set(base.details.settings) and base.details.s_low is None
