"""Catalog of bad input: every case raises the named exception with a message that says
what was wrong, before any model work, and leaves the model exactly vanilla.

After each case the model has no hooks, its lock is free, and a greedy vanilla answer
equals the one of a freshly built model with the same weights.
"""

from __future__ import annotations

import logging
import math
import time
import tracemalloc

import pytest
import torch

from qgpm import (
    QGPM,
    ContextTooLongError,
    EmptyContextError,
    HeadSetMissingError,
    PromptError,
    QGPMConfig,
    UnsupportedModelError,
)
from qgpm.config import RECIPE
from qgpm.runtime import decoder_layers, model_lock

from qgpm_testing import tiny_model

CTX = (
    "The morning market opened early and the stalls filled with fresh bread. "
    "A small band played old songs near the fountain in the square. "
    "The library extended its opening hours during the winter months."
)
EVIDENCE = "A small band played old songs near the fountain in the square."
Q = "What did the band play near the fountain?"
FILLER = "Several visitors walked along the river to watch the boats pass by. "
NAN, INF = math.nan, math.inf
TEN_MB = "word " * (2 * 1024 * 1024)  # 10 MiB of text


def no_hooks(model) -> bool:
    return all(not l._forward_pre_hooks and not l.self_attn._forward_pre_hooks for l in decoder_layers(model))


@pytest.fixture(scope="module")
def engine(tokenizer):
    model = tiny_model("llama", len(tokenizer), max_position_embeddings=1024)
    return QGPM(model, tokenizer, heads=[(1, 0), (2, 1)], config=QGPMConfig(s_low=0.1))


@pytest.fixture(scope="module")
def reference(tokenizer):
    """Greedy vanilla answer of a fresh model with the same weights (same seed)."""
    fresh = QGPM(tiny_model("llama", len(tokenizer), max_position_embeddings=1024), tokenizer, heads=[(1, 0)])
    return fresh.answer(CTX, Q, method="vanilla", max_new_tokens=6).text


@pytest.fixture
def stays_vanilla(engine, reference, monkeypatch):
    """Pass 1 must not run for a bad call; afterwards the model is vanilla."""
    import qgpm.pass1

    def pass1_ran(*a, **k):
        raise AssertionError("pass 1 ran for a bad call")

    monkeypatch.setattr(qgpm.pass1, "head_token_logits", pass1_ran)
    yield
    monkeypatch.undo()
    assert no_hooks(engine.model)
    lock = model_lock(engine.model)
    assert lock.acquire(blocking=False), "the model lock is still held"
    lock.release()
    assert engine.answer(CTX, Q, method="vanilla", max_new_tokens=6).text == reference


def raises(exc, match, fn, *args, **kwargs):
    with pytest.raises(exc, match=match) as info:
        fn(*args, **kwargs)
    return info.value


# ----------------------------------------------------------------------------- prompt parts
PROMPT_CASES = [
    ("empty", dict(context=""), EmptyContextError, "context is empty"),
    ("whitespace", dict(context="  \n\t "), EmptyContextError, "context is empty"),
    ("empty list", dict(context=[]), EmptyContextError, "context is empty"),
    ("blank documents", dict(context=["", " "]), EmptyContextError, "context is empty"),
    ("zero-width only", dict(context="\u200b\u200c\u200d\ufeff\u2060"), EmptyContextError, "no visible text"),
    ("zero-width documents", dict(context=["\u200b", " \u200b "]), EmptyContextError, "no visible text"),
    ("None", dict(context=None), PromptError, "context is None"),
    ("bytes", dict(context=b"The band played."), PromptError, r"context is bytes, not text: decode it"),
    ("bytearray", dict(context=bytearray(b"x")), PromptError, "context is bytearray"),
    ("list of ints", dict(context=[1, 2]), PromptError, "context item 0 is int, expected str"),
    ("bytes document", dict(context=["ok.", b"x"]), PromptError, "context item 1 is bytes"),
    ("dict", dict(context={"text": "x"}), PromptError, "string or a list of document strings, got dict"),
    ("number", dict(context=42), PromptError, "got int"),
    ("empty question", dict(question=""), PromptError, "question is empty"),
    ("blank question", dict(question=" \n"), PromptError, "question is empty"),
    ("None question", dict(question=None), PromptError, "question is None"),
    ("number question", dict(question=5), PromptError, "question must be a string, got int"),
    ("zero-width question", dict(question="\u200b\u200b"), PromptError, "question has no visible text"),
    ("instruction type", dict(instruction=5), PromptError, "instruction must be a string or None, got int"),
    ("system type", dict(system=b"x"), PromptError, "system must be a string or None, got bytes"),
    ("answer_prefix type", dict(answer_prefix=["A:"]), PromptError, "answer_prefix must be a string or None, got list"),
    ("template without question", dict(template="{instruction} {context}"), PromptError, r"template must contain \{question\}"),
    ("template type", dict(template=3), PromptError, "template must be a string"),
]


