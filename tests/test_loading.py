"""The GGUF de-quantization cache: same model and tokenizer as the GGUF, built once, rebuilt when broken;
loading keywords that no loader takes are named."""

from __future__ import annotations

import json

import pytest
import torch

from qgpm import QGPM, gguf_cache, loading


@pytest.mark.real_model
def test_gguf_cache_equals_direct_load_and_rebuilds_broken_entries(tmp_path, monkeypatch, caplog):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("QGPM_HOME", str(tmp_path))
    monkeypatch.setattr(loading, "_CACHE", {})  # a fresh process's view
    source = loading.default_model_source()
    folder = gguf_cache.cached_folder(source.path, source.gguf_file)
    assert folder is not None and folder.parent == tmp_path / "models" and gguf_cache.entry_complete(folder)
    manifest = json.loads((folder / gguf_cache.MANIFEST).read_text())
    assert any(name.endswith(".safetensors") for name in manifest["files"])

    direct = AutoModelForCausalLM.from_pretrained(source.path, gguf_file=source.gguf_file).eval()
    direct_tok = AutoTokenizer.from_pretrained(source.path, gguf_file=source.gguf_file)
    model = loading.load_model(source)
    tok = loading.load_tokenizer(source)
    text = "<|im_start|>user\nThe harbour master's log, 1912: tides at 4.2 m.<|im_end|>\n"
    assert tok(text)["input_ids"] == direct_tok(text)["input_ids"]
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == \
        direct_tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    ids = torch.tensor([direct_tok(text)["input_ids"]])
    with torch.inference_mode():
        torch.testing.assert_close(model(ids).logits, direct(ids).logits, rtol=0, atol=0)

    # a second "process" reads the cache, never the GGUF
    monkeypatch.setattr(loading, "_CACHE", {})
    monkeypatch.setattr(gguf_cache, "_build_entry", lambda *a, **k: pytest.fail("rebuilt a complete entry"))
    assert gguf_cache.cached_folder(source.path, source.gguf_file) == folder
    monkeypatch.undo()
    monkeypatch.setenv("QGPM_HOME", str(tmp_path))

    # a truncated weights file is detected and the entry rebuilt
    weights = next(folder / n for n in manifest["files"] if n.endswith(".safetensors"))
    with open(weights, "r+b") as fh:
        fh.truncate(1000)
    assert not gguf_cache.entry_complete(folder)
    with caplog.at_level("WARNING", logger="qgpm"):
        again = gguf_cache.cached_folder(source.path, source.gguf_file)
    assert again == folder and gguf_cache.entry_complete(folder)
    assert any("incomplete or corrupt" in r.getMessage() for r in caplog.records)
    # a missing manifest (a crash before the last write) is an incomplete entry too
    (folder / gguf_cache.MANIFEST).unlink()
    assert not gguf_cache.entry_complete(folder)


def test_gguf_cache_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("QGPM_GGUF_CACHE", "0")
    src = loading.ModelSource(path="/nowhere", gguf_file="x.gguf", name="x")
    assert gguf_cache.cached_folder(src.path, src.gguf_file) is None
    assert loading._load_path(src) == ("/nowhere", {"gguf_file": "x.gguf"})
    plain = loading.ModelSource(path="some/hf-id")
    assert loading._load_path(plain) == ("some/hf-id", {})


def test_a_misspelt_loading_keyword_is_named_with_the_argument_it_resembles(tiny_dir):
    with pytest.raises(TypeError, match=r"'devce_map' is not an argument of AutoModelForCausalLM.from_pretrained.*Did you mean 'device_map'\?"):
        QGPM.from_pretrained(str(tiny_dir), devce_map="cpu")
    with pytest.raises(TypeError, match=r"'hedas' is not an argument.*Did you mean 'heads'\? Check the keywords given to QGPM.from_pretrained"):
        QGPM.from_pretrained(str(tiny_dir), hedas=[(1, 0)])
    with pytest.raises(TypeError, match=r"'zzqq' is not an argument") as err:
        loading.load_model(loading.resolve_source(str(tiny_dir)), zzqq=1)
    assert "Did you mean" not in str(err.value)
    model = loading.load_model(loading.resolve_source(str(tiny_dir)))  # nothing half-made was cached
    assert not model.training


def test_a_type_error_that_names_no_given_keyword_passes_through_unchanged():
    err = TypeError("LlamaForCausalLM.__init__() got an unexpected keyword argument 'other'")
    assert loading._unexpected_keyword(err, {"device_map": "cpu"}) is None
    assert loading._unexpected_keyword(err, {"other": 1}) == "other"
    assert loading._unexpected_keyword(TypeError("bad operand"), {"other": 1}) is None
