"""LLMLingua-2 as an input-editing baseline (method="llmlingua-2"), on a tiny random token
classifier. The compressor tests need the ``llmlingua`` package and skip without it; the
settings tests do not."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from qgpm_testing import tiny_model

from qgpm import QGPM, LLMLingua2Options
from qgpm.baselines import options_from_strings, resolve_options

CONTEXT = [" ".join(f"Sentence number {i} of document {d} talks about topic {i % 7}." for i in range(30)) for d in range(2)]
QUESTION = "Which topic does sentence 3 talk about?"


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every test here runs the tiny model on one thread (see conftest.one_thread)."""


def test_settings_are_validated():
    with pytest.raises(ValueError, match="model is required"):
        LLMLingua2Options()
    with pytest.raises(ValueError, match="model is required"):
        resolve_options("llmlingua-2", None)
    with pytest.raises(ValueError, match="must contain one of xlm-roberta-large, bert-base-multilingual-cased"):
        LLMLingua2Options(model="/models/my-compressor")
    with pytest.raises(ValueError, match="rate must be in"):
        LLMLingua2Options(model="x/llmlingua-2-xlm-roberta-large-meetingbank", rate=1.5)
    with pytest.raises(TypeError, match="force_tokens"):
        LLMLingua2Options(model="x/llmlingua-2-xlm-roberta-large-meetingbank", force_tokens=["\n", ""])
    opts = LLMLingua2Options(model="x/llmlingua-2-xlm-roberta-large-meetingbank", force_tokens=["\n", "?"])
    assert opts.force_tokens == ("\n", "?") and opts.rate == 0.33
    got = options_from_strings(["llmlingua-2.model=x/llmlingua-2-xlm-roberta-large-meetingbank", "llmlingua-2.force_tokens=\\n,?,.", "llmlingua-2.rate=0.5"])
    assert got["llmlingua-2"] == LLMLingua2Options(model="x/llmlingua-2-xlm-roberta-large-meetingbank", force_tokens=("\n", "?", "."), rate=0.5)


def test_missing_package_says_how_to_install(monkeypatch, tokenizer):
    from qgpm.baselines.llmlingua import load_compressor

    monkeypatch.setitem(sys.modules, "llmlingua", None)
    with pytest.raises(ImportError, match="pip install llmlingua"):
        load_compressor(LLMLingua2Options(model="x/tiny-bert-base-multilingual-cased"))


@pytest.fixture(scope="module")
def compressor_dir(tmp_path_factory):
    """A tiny random BERT token classifier with a WordPiece tokenizer (the bundled MiniLM's),
    in a folder named like the released multilingual-BERT compressor."""
    pytest.importorskip("llmlingua")
    from transformers import AutoTokenizer, BertConfig, BertForTokenClassification

    from qgpm.rerank import bundled_minilm_path

    tok = AutoTokenizer.from_pretrained(str(bundled_minilm_path()))
    d = tmp_path_factory.mktemp("c") / "tiny-llmlingua-2-bert-base-multilingual-cased"
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                     num_labels=2, max_position_embeddings=512, architectures=["BertForTokenClassification"])
    BertForTokenClassification(cfg).save_pretrained(d)
    tok.save_pretrained(d)
    return d


@pytest.fixture
def offline(monkeypatch):
    """No sockets and no tiktoken encodings (they would be downloaded)."""
    import pytest_socket
    import tiktoken

    def trap(*a, **k):
        raise AssertionError(f"tiktoken was asked for an encoding {a}: that needs a download")

    monkeypatch.setattr(tiktoken, "encoding_for_model", trap)
    monkeypatch.setattr(tiktoken, "get_encoding", trap)
    pytest_socket.disable_socket(allow_unix_socket=True)
    yield
    pytest_socket.enable_socket()


def test_llmlingua2_compresses_each_document_and_answers(compressor_dir, tokenizer, offline):
    from qgpm.baselines.llmlingua import clear_compressor_cache

    clear_compressor_cache()
    engine = QGPM(tiny_model("llama", len(tokenizer)), tokenizer, heads=[(1, 0)])
    opts = LLMLingua2Options(model=str(compressor_dir), rate=0.4)
    res = engine.answer(CONTEXT, QUESTION, method="llmlingua-2", options=opts, max_new_tokens=3)
    van = engine.answer(CONTEXT, QUESTION, method="vanilla", max_new_tokens=3)
    edit = res.edit
    assert res.method == "llmlingua-2" and edit.mode == "llmlingua-2" and len(edit.documents) == 2
    assert 0 < res.details["compressed_tokens"] < res.details["original_tokens"]
    assert res.usage.prompt_tokens < 0.75 * van.usage.prompt_tokens
    words = set(" ".join(CONTEXT).lower().replace(".", " . ").split())
    assert set(edit.text.lower().replace(".", " . ").split()) <= words  # words are kept or dropped, never invented
    assert res.timings.edit_s > 0 and not res.relevance
    # rate 1 keeps every word
    full = engine.prepare(CONTEXT, QUESTION, method="llmlingua-2", options=opts.with_(rate=1.0))
    assert full.edit.text.split() == "\n\n".join(CONTEXT).lower().split()
    with pytest.raises(ValueError, match="evidence= is only used by method='oracle'"):
        engine.answer(CONTEXT, QUESTION, method="llmlingua-2", options=opts, evidence=["x"])


def test_llmlingua2_in_the_eval_harness(compressor_dir, tokenizer, tmp_path, offline):
    from qgpm.eval.runner import run_eval

    engine = QGPM(tiny_model("llama", len(tokenizer)), tokenizer, heads=[(1, 0)], name="tiny-llama")
    opts = {"llmlingua-2": LLMLingua2Options(model=str(compressor_dir))}
    out = run_eval(engine, tasks=["qa_1"], lengths=[256], depths=[0.5], n=1, methods=["vanilla", "llmlingua-2"], out_dir=tmp_path / "r",
                   max_new_tokens=4, progress=False, on_error="raise", options=opts, write_report=False)
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert [r["method"] for r in rows] == ["vanilla", "llmlingua-2"]
    ll = rows[1]
    assert ll["prompt_tokens"] < rows[0]["prompt_tokens"] and ll["baseline"]["compressed_tokens"] > 0
    man = json.loads((out / "manifest.json").read_text())
    assert man["latest"]["options"]["llmlingua-2"]["model"] == str(compressor_dir)
    with pytest.raises(ValueError, match="model is required"):
        run_eval(engine, tasks=["qa_1"], lengths=[256], n=1, methods=["llmlingua-2"], out_dir=tmp_path / "s", progress=False)