@pytest.mark.parametrize("method", ["qgpm", "vanilla", "topk"])
@pytest.mark.parametrize("name,change,exc,match", PROMPT_CASES, ids=[c[0] for c in PROMPT_CASES])
def test_bad_prompt_parts(engine, stays_vanilla, name, change, exc, match, method):
    kw = dict(context=CTX, question=Q, method=method, max_new_tokens=4, **({"reranker": "bm25"} if method == "topk" else {}))
    kw.update(change)
    raises(exc, match, engine.answer, **kw)
    # the stream raises the same at the call, before anything runs
    raises(exc, match, engine.stream, **kw)


# ----------------------------------------------------------------------------- decoding arguments
GEN_CASES = [
    (dict(max_new_tokens=0), ValueError, "max_new_tokens must be >= 1, got 0"),
    (dict(max_new_tokens=-3), ValueError, "max_new_tokens must be >= 1"),
    (dict(max_new_tokens=1.5), TypeError, "max_new_tokens must be an int, got float"),
    (dict(max_new_tokens="8"), TypeError, "max_new_tokens must be an int, got str"),
    (dict(max_new_tokens=True), TypeError, "max_new_tokens must be an int, got bool"),
    (dict(max_new_tokens=None), TypeError, "max_new_tokens must be an int, got NoneType"),
    (dict(temperature=NAN), ValueError, "temperature must be a finite number, got nan"),
    (dict(temperature=INF), ValueError, "temperature must be a finite number, got inf"),
    (dict(temperature=-0.5), ValueError, r"temperature must be >= 0 \(0 = greedy decoding\)"),
    (dict(temperature="0.7"), TypeError, "temperature must be a number, got str"),
    (dict(top_p=0.0), ValueError, r"top_p must be in \(0, 1\], got 0.0"),
    (dict(top_p=1.5), ValueError, r"top_p must be in \(0, 1\]"),
    (dict(top_p=NAN), ValueError, "top_p must be a finite number"),
    (dict(seed="x"), TypeError, "seed must be an int or None, got str"),
    (dict(seed=1.5), TypeError, "seed must be an int or None, got float"),
    (dict(seed=-1), ValueError, r"seed must be in \[0, 2\*\*64\)"),
    (dict(stop=5), TypeError, "stop must be a string or a list of strings, got int"),
    (dict(stop=["ok", 3]), TypeError, "stop must be a string or a list of strings; it holds int"),
    (dict(max_tokens=32), TypeError, r"unexpected arguments \['max_tokens'\]: neither answer\(\) arguments nor"),
    (dict(typical_p=0.9), ValueError, "typical_p: qgpm samples with temperature, top_p, top_k and min_p only"),
    (dict(do_sample=True), ValueError, r"do_sample: set by qgpm itself"),
    (dict(num_beams=3), ValueError, r"num_beams: not supported; qgpm decodes one sequence per call"),
    (dict(max_length=10), ValueError, r"max_length: set by qgpm itself .*max_new_tokens="),
    (dict(top_k=-3), ValueError, r"top_k must be an int >= 0 \(0 or -1: no top-k cut\), got -3"),
    (dict(repetition_penalty=-1.0), ValueError, "repetition_penalty must be a number > 0"),
    (dict(no_repeat_ngram_size=-2), ValueError, "no_repeat_ngram_size must be an int >= 0"),
    (dict(max_time=-1), ValueError, "max_time must be a number of seconds > 0"),
    (dict(min_new_tokens=100), ValueError, "min_new_tokens=100 exceeds max_new_tokens=4"),
    (dict(eos_token_id="x"), TypeError, "eos_token_id must be a token id"),
    (dict(logits_processor=5), TypeError, "logits_processor must be a list of callables"),
    (dict(logits_processor=[object()]), TypeError, "logits_processor must be a list of callables"),
    (dict(top_k="a"), TypeError, r"top_k must be an int >= 0 \(0 or -1: no top-k cut\), got str 'a'"),
    (dict(top_k=2.5), ValueError, "top_k must be an int >= 0"),
    (dict(min_p=2.0), ValueError, r"min_p must be a number in \[0, 1\], got 2.0"),
    (dict(repetition_penalty=0), ValueError, "repetition_penalty must be a number > 0"),
]


@pytest.mark.parametrize("change,exc,match", GEN_CASES, ids=[f"{next(iter(c[0]))}={next(iter(c[0].values()))!r}" for c in GEN_CASES])
def test_bad_decoding_arguments(engine, stays_vanilla, change, exc, match):
    kw = dict(method="qgpm", max_new_tokens=4)
    kw.update(change)
    raises(exc, match, engine.answer, CTX, Q, **kw)
    raises(exc, match, engine.stream, CTX, Q, **kw)
    raises(exc, match, engine.chat, [{"role": "user", "content": Q}], **{k: v for k, v in kw.items() if k != "method"})
    call = engine.prepare(CTX, Q, method="vanilla")
    raises(exc, match, engine.generate_prepared, call, **{k: v for k, v in kw.items() if k != "method"})


