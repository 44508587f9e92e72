"""LlamaIndex integration of QGPM (needs ``pip install qgpm[llama-index]``).

* :class:`QGPMSynthesizer` -- a response synthesizer for a query engine: it hands the
  retrieved nodes and the question to QGPM as they are, in one call.
* :class:`QGPMLLM` -- a ``CustomLLM`` for ``index.as_query_engine(llm=...)`` and anywhere
  LlamaIndex takes an LLM: it reads the context and the question back out of the
  synthesizer's prompt and answers with QGPM (or vanilla / oracle / topk / reorder / ... on
  the same engine); other prompts are plain generation.
* :class:`QGPMTopKPostprocessor`, :class:`QGPMReorderPostprocessor` -- the paper's
  input-editing baselines as node postprocessors.
* :func:`bundled_embeddings` -- LlamaIndex's ``HuggingFaceEmbedding`` on the bundled
  all-MiniLM-L6-v2 folder (offline).
* :class:`QGPMTrace` -- what ``response.metadata["qgpm"]`` holds.
* :func:`set_tokenizer` -- count LlamaIndex's tokens with the model's tokenizer.
"""

from ._prompt import messages_to_prompt, split_context
from ._tracing import QGPMTrace
from .embeddings import bundled_embeddings
from ._tokens import set_tokenizer
from .llm import DEFAULT_REFINE_INSTRUCTION, QGPMLLM
from .postprocessors import QGPMReorderPostprocessor, QGPMTopKPostprocessor
from .synthesizer import QGPMSynthesizer

__all__ = [
    "QGPMLLM",
    "QGPMSynthesizer",
    "QGPMTopKPostprocessor",
    "QGPMReorderPostprocessor",
    "bundled_embeddings",
    "QGPMTrace",
    "DEFAULT_REFINE_INSTRUCTION",
    "messages_to_prompt",
    "set_tokenizer",
    "split_context",
]
