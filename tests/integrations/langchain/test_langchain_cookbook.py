"""Embeddings, vector store and the cookbook script (smoke: one question, all four methods)."""

from __future__ import annotations

import math

import pytest

from qgpm_lc_support import lc_heads, load_cookbook

USES_REAL_MODEL = True


def test_minilm_embeddings_are_normalized_and_meaningful():
    from qgpm_integrations.langchain import MiniLMEmbeddings

    emb = MiniLMEmbeddings()
    docs = emb.embed_documents(["The telescope was made in Dundee.", "The bakery sells rye bread."])
    q = emb.embed_query("Where was the telescope built?")
    assert len(q) == 384 and all(len(d) == 384 for d in docs)
    assert math.isclose(sum(x * x for x in q), 1.0, rel_tol=1e-4)
    sims = [sum(a * b for a, b in zip(q, d)) for d in docs]
    assert sims[0] > sims[1] + 0.1
    assert emb.embed_documents([]) == []


def test_vector_store_over_the_corpus(corpus_store):
    assert len(corpus_store.store) == 96  # 16 files x 6 paragraphs
    hits = corpus_store.similarity_search("How many beds does the Fernside Wing have?", k=3)
    assert any("36 beds" in d.page_content for d in hits)
    assert all(d.metadata["source"].endswith(".md") for d in hits)


def test_cookbook_runs_one_question_with_all_methods(capsys, tmp_path):
    """Run from a copy of its data (--data): the copy's one question is the one answered."""
    import json
    import shutil

    cookbook = load_cookbook()
    data = tmp_path / "data"
    shutil.copytree(cookbook.DATA, data)
    second = json.loads((data / "questions.json").read_text(encoding="utf-8"))[1]
    (data / "questions.json").write_text(json.dumps([second]), encoding="utf-8")
    rows = cookbook.main(["--limit", "1", "--k", "4", "--max-tokens", "4", "--data", str(data)], heads=lc_heads())
    out = capsys.readouterr().out
    assert len(rows) == 1 and f"[1] {second['question']}" in out
    for m in ("vanilla", "qgpm", "topk", "reorder"):
        assert f"  {m} " in out
        assert isinstance(rows[0][m]["text"], str)
    assert rows[0]["qgpm"]["mode"] == "context", "the standard retrieval chain must run QGPM, not plain chat"
    assert rows[0]["vanilla"]["mode"] == "context"
    assert "QGPM ranked highest" in out and "#1 z=" in out
    assert any(p in out for p in ("promoted", "term filter", "left in place"))  # what the plan did with each sentence
    assert "accuracy: vanilla=" in out


def test_cookbook_rejects_unknown_methods():
    with pytest.raises(SystemExit):
        load_cookbook().main(["--methods", "qgpm,nope"])


def test_cookbook_run_from_elsewhere_names_its_data_folder(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        load_cookbook().main(["--data", str(tmp_path)])
    assert stop.value.code == 2 and "no questions.json and corpus/ there" in capsys.readouterr().err