def test_greedy_decoding_says_once_which_sampling_settings_it_does_not_use(engine, caplog):
    import qgpm.log

    qgpm.log._WARNED.clear()
    with caplog.at_level(logging.WARNING, logger="qgpm"):
        engine.answer(CTX, Q, method="vanilla", max_new_tokens=2, seed=3, top_k=5)
        engine.answer(CTX, Q, method="vanilla", max_new_tokens=2, seed=3, top_k=5)
        engine.answer(CTX, Q, method="vanilla", max_new_tokens=2, temperature=0.7, seed=3, top_k=5)
    said = [r.getMessage() for r in caplog.records if "decodes greedily" in r.getMessage()]
    assert said == ["qgpm: temperature=0 decodes greedily, so seed, top_k have no effect; set temperature > 0 to sample with them"]


def test_a_stream_leaves_the_callers_stopping_criteria_as_they_were(engine):
    from transformers import StoppingCriteria, StoppingCriteriaList

    class Never(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    crit = StoppingCriteriaList([Never()])
    first = "".join(engine.stream(CTX, Q, method="vanilla", max_new_tokens=6, stopping_criteria=crit))
    assert len(crit) == 1
    again = engine.answer(CTX, Q, method="vanilla", max_new_tokens=6, stopping_criteria=crit)
    assert again.text == first.strip() and again.usage.answer_tokens == 6


def test_stop_as_one_string_is_one_stop_string(engine, stays_vanilla):
    full = engine.answer(CTX, Q, method="vanilla", max_new_tokens=12).text
    # a two-character stop string whose first character occurs earlier on its own:
    # read character by character, it would cut the answer before the real match
    i = next(i for i in range(1, len(full) - 1) if full[i] in full[:i] and full.index(full[i : i + 2]) == i)
    cut = full[i : i + 2]
    res = engine.answer(CTX, Q, method="vanilla", max_new_tokens=12, stop=cut)
    assert res.text == full[:i].strip() and res.finish_reason == "stop"


# ----------------------------------------------------------------------------- config
FLOAT_FIELDS = ["k_broad", "t_broad", "k_sharp", "t_sharp", "s_low", "eps", "anchor_ratio", "tau", "local_window", "keep_length"]
CONFIG_CASES = [
    *[(dict([(f, NAN)]), ValueError, f"QGPMConfig.{f} must be a finite number, got nan") for f in FLOAT_FIELDS],
    (dict(anchor_ratio=INF), ValueError, "anchor_ratio must be a finite number, got inf"),
    (dict(k_sharp="2"), TypeError, "k_sharp must be a number, got str"),
    (dict(k_broad=1.0, k_sharp=2.0), ValueError, "need K_b > K_s > 0"),
    (dict(t_broad=0.1, t_sharp=0.5), ValueError, "need T_b >= T_s >= 0"),
    (dict(s_low=1.5), ValueError, r"s_low must be in \[0, 1\]"),
    (dict(eps=0.0), ValueError, r"eps must be in \(0, 1\]"),
    (dict(anchor_ratio=0.0), ValueError, "anchor_ratio must be positive"),
    (dict(tau=-1.0), ValueError, "tau must be >= 0"),
    (dict(local_window=-4.0), ValueError, r"local_window must be >= 0 tokens \(0 = off\)"),
    (dict(unmodulated_layers=-1), ValueError, "unmodulated_layers must be >= 0"),
    (dict(unmodulated_layers=1.5), TypeError, "unmodulated_layers must be an int, got float"),
    (dict(split_layer=-1), ValueError, "split_layer must be >= 0"),
    (dict(split_layer="3"), TypeError, "split_layer must be an int or None, got str"),
    (dict(split_layer=1.0), TypeError, "split_layer must be an int or None, got float"),
    (dict(max_sentence_chars=5), ValueError, "max_sentence_chars must be at least 20, got 5"),
    (dict(max_sentence_chars=100.5), TypeError, "max_sentence_chars must be an int, got float"),
    (dict(max_sentence_chars=None), TypeError, "max_sentence_chars must be an int, got NoneType"),
    (dict(max_heads=0), ValueError, "max_heads must be >= 1"),
    (dict(query_tail=-2), ValueError, "query_tail must be >= 0"),
    (dict(exclude_newline_tokens="yes"), TypeError, "exclude_newline_tokens must be a bool"),
]


@pytest.mark.parametrize("change,exc,match", CONFIG_CASES, ids=[repr(c[0]) for c in CONFIG_CASES])
def test_bad_config_is_rejected_on_construction(change, exc, match):
    with pytest.raises(exc, match=match):
        QGPMConfig(**change)
    with pytest.raises(exc, match=match):
        QGPMConfig().with_(**change)


@pytest.mark.parametrize(
    "config,exc,match",
    [
        ("fast", TypeError, "config must be a qgpm.QGPMConfig, got str"),
        ({"s_low": 0.2}, TypeError, "config must be a qgpm.QGPMConfig, got dict"),
        (QGPMConfig(split_layer=99), ValueError, r"config.split_layer=99 is beyond this model's 4 layers"),
        (QGPMConfig(unmodulated_layers=9), ValueError, "config.unmodulated_layers=9 exceeds this model's 4 layers"),
    ],
)
@pytest.mark.parametrize("method", ["qgpm", "oracle"])
def test_config_that_does_not_fit_the_model_fails_before_pass1(engine, stays_vanilla, config, exc, match, method):
    ev = [EVIDENCE] if method == "oracle" else None
    raises(exc, match, engine.answer, CTX, Q, method=method, evidence=ev, config=config, max_new_tokens=4)
    raises(exc, match, engine.stream, CTX, Q, method=method, evidence=ev, config=config, max_new_tokens=4)
    raises(exc, match, engine.prepare, CTX, Q, method=method, evidence=ev, config=config)


def test_replan_checks_the_config_against_the_model(engine, stays_vanilla):
    call = engine.prepare(CTX, Q, method="oracle", evidence=[EVIDENCE])
    raises(ValueError, "split_layer=99 is beyond", engine.replan, call, QGPMConfig(split_layer=99))
    raises(TypeError, "PreparedCall", engine.replan, "call", QGPMConfig())


# ----------------------------------------------------------------------------- size
def test_over_window_names_the_lengths(engine, stays_vanilla):
    raises(ContextTooLongError, r"window of 1024 tokens", engine.answer, FILLER * 100, Q, method="qgpm", max_new_tokens=16)
    raises(ContextTooLongError, "leaves no room for the prompt", engine.answer, CTX, Q, method="qgpm", max_new_tokens=2000)


class _CountingBackend:
    """Wraps the plain-text backend and counts the characters it is asked to tokenize."""

    def __init__(self, backend):
        self.backend = backend
        self.chars = 0

    def encode_batch_fast(self, pieces, **kw):
        self.chars += sum(len(p) for p in pieces)
        return self.backend.encode_batch_fast(pieces, **kw)

    def __getattr__(self, name):
        return getattr(self.backend, name)


@pytest.mark.parametrize("window", [1024, 8192, 131072], ids=["1K-window", "8K-window", "128K-window"])
@pytest.mark.parametrize("where", ["context", "documents", "question", "chat"])
def test_ten_megabytes_fail_fast(tokenizer, window, where, monkeypatch):
    """10 MB of input raises ContextTooLongError with bounded work, whatever the window.

    With a 1K or 8K window (SmolLM2's) the character bound rejects it without tokenizing
    anything, in under 0.5 s and 100 MB (Python allocations; process CPU time, so that a
    machine busy with other work does not fail the test). With a 128K window
    (81 chars/token x 128K > 10 MB) the bounded token count stops after about the
    window's worth of text (~0.2 s CPU on an idle core; the limit here is looser).
    """
    import qgpm.tokens

    engine = QGPM(tiny_model("llama", len(tokenizer), max_position_embeddings=window), tokenizer, heads=[(1, 0)])
    counting = _CountingBackend(qgpm.tokens.plain_backend(tokenizer))
    monkeypatch.setattr(qgpm.tokens, "plain_backend", lambda tok: counting)
    calls = {
        "context": lambda: engine.answer(TEN_MB, Q, method="qgpm", max_new_tokens=8),
        "documents": lambda: engine.answer([TEN_MB[:5_000_000], TEN_MB[5_000_000:]], Q, method="reorder", reranker="bm25"),
        "question": lambda: engine.answer(CTX, TEN_MB, method="vanilla"),
        "chat": lambda: engine.chat([{"role": "user", "content": TEN_MB}]),
    }
    tracemalloc.start()
    t0 = time.process_time()
    try:
        with pytest.raises(ContextTooLongError, match=f"window of {window} tokens"):
            calls[where]()
        elapsed = time.process_time() - t0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 100 * 2**20, f"{peak / 2**20:.0f} MB allocated before ContextTooLongError"
    if window * 81 < len(TEN_MB):
        assert counting.chars == 0, "the character bound should have rejected the input without tokenizing"
        assert elapsed < 0.5, f"{elapsed:.2f} s CPU before ContextTooLongError"
    else:
        assert counting.chars < 8 * window + 16 * 4096, f"tokenized {counting.chars} characters for a {window}-token window"
        assert elapsed < 1.5, f"{elapsed:.2f} s CPU before ContextTooLongError"
    assert no_hooks(engine.model)


def test_bounded_count_catches_text_under_the_character_bound(engine, stays_vanilla):
    """~70K characters pass the character bound of a 1K window but not the token count."""
    text = FILLER * 1000
    assert len(text) < 960 * 81
    err = raises(ContextTooLongError, "counted until the limit", engine.answer, text, Q, method="qgpm")
    assert "window of 1024 tokens" in str(err)


def test_topk_context_may_exceed_the_window_but_not_the_character_bound(engine, stays_vanilla):
    ctx = FILLER * 100 + EVIDENCE
    res = engine.answer(ctx, Q, method="topk", reranker="bm25", k=2, max_new_tokens=2)
    assert res.usage.prompt_tokens < 1024 and res.method == "topk"
    raises(ContextTooLongError, "characters fit", engine.answer, TEN_MB, Q, method="topk", reranker="bm25")


# ----------------------------------------------------------------------------- method, family, heads
def test_unknown_method(engine, stays_vanilla):
    raises(ValueError, "unknown method 'magic'; choose one of vanilla, qgpm, oracle, topk, reorder", engine.answer, CTX, Q, method="magic")
    raises(ValueError, "unknown method", engine.stream, CTX, Q, method="magic")


def test_what_no_method_can_answer_with_is_refused_when_the_engine_is_built(tokenizer):
    """An encoder checkpoint loads as a causal LM with a random LM head and answered noise under
    vanilla; another model's tokenizer overran the embeddings deep in torch; a slow tokenizer has
    no offsets. Each is refused at QGPM(...), naming what to load instead."""
    from transformers import BertConfig, BertLMHeadModel

    bert = BertLMHeadModel(BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)).eval()
    raises(UnsupportedModelError, r"BertLMHeadModel \('bert'\) is an encoder, not a decoder-only causal LM.*vanilla included", QGPM, bert, tokenizer)
    raises(ValueError, r"vocabulary \(49152 tokens\) is larger than the model's embedding table \(1000 rows\).*tokenizer saved with the model",
           QGPM, tiny_model("llama", 1000), tokenizer)
    QGPM(tiny_model("llama", len(tokenizer) + 64), tokenizer, heads=[(0, 0)])  # a padded embedding table is fine

    class Slow:
        is_fast = False

    raises(TypeError, "fast \\(Rust\\) tokenizer", QGPM, tiny_model("llama", len(tokenizer)), Slow())


