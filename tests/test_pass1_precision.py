"""Pass 1 at a lower precision (``QGPMConfig.pass1_dtype``): checked before any work, close to
a float32 pass 1 but really at the lower precision, never reused as the prefill, ``"auto"``
following the hardware, and leaving the model and torch's autocast state as they were, on a
tiny model and on the real SmolLM2."""

from __future__ import annotations

import logging

import pytest
import torch

from qgpm import QGPM, QGPMConfig
from qgpm.relevance import head_token_logits
from qgpm.runtime import decoder_layers
from qgpm_testing import NEEDLE_QUESTION, needle_context, tiny_model

QUESTION = NEEDLE_QUESTION
HEADS = [(1, 0), (2, 1)]
ONE_MAP = QGPMConfig(remap="reorder", split_layer=0, k_sharp=2.0, s_low=0.1, min_top_z=None, decisive_margin=None)
FALLBACK = ONE_MAP.with_(min_top_z=1e6)  # every call keeps vanilla positions


context = needle_context


@pytest.fixture(scope="module")
def model(tokenizer):
    return tiny_model("llama", len(tokenizer))


def test_pass1_dtype_is_checked_before_any_work(model, tokenizer):
    for bad in ("int8", "bf16", "fp8", torch.bfloat16, 16, ""):
        with pytest.raises(ValueError, match="pass1_dtype"):
            QGPMConfig(pass1_dtype=bad)
    engine = QGPM(model, tokenizer, heads=HEADS, config=ONE_MAP)
    with pytest.raises(ValueError, match="pass1_dtype"):
        engine.answer(context(12), QUESTION, config=ONE_MAP.with_(pass1_dtype="half"))
    assert engine.pass1_precision() is None  # the default: the model's dtype
    assert engine.pass1_precision(ONE_MAP.with_(pass1_dtype="bfloat16")) is torch.bfloat16
    assert engine.pass1_precision(ONE_MAP.with_(pass1_dtype="float16")) is torch.float16
    assert engine.pass1_precision(ONE_MAP.with_(pass1_dtype="float32")) is None  # the model's own dtype: the exact pass 1


def test_auto_is_bfloat16_on_a_float32_model_with_fast_bfloat16_only(model, tokenizer, monkeypatch):
    import qgpm.pass1 as pass1_mod

    engine = QGPM(model, tokenizer, heads=HEADS, config=ONE_MAP.with_(pass1_dtype="auto"))
    monkeypatch.setattr(pass1_mod, "fast_on", lambda device, dtype: True)
    assert engine.pass1_precision() is torch.bfloat16
    monkeypatch.setattr(pass1_mod, "fast_on", lambda device, dtype: False)
    assert engine.pass1_precision() is None
    res = engine.answer(context(12), QUESTION, max_new_tokens=2, config=FALLBACK.with_(pass1_dtype="auto"))
    assert "pass1_dtype" not in res.details and res.details["pass1_continued"]  # the exact pass 1, reused
    monkeypatch.setattr(pass1_mod, "fast_on", lambda device, dtype: True)
    long_ = engine.prepare(context(12), QUESTION)
    short = engine.prepare(context(12), QUESTION, config=ONE_MAP.with_(pass1_dtype="auto", keep_length=10_000.0))
    assert long_.details["pass1_dtype"] == "bfloat16" and not long_.details["pass1_continued"]
    assert "pass1_dtype" not in short.details and short.details["pass1_continued"]  # keeps vanilla positions: exact, reused
    half = QGPM(model.to(torch.bfloat16), tokenizer, heads=HEADS, config=ONE_MAP.with_(pass1_dtype="auto"))
    try:
        assert half.pass1_precision() is None  # already a low-precision model: nothing to gain
    finally:
        model.to(torch.float32)


