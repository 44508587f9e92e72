"""Embeddings report the model they use."""

from __future__ import annotations

import numpy as np
import pytest

from qgpm.rerank import bundled_minilm_path, get_reranker
from qgpm_integrations.langchain import MiniLMEmbeddings, bundled_embeddings

TEXTS = ["The telescope was made in Dundee.", "The bakery sells rye bread."]


def test_bundled_embeddings_are_the_bundled_minilm_and_say_so():
    emb = bundled_embeddings()
    assert isinstance(emb, MiniLMEmbeddings)
    assert emb.model_name == str(bundled_minilm_path())
    ref = get_reranker("minilm").model.encode(TEXTS, normalize_embeddings=True)
    assert np.allclose(np.array(emb.embed_documents(TEXTS)), ref, atol=1e-6)
    with pytest.raises(TypeError, match="always embeds with the bundled"):
        bundled_embeddings(model="sentence-transformers/all-mpnet-base-v2")


def test_another_model_is_reported_as_that_model():
    path = str(bundled_minilm_path())
    assert MiniLMEmbeddings(model=path).model_name == path
    assert MiniLMEmbeddings(model="sentence-transformers/all-mpnet-base-v2").model_name == "sentence-transformers/all-mpnet-base-v2"
    loaded = get_reranker("minilm").model
    assert MiniLMEmbeddings(model=loaded).model_name == path


def test_langchain_huggingface_on_the_bundled_folder_gives_the_same_vectors():
    hf = pytest.importorskip("langchain_huggingface", reason="langchain-huggingface requires huggingface-hub<2; not a dependency")
    emb = hf.HuggingFaceEmbeddings(model_name=str(bundled_minilm_path()), encode_kwargs={"normalize_embeddings": True})
    assert np.allclose(np.array(emb.embed_documents(TEXTS)), np.array(bundled_embeddings().embed_documents(TEXTS)), atol=1e-6)