def test_unsupported_family_is_named_and_stays_vanilla(tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel

    import torch

    def gpt2():
        torch.manual_seed(0)
        return GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=2, n_positions=512)).eval()

    engine = QGPM(gpt2(), tokenizer, heads=[(0, 0)])
    for method in ("qgpm", "oracle"):
        raises(UnsupportedModelError, "model family 'gpt2'.*Supported: llama", engine.answer, CTX, Q, method=method, evidence=[EVIDENCE] if method == "oracle" else None)
    assert not any(m._forward_pre_hooks for m in engine.model.modules())
    fresh = QGPM(gpt2(), tokenizer, heads=[(0, 0)])
    assert engine.answer(CTX, Q, method="vanilla", max_new_tokens=4).text == fresh.answer(CTX, Q, method="vanilla", max_new_tokens=4).text
    # head calibration reads the heads through the rotary patch: refused by name, before any sample is built
    import qgpm.samples

    def no_samples(*a, **k):
        raise AssertionError("calibration samples were built for a model qgpm cannot patch")

    from qgpm.calibrate import calibrate_heads

    original = qgpm.samples.calibration_samples
    qgpm.samples.calibration_samples = no_samples
    try:
        raises(UnsupportedModelError, "model family 'gpt2'", engine.set_heads, "calibrate")
    finally:
        qgpm.samples.calibration_samples = original
    raises(UnsupportedModelError, "model family 'gpt2'", calibrate_heads, engine, [], progress=False)
    assert engine.heads == [(0, 0)]