def test_lower_precision_logits_are_close_to_float32_but_computed_at_that_precision(model, tokenizer):
    engine = QGPM(model, tokenizer, heads=HEADS, config=ONE_MAP)
    prompt = engine.prepare(context(12), QUESTION, method="qgpm").prompt
    exact = head_token_logits(model, prompt.input_ids, HEADS, prompt.query_rows)
    low = head_token_logits(model, prompt.input_ids, HEADS, prompt.query_rows, precision=torch.bfloat16)
    assert low.dtype == torch.float32 and low.shape == exact.shape
    diff = (low - exact).abs().max().item()
    spread = (exact.max() - exact.min()).item()
    assert 0 < diff < 0.05 * spread  # really at bfloat16 (not the float32 pass), yet the same signal
    with pytest.raises(ValueError, match="cannot go on as the prefill"):
        head_token_logits(model, prompt.input_ids, HEADS, prompt.query_rows, precision=torch.bfloat16,
                          cache=object(), go_on=lambda tl: True)


def test_a_lower_precision_pass1_is_never_reused_and_answers_as_a_full_pass2(model, tokenizer):
    low = QGPM(model, tokenizer, heads=HEADS, config=FALLBACK.with_(pass1_dtype="bfloat16"))  # reuse_prefill stays True
    reusing = QGPM(model, tokenizer, heads=HEADS, config=FALLBACK)
    full = QGPM(model, tokenizer, heads=HEADS, config=FALLBACK, reuse_prefill=False)
    ctx = context(12)
    a = low.answer(ctx, QUESTION, max_new_tokens=6)
    b = full.answer(ctx, QUESTION, max_new_tokens=6)
    c = reusing.answer(ctx, QUESTION, max_new_tokens=6)
    assert a.details["pass1_dtype"] == "bfloat16" and "pass1_dtype" not in b.details
    assert not a.details["pass1_continued"] and a.details["prefill_reused"] == 0
    assert c.details["prefill_reused"] == c.usage.prompt_tokens - 1  # the float32 engine does reuse here
    vanilla = full.answer(ctx, QUESTION, method="vanilla", max_new_tokens=6)
    assert a.text == b.text == vanilla.text  # a fallback: vanilla positions, the model's own float32 prefill
    assert next(model.parameters()).dtype == torch.float32 and not torch.is_autocast_enabled("cpu")


def test_a_failing_lower_precision_call_leaves_model_and_autocast_as_they_were(model, tokenizer):
    engine = QGPM(model, tokenizer, heads=HEADS, config=ONE_MAP.with_(pass1_dtype="bfloat16"))

    def boom(module, args):
        raise RuntimeError("injected fault in pass 1")

    handle = decoder_layers(model)[0].register_forward_pre_hook(boom)
    try:
        with pytest.raises(RuntimeError, match="injected fault"):
            engine.answer(context(12), QUESTION, max_new_tokens=3)
    finally:
        handle.remove()
    assert not torch.is_autocast_enabled("cpu")
    assert all(not layer._forward_pre_hooks and not layer.self_attn._forward_pre_hooks for layer in decoder_layers(model))
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([[1, 2, 3]])).logits
    assert logits.dtype == torch.float32  # no autocast left behind
    assert engine.answer(context(12), QUESTION, max_new_tokens=3).details["pass1_dtype"] == "bfloat16"


def test_hardware_without_fast_lower_precision_is_warned_about_once(model, tokenizer, monkeypatch, caplog):
    import qgpm.pass1 as pass1_mod

    monkeypatch.setattr(pass1_mod, "fast_on", lambda device, dtype: False)
    engine = QGPM(model, tokenizer, heads=HEADS, config=ONE_MAP)
    with caplog.at_level(logging.WARNING, logger="qgpm"):
        for _ in range(2):
            assert engine.prepare(context(12), QUESTION, config=ONE_MAP.with_(pass1_dtype="float16")).details["pass1_dtype"] == "float16"
        engine.prepare(context(12), QUESTION, config=ONE_MAP.with_(pass1_dtype="auto"))  # auto: the model's dtype, no warning
    notes = [r.getMessage() for r in caplog.records if "no fast float16" in r.getMessage()]
    assert len(notes) == 1 and "pass1_dtype=None" in notes[0]


