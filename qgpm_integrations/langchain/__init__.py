"""LangChain integration for QGPM.

* :class:`QGPMChatModel` -- a ``BaseChatModel`` answering with QGPM (or the vanilla /
  oracle / topk / reorder baselines) over a local model. It finds the context and the
  question in the RAG prompts chains already use (``create_stuff_documents_chain``,
  ``create_retrieval_chain``, "Context: ... Question: ..." prompts), in prompts marked by
  :func:`qgpm_prompt`, or in ``context=``; a plain chat model when there is none (with a
  warning), :data:`NO_CONTEXT_REPLY` when the context is empty.
* :func:`qgpm_prompt`, :class:`QGPMPromptTemplate`, :func:`format_documents` -- mark the
  context and question of an ordinary LCEL RAG chain for QGPM.
* :class:`QGPMTrace` -- a callback that keeps ``response_metadata["qgpm"]`` of each call,
  for chains that end in a string (``create_retrieval_chain``, ``StrOutputParser``).
* :class:`QGPMTopKCompressor`, :class:`QGPMReorder` -- reranker-based document
  compressors for ``ContextualCompressionRetriever`` / ``DocumentCompressorPipeline``.
* :class:`MiniLMEmbeddings`, :func:`bundled_embeddings` -- offline embeddings (bundled
  all-MiniLM-L6-v2).

Needs ``langchain-core`` (``pip install qgpm[langchain]``).
"""

from .callbacks import QGPMTrace
from .chat_models import NO_CONTEXT_REPLY, QGPM_METHODS, QGPMChatModel, clear_engine_cache
from .compressors import QGPMReorder, QGPMTopKCompressor, score_documents
from .embeddings import MiniLMEmbeddings, bundled_embeddings
from .runnables import qgpm_answer
from .prompts import (
    CONTEXT_ROLE,
    QGPM_ROLE_KEY,
    QUESTION_ROLE,
    QGPMDocuments,
    QGPMPromptTemplate,
    context_block,
    document_texts,
    format_documents,
    qgpm_prompt,
    question_block,
)

__all__ = [
    "QGPMChatModel",
    "qgpm_answer",
    "QGPM_METHODS",
    "NO_CONTEXT_REPLY",
    "clear_engine_cache",
    "QGPMTrace",
    "QGPMTopKCompressor",
    "QGPMReorder",
    "score_documents",
    "MiniLMEmbeddings",
    "bundled_embeddings",
    "qgpm_prompt",
    "QGPMPromptTemplate",
    "QGPMDocuments",
    "format_documents",
    "document_texts",
    "context_block",
    "question_block",
    "QGPM_ROLE_KEY",
    "CONTEXT_ROLE",
    "QUESTION_ROLE",
]