def test_missing_head_set(engine, tokenizer, stays_vanilla):
    heads = RECIPE.with_(relevance="heads")  # the recipe ranks with MiniLM, which needs no head set
    other = QGPM(engine.model, tokenizer, name="some-unknown-model", config=heads)
    raises(HeadSetMissingError, "qgpm calibrate", other.answer, CTX, Q, method="qgpm")
    raises(HeadSetMissingError, "qgpm calibrate", other.stream, CTX, Q, method="qgpm")


@pytest.mark.parametrize("bad,said", [(5, "got int 5"), ({"a": 1}, "got dict"), ([5], "pairs of ints.*got 5"),
                                       ([(1, "a")], r"got \(1, 'a'\)"), ([(1,)], r"got \(1,\)"), ([(True, 0)], "got \\(True, 0\\)")])
def test_heads_in_a_form_qgpm_does_not_take_are_named(engine, bad, said):
    import numpy as np

    before = engine.heads
    raises(TypeError, f"(heads= takes|heads must be).*{said}", engine.set_heads, bad)
    assert engine.heads == before
    engine.set_heads(np.array([[1, 0]]))  # numpy rows and whole floats are indices, as they were
    engine.set_heads([(2.0, 1)])
    assert engine.heads == [(2, 1)]
    engine.set_heads(before)


def test_a_misspelt_argument_is_named_with_the_closest_one(engine, stays_vanilla):
    import inspect

    from qgpm.defaults import ANSWER_ARGUMENTS

    params = inspect.signature(type(engine).answer).parameters
    assert set(ANSWER_ARGUMENTS) == {n for n, p in params.items() if p.kind is p.KEYWORD_ONLY}
    for call in (engine.answer, engine.stream, engine.prepare):
        raises(TypeError, r"\['max_new_token'\].*Did you mean 'max_new_tokens'\?", call, CTX, Q, max_new_token=4)
        raises(TypeError, r"\['evidense'\].*Did you mean 'evidence'\?", call, CTX, Q, evidense=["x"])
    raises(TypeError, r"\['zzzq'\]: neither answer\(\) arguments nor .*logits_processor\)$", engine.answer, CTX, Q, zzzq=1)
    raises(TypeError, r"\['seed', 'temperature'\] \(seed, temperature: give them to generate_prepared\(\)\)$", engine.prepare, CTX, Q,
           temperature=0.5, seed=1)  # decoding settings: generation's, and never "did you mean" themselves
    raises(TypeError, r"Did you mean 'evidence' for 'evidense', 'method' for 'methd'\?", engine.answer, CTX, Q, methd=1, evidense=2)