def test_the_eval_fingerprint_names_a_lower_precision_pass1_only(model, tokenizer, monkeypatch):
    import qgpm.pass1 as pass1_mod
    from qgpm.eval.hashes import config_hash, method_fingerprint

    exact = QGPM(model, tokenizer, heads=HEADS, config=ONE_MAP)
    low = QGPM(model, tokenizer, heads=HEADS, config=ONE_MAP.with_(pass1_dtype="bfloat16"))
    auto = QGPM(model, tokenizer, heads=HEADS, config=ONE_MAP.with_(pass1_dtype="auto"))
    fe, fl = method_fingerprint(exact, "qgpm"), method_fingerprint(low, "qgpm")
    assert "pass1_dtype" not in fe["config"] and "pass1_precision" not in fe  # earlier rows keep their hashes
    assert fl["config"]["pass1_dtype"] == "bfloat16" and fl["pass1_precision"] == "bfloat16"
    assert config_hash(fe) != config_hash(fl)
    monkeypatch.setattr(pass1_mod, "fast_on", lambda device, dtype: False)
    slow = method_fingerprint(auto, "qgpm")
    monkeypatch.setattr(pass1_mod, "fast_on", lambda device, dtype: True)
    fast = method_fingerprint(auto, "qgpm")
    assert "pass1_precision" not in slow and fast["pass1_precision"] == "bfloat16"  # what auto became on this hardware
    assert config_hash(slow) != config_hash(fast)
    assert method_fingerprint(low, "vanilla") == method_fingerprint(exact, "vanilla")  # vanilla has no pass 1


@pytest.mark.real_model
def test_real_smollm2_bfloat16_pass1_ranks_as_float32(smollm):
    """The embedded SmolLM2 (float32) with its shipped heads: a bfloat16 pass 1 gives nearly the
    same sentence scores, the same top sentence and here the same plan, so the same answer."""
    ctx = context(20, n=40)
    cfg = smollm.config.with_(relevance="heads", min_top_z=None, decisive_margin=None, keep_length=0, pass1_dtype=None)  # the plan moves sentences
    a = smollm.prepare(ctx, QUESTION, method="qgpm", config=cfg)
    b = smollm.prepare(ctx, QUESTION, method="qgpm", config=cfg.with_(pass1_dtype="bfloat16"))
    za, zb = a.z.float(), b.z.float()
    assert 0 < (za - zb).abs().max().item() < 0.05 * (za.max() - za.min()).item()
    top_a = min(a.relevance, key=lambda r: r.rank)
    top_b = min(b.relevance, key=lambda r: r.rank)
    assert top_a.index == top_b.index and "tangerine" in top_b.text
    assert not a.plan.is_standard() and torch.equal(a.plan.feed_order(), b.plan.feed_order())
    ra, rb = smollm.generate_prepared(a, max_new_tokens=12), smollm.generate_prepared(b, max_new_tokens=12)
    assert ra.text == rb.text and rb.details["pass1_dtype"] == "bfloat16" and rb.details["prefill_reused"] == 0


@pytest.mark.real_model
def test_real_smollm2_preset_runs_pass1_at_auto(smollm):
    """The SmolLM2 preset with its heads as the relevance source runs ``pass1_dtype="auto"``: where the hardware multiplies
    bfloat16 natively, a context longer than ``keep_length`` gets a bfloat16 pass 1 (never
    reused as the prefill), elsewhere the exact one; a context within ``keep_length`` always
    gets the exact pass 1, which goes on as its prefill. The needle is still ranked first and answered."""
    from qgpm.pass1 import fast_on

    assert smollm.config.pass1_dtype == "auto"
    heads = smollm.config.with_(relevance="heads")
    fast = fast_on(smollm.device, torch.bfloat16)
    long_ = smollm.prepare(context(60, n=96), QUESTION, method="qgpm", config=heads)
    assert long_.prompt.context_tokens > smollm.config.keep_length
    if fast:
        assert long_.details["pass1_dtype"] == "bfloat16" and not long_.details["pass1_continued"]
    else:
        assert "pass1_dtype" not in long_.details
    assert "tangerine" in min(long_.relevance, key=lambda r: r.rank).text  # the needle ranked first
    res = smollm.generate_prepared(long_, max_new_tokens=32)
    assert "tangerine" in res.text.lower() and (res.details["prefill_reused"] == 0 or not fast)
    short = smollm.prepare(context(12, n=24), QUESTION, method="qgpm", config=heads)
    assert short.prompt.context_tokens <= smollm.config.keep_length
    assert "pass1_dtype" not in short.details and short.details["pass1_continued"]
