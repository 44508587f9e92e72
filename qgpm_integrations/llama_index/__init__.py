"""LlamaIndex integration of QGPM (needs ``pip install qgpm[llama-index]``).

* :class:`QGPMLLM` -- an LLM for ``index.as_query_engine(llm=...)`` / ``Settings.llm`` that
  takes the retrieved context and the question from the synthesizer's template arguments
  and answers with QGPM (or vanilla / oracle / topk / reorder on the same engine).
* :class:`QGPMTopKPostprocessor`, :class:`QGPMReorderPostprocessor` -- the paper's
  input-editing baselines as node postprocessors.
* :func:`bundled_embeddings` -- LlamaIndex's ``HuggingFaceEmbedding`` on the bundled
  all-MiniLM-L6-v2 folder (offline).
* :class:`QGPMTrace` -- what ``response.metadata["qgpm"]`` holds.
"""

from ._tracing import QGPMTrace, split_context
from .embeddings import bundled_embeddings
from .llm import DEFAULT_REFINE_INSTRUCTION, QGPMLLM, set_tokenizer
from .postprocessors import QGPMReorderPostprocessor, QGPMTopKPostprocessor

__all__ = [
    "QGPMLLM",
    "QGPMTopKPostprocessor",
    "QGPMReorderPostprocessor",
    "bundled_embeddings",
    "QGPMTrace",
    "DEFAULT_REFINE_INSTRUCTION",
    "set_tokenizer",
    "split_context",
]
