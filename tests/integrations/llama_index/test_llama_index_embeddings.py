"""LlamaIndex's own HuggingFaceEmbedding on the bundled all-MiniLM-L6-v2, offline."""

from __future__ import annotations

import numpy as np
import pytest
from llama_index.embeddings.huggingface import HuggingFaceEmbedding

from qgpm.rerank import bundled_minilm_path, get_reranker
from qgpm_integrations.llama_index import bundled_embeddings

TEXTS = ["The telescope was made in Dundee.", "The bakery sells rye bread."]


def test_bundled_embeddings_is_huggingface_embedding_on_the_bundled_folder(li_embed):
    assert isinstance(li_embed, HuggingFaceEmbedding)
    assert li_embed.model_name == str(bundled_minilm_path())  # what it loaded, nothing else
    docs = np.array(li_embed.get_text_embedding_batch(TEXTS))
    ref = get_reranker("minilm").model.encode(TEXTS, normalize_embeddings=True)
    assert docs.shape == (2, 384) and np.allclose(docs, ref, atol=1e-5)
    q = np.array(li_embed.get_query_embedding("Where was the telescope built?"))
    assert abs(float(q @ q) - 1.0) < 1e-4 and float(q @ docs[0]) > float(q @ docs[1]) + 0.1


def test_bundled_embeddings_only_embeds_with_the_bundled_model():
    with pytest.raises(TypeError, match="always embeds with the bundled"):
        bundled_embeddings(model_name="sentence-transformers/all-mpnet-base-v2")