def test_a_refusal_raised_again_carries_only_its_own_frames(tokenizer, engine):
    # the engine keeps why it cannot run a method and raises it on each call: its traceback (and
    # the frames, with their contexts, it holds) must not grow with every refused call
    from transformers import GPT2Config, GPT2LMHeadModel

    import traceback

    unsupported = QGPM(GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=2)).eval(), tokenizer, heads=[(0, 0)])
    no_heads = QGPM(engine.model, tokenizer, name="some-unknown-model", config=RECIPE.with_(relevance="heads"))
    for eng, exc in ((unsupported, UnsupportedModelError), (no_heads, HeadSetMissingError)):
        depths, raised = [], []
        for _ in range(3):
            with pytest.raises(exc) as info:
                eng.answer(CTX, Q, method="qgpm")
            depths.append(len(traceback.extract_tb(info.value.__traceback__)))
            raised.append(info.value)
        assert depths[0] == depths[1] == depths[2], (exc.__name__, depths)
        assert len({id(e) for e in raised}) == 3 and len({str(e) for e in raised}) == 1  # one object per call: threads never share one


# ----------------------------------------------------------------------------- oracle, topk
@pytest.mark.parametrize(
    "evidence,exc,match",
    [
        (None, ValueError, "needs evidence"),
        ([], ValueError, "needs evidence"),
        ([""], ValueError, "evidence strings must be non-empty"),
        (["not in the text"], ValueError, "not an exact substring"),
        ([1], TypeError, "evidence item 0 is int"),
        (5, TypeError, "evidence must be a string or a list of strings"),
        (b"bytes", TypeError, "evidence must be a string or a list of strings"),
    ],
)
def test_bad_oracle_evidence(engine, stays_vanilla, evidence, exc, match):
    raises(exc, match, engine.answer, CTX, Q, method="oracle", evidence=evidence)


def test_oracle_evidence_string_is_one_item(engine, stays_vanilla):
    one = engine.answer(CTX, Q, method="oracle", evidence=EVIDENCE, max_new_tokens=3)
    listed = engine.answer(CTX, Q, method="oracle", evidence=[EVIDENCE], max_new_tokens=3)
    assert one.top_sentences(1)[0].text == EVIDENCE
    assert [r.rank for r in one.relevance] == [r.rank for r in listed.relevance] and one.text == listed.text


def test_evidence_with_another_method(engine, stays_vanilla):
    raises(ValueError, "only used by method='oracle'", engine.answer, CTX, Q, method="qgpm", evidence=[EVIDENCE])


@pytest.mark.parametrize("method", ["qgpm", "vanilla", "oracle", "reorder"])
@pytest.mark.parametrize("given", [{"reranker": "bm25"}, {"k": 3}], ids=["reranker", "k"])
def test_reranker_args_with_a_method_that_does_not_read_them(engine, stays_vanilla, method, given):
    """reranker= for a method without a reranker, k= for one that keeps every chunk: refused."""
    if method == "reorder" and "reranker" in given:
        assert engine.answer(CTX, Q, method=method, max_new_tokens=2, **given).method == "reorder"  # reorder reads its reranker
        return
    extra = {"evidence": [EVIDENCE]} if method == "oracle" else {}
    match = "reranker= sets the reranker of method='topk'" if "reranker" in given else "k= is how many chunks method='topk' keeps"
    raises(ValueError, match, engine.answer, CTX, Q, method=method, **given, **extra)
    with pytest.raises(ValueError, match=match):  # the stream says so before its first piece
        engine.stream(CTX, Q, method=method, **given, **extra)


@pytest.mark.parametrize("k,exc,match", [(0, ValueError, "k must be >= 1"), ("3", TypeError, "k must be an int")])
def test_bad_topk_k(engine, stays_vanilla, k, exc, match):
    raises(exc, match, engine.answer, CTX, Q, method="topk", reranker="bm25", k=k)


def test_unknown_reranker(engine, stays_vanilla):
    raises(ValueError, "nope", engine.answer, CTX, Q, method="topk", reranker="nope")


# ----------------------------------------------------------------------------- chat, prepared calls
@pytest.mark.parametrize(
    "messages,match",
    [
        ([], "messages are empty"),
        ([{"role": "user", "content": " \u200b "}], "messages are empty"),
        ("hello", "messages must be a list"),
        ([{"role": "user"}], "must be a dict with 'role' and 'content'"),
        ([{"role": "user", "content": None}], "content must be a string, got NoneType"),
        ([{"role": "user", "content": b"hi"}], "content must be a string, got bytes"),
        ([{"role": None, "content": "hi"}], "message 0 role must be a role name .* got None"),
        ([{"role": " ", "content": "hi"}], "message 0 role must be a role name"),
    ],
)
def test_bad_chat_messages(engine, stays_vanilla, messages, match):
    raises(PromptError, match, engine.chat, messages)
    raises(PromptError, match, engine.stream_chat, messages)


def test_bad_prepared_call_arguments(engine, stays_vanilla):
    raises(TypeError, "max_new_tokens must be an int >= 0", engine.prepare, CTX, Q, method="vanilla", max_new_tokens=-1)
    raises(TypeError, "unexpected arguments", engine.prepare, CTX, Q, temperature=0.5)
    call = engine.prepare(CTX, Q, method="vanilla")
    raises(TypeError, "PreparedCall", engine.generate_prepared, "call")
    raises(TypeError, "score must be a string", engine.generate_prepared, call, score=5)
    raises(ValueError, "score is empty", engine.generate_prepared, call, score="")
    raises(TypeError, "answer must be a string", engine.answer_logprob, CTX, Q, None, method="vanilla")


# ----------------------------------------------------------------------------- LangChain adapter
@pytest.fixture
def lc(engine):
    pytest.importorskip("langchain_core")
    from qgpm_integrations.langchain import QGPMChatModel

    return QGPMChatModel(engine=engine, max_tokens=3)


@pytest.fixture
def generate_calls(engine, monkeypatch):
    calls = []
    real = engine.model.generate

    def spy(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(engine.model, "generate", spy, raising=False)
    return calls


def _empty_inputs():
    from langchain_core.messages import HumanMessage

    from qgpm_integrations.langchain import qgpm_prompt

    return {
        "context=[]": ([HumanMessage(Q)], {"context": []}),
        'context=""': ([HumanMessage(Q)], {"context": ""}),
        "context=[blank]": ([HumanMessage(Q)], {"context": ["  "]}),
        "marked, no documents": (qgpm_prompt().invoke({"context": [], "question": Q}).to_messages(), {}),
        "marked, empty string": (qgpm_prompt().invoke({"context": "", "question": Q}).to_messages(), {}),
    }


EMPTY_CASES = ["context=[]", 'context=""', "context=[blank]", "marked, no documents", "marked, empty string"]


@pytest.mark.parametrize("case", EMPTY_CASES)
def test_langchain_empty_context_says_so_and_does_not_run_the_model(lc, generate_calls, case):
    from qgpm_integrations.langchain import NO_CONTEXT_REPLY

    messages, kw = _empty_inputs()[case]
    msg = lc.invoke(messages, **kw)
    assert msg.content == NO_CONTEXT_REPLY
    info = msg.response_metadata["qgpm"]
    assert info["mode"] == "empty_context" and info["documents"] == 0 and "empty" in info["reason"]
    assert msg.usage_metadata["output_tokens"] == 0
    chunks = list(lc.stream(messages, **kw))
    assert "".join(c.content for c in chunks) == NO_CONTEXT_REPLY and chunks[-1].chunk_position == "last"
    assert generate_calls == [], "the model must not answer from nothing"


@pytest.mark.parametrize("case", EMPTY_CASES)
def test_langchain_empty_context_raises_when_asked(lc, generate_calls, case):
    messages, kw = _empty_inputs()[case]
    with pytest.raises(EmptyContextError, match="nothing to answer from"):
        lc.invoke(messages, on_empty_context="raise", **kw)
    strict = lc.model_copy(update={"on_empty_context": "raise"})
    with pytest.raises(EmptyContextError, match="nothing to answer from"):
        strict.invoke(messages, **kw)
    with pytest.raises(ValueError, match="on_empty_context must be one of"):
        lc.invoke(messages, on_empty_context="ignore", **kw)
    assert generate_calls == []


def test_langchain_unmarked_prompt_warns_once_per_instance(engine, lc, caplog):
    from qgpm_integrations.langchain import QGPMChatModel

    with caplog.at_level(logging.WARNING, logger="qgpm"):
        for _ in range(3):
            assert lc.invoke("Hello there.").response_metadata["qgpm"]["mode"] == "plain"
        QGPMChatModel(engine=engine, max_tokens=2).invoke("Hello again.")
        lc.invoke(Q, context=[CTX])  # calls with context never warn
    warnings = [r for r in caplog.records if r.name.startswith("qgpm") and "found no context in the prompt" in r.getMessage()]
    assert len(warnings) == 2, [r.getMessage() for r in caplog.records]
    assert "qgpm_prompt()" in warnings[0].getMessage() and "context=" in warnings[0].getMessage()


def test_langchain_get_num_tokens_uses_the_model_tokenizer(lc, engine, monkeypatch):
    import langchain_core.language_models.base as lc_base

    from qgpm.tokens import encode_plain

    def gpt2_fallback(text):
        raise AssertionError("LangChain's GPT-2 fallback tokenizer was used")

    monkeypatch.setattr(lc_base, "_get_token_ids_default_method", gpt2_fallback)
    text = "A small band played <|im_end|> old songs."
    assert lc.get_token_ids(text) == encode_plain(engine.tokenizer, text)
    assert lc.get_num_tokens(text) == len(encode_plain(engine.tokenizer, text))


def test_langchain_get_num_tokens_without_loading_the_model(tokenizer, monkeypatch):
    pytest.importorskip("langchain_core")
    import langchain_core.language_models.base as lc_base

    import qgpm_integrations.langchain.chat_models as cm
    from qgpm_integrations.langchain import QGPMChatModel

    monkeypatch.setattr(lc_base, "_get_token_ids_default_method", lambda text: (_ for _ in ()).throw(AssertionError("GPT-2 fallback")))
    monkeypatch.setattr(cm, "_get_engine", lambda *a: (_ for _ in ()).throw(AssertionError("the model was loaded")))
    n = QGPMChatModel().get_num_tokens("Hello there, world.")
    assert n == len(tokenizer("Hello there, world.", add_special_tokens=False)["input_ids"])


def test_empty_answer_to_score_fails_before_pass1(engine, stays_vanilla):
    raises(ValueError, "answer is empty", engine.answer_logprob, CTX, Q, "")


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(config={"k_sharp": 3}), TypeError, r"config must be a qgpm.QGPMConfig .*got dict"),
    (dict(reuse_prefill="no"), TypeError, "reuse_prefill must be True or False"),
    (dict(dtype="float33"), ValueError, "unknown dtype 'float33'; choose float32, bfloat16, float16 or auto"),
    (dict(model="/nonexistent/model_folder"), FileNotFoundError, "no model at /nonexistent/model_folder: that folder does not exist"),
    (dict(heads="no_such_heads.json"), FileNotFoundError, "head-set file not found: no_such_heads.json"),
    (dict(generator="http://127.0.0.1:8000"), TypeError, "generator must have check"),
], ids=["config", "reuse_prefill", "dtype", "model", "heads", "generator"])
def test_from_pretrained_refuses_bad_arguments_before_loading(monkeypatch, kwargs, exc, match):
    import qgpm.engine

    monkeypatch.setattr(qgpm.engine, "load_model", lambda *a, **k: (_ for _ in ()).throw(AssertionError("weights loaded")))
    monkeypatch.setattr(qgpm.engine, "load_pass1_model", lambda *a, **k: (_ for _ in ()).throw(AssertionError("weights loaded")))
    raises(exc, match, QGPM.from_pretrained, **kwargs)


def test_engine_settings_are_checked_on_every_assignment(engine):
    before = (engine.config, engine.reuse_prefill)
    raises(TypeError, r"config must be a qgpm.QGPMConfig", setattr, engine, "config", {"k_sharp": 3})
    raises(TypeError, "reuse_prefill must be True or False", setattr, engine, "reuse_prefill", "no")
    raises(TypeError, r"config must be a qgpm.QGPMConfig", QGPM, engine.model, engine.tokenizer, config={"k_sharp": 3})
    assert (engine.config, engine.reuse_prefill) == before
    engine.config = before[0].with_(k_sharp=3.0)
    assert engine.config.k_sharp == 3.0
    engine.config = before[0]


def test_stream_checks_at_once_and_prepares_at_the_first_piece(engine, monkeypatch):
    """engine.stream() raises for bad arguments at once; pass 1 runs only when the first
    piece is asked for (a stream closed before that runs nothing)."""
    import qgpm.engine

    raises(ValueError, "max_new_tokens must be >= 1", engine.stream, CTX, Q, max_new_tokens=0)
    prepared = []
    real = qgpm.engine.QGPM._prepare
    monkeypatch.setattr(qgpm.engine.QGPM, "_prepare", lambda self, *a: prepared.append(1) or real(self, *a))
    unused = engine.stream(CTX, Q, method="vanilla", max_new_tokens=3)
    unused.close()
    stream = engine.stream(CTX, Q, method="vanilla", max_new_tokens=3)
    assert prepared == []
    text = "".join(stream)
    assert prepared == [1] and stream.result is not None and stream.result.text == text.strip()


def test_too_long_says_which_part_to_shorten(engine, stays_vanilla):
    raises(ContextTooLongError, r"Shorten the context \(or retrieve fewer documents\)", engine.answer, TEN_MB, Q)
    raises(ContextTooLongError, "Shorten the longest text besides the context", engine.answer, CTX, TEN_MB, method="vanilla")
    raises(ContextTooLongError, "Shorten the longest text besides the context", engine.answer, CTX, Q, instruction=TEN_MB)


def test_an_answer_cut_by_max_time_finishes_for_length(engine):
    from transformers import LogitsProcessor, LogitsProcessorList

    class Slow(LogitsProcessor):
        def __call__(self, input_ids, scores):
            time.sleep(0.05)
            return scores

    res = engine.answer(CTX, Q, method="vanilla", max_new_tokens=40, max_time=0.1, logits_processor=LogitsProcessorList([Slow()]))
    assert res.usage.answer_tokens < 40 and res.finish_reason == "length"
