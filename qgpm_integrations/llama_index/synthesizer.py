"""``QGPMSynthesizer``: a LlamaIndex response synthesizer that answers the retrieved nodes with QGPM.

A query engine hands its response synthesizer the question and the retrieved nodes as two
separate things. ``QGPMSynthesizer`` passes them on unchanged, in one call:
``engine.answer(context=[node texts], question=query_str, method=...)`` -- the node texts
as LlamaIndex shows them to an LLM (``MetadataMode.LLM``), each one a document. No prompt
template is formatted and nothing is read back out of a prompt.

    from llama_index.core.query_engine import RetrieverQueryEngine
    from qgpm_integrations.llama_index import QGPMLLM, QGPMSynthesizer

    llm = QGPMLLM(method="qgpm", max_new_tokens=32)
    synthesizer = QGPMSynthesizer(llm=llm)                  # streaming=True for streamed answers
    query_engine = RetrieverQueryEngine(index.as_retriever(similarity_top_k=4), synthesizer)
    # or: index.as_query_engine(llm=llm, response_synthesizer=synthesizer)
    response = query_engine.query("Who is the reading room named after?")
    print(response, response.metadata["qgpm"].explain(3))

The method, decoding and prompt settings (``instruction``, ``system_prompt``,
``answer_prefix``, ...) are those of the :class:`QGPMLLM` it is given. ``query`` /
``aquery`` and streaming responses (``response_gen`` / ``async_response_gen()``) all work;
``response.metadata["qgpm"]`` is a :class:`~qgpm_integrations.llama_index.QGPMTrace` holding
the call's :class:`qgpm.QGPMResult` (a streaming response's once the stream has been read).
With no nodes the response is LlamaIndex's ``"Empty Response"`` and the model is not run.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncGenerator, Generator, Iterator, Optional, Sequence

from llama_index.core.callbacks import CallbackManager
from llama_index.core.indices.prompt_helper import ChatPromptHelper, PromptHelper
from llama_index.core.prompts.mixin import PromptDictType
from llama_index.core.response_synthesizers import BaseSynthesizer
from llama_index.core.types import RESPONSE_TEXT_TYPE

from qgpm import QGPMResult

from ._prompt import PromptParts
from .._common import iterate_in_thread
from .llm import QGPMLLM, LLMCall

__all__ = ["QGPMSynthesizer"]


class QGPMSynthesizer(BaseSynthesizer):
    """Answer a query engine's question from its retrieved nodes with QGPM (see the module docs).

    Args:
        llm: The :class:`QGPMLLM` whose engine and settings answer. Without it, one is built
            from ``llm_kwargs`` (any :class:`QGPMLLM` argument: ``engine=``, ``model_name=``,
            ``method=``, ``max_new_tokens=``, ...).
        streaming: Return streaming responses (``response_gen`` / ``async_response_gen()``).
        callback_manager: LlamaIndex callback manager (default: ``Settings.callback_manager``,
            as for LlamaIndex's own synthesizers).
    """

    def __init__(
        self,
        llm: Optional[QGPMLLM] = None,
        *,
        streaming: bool = False,
        callback_manager: Optional[CallbackManager] = None,
        **llm_kwargs: Any,
    ) -> None:
        if llm is None:
            llm = QGPMLLM(**llm_kwargs)
        elif llm_kwargs:
            raise ValueError(f"pass either llm= or QGPMLLM settings ({', '.join(sorted(llm_kwargs))}), not both")
        elif not isinstance(llm, QGPMLLM):
            raise TypeError(
                f"QGPMSynthesizer answers with a QGPMLLM's engine and settings; got llm={type(llm).__name__}. "
                "Pass llm=QGPMLLM(...), or QGPMLLM settings such as engine=... and method=..."
            )
        # LlamaIndex's synthesizers keep prompt helpers; these count with the model's tokenizer
        super().__init__(
            llm=llm,
            callback_manager=callback_manager,
            prompt_helper=PromptHelper.from_llm_metadata(llm.metadata, tokenizer=llm.token_ids),
            chat_prompt_helper=ChatPromptHelper.from_llm_metadata(llm.metadata, tokenizer=llm.token_ids),
            streaming=streaming,
        )
        self._qgpm_llm = llm
        self._qgpm_streaming = streaming

    @property
    def llm(self) -> QGPMLLM:
        """The :class:`QGPMLLM` that answers."""
        return self._qgpm_llm

    def _get_prompts(self) -> PromptDictType:
        """No prompt templates: the nodes and the question go to the engine as they are."""
        return {}

    def _update_prompts(self, prompts: PromptDictType) -> None:
        """Nothing to update (see :meth:`_get_prompts`); QGPM's prompt is set on the LLM (``instruction``, ...)."""

    def _call(self, query_str: str, text_chunks: Sequence[str], response_kwargs: dict[str, Any]) -> LLMCall:
        parts = PromptParts(documents=tuple(c for c in text_chunks if c.strip()), question=query_str, source="nodes")
        return self.llm._answer_call(parts, self.llm.system_prompt, response_kwargs)

    def get_response(self, query_str: str, text_chunks: Sequence[str], **response_kwargs: Any) -> RESPONSE_TEXT_TYPE:
        """The answer to ``query_str`` from ``text_chunks`` (a text generator when streaming).

        ``response_kwargs`` may set ``max_new_tokens`` / ``max_tokens``, ``temperature``,
        ``top_p``, ``stop`` and ``seed`` for this call.
        """
        call = self._call(query_str, text_chunks, response_kwargs)
        if self._qgpm_streaming:
            return _texts(self.llm._pieces(call))
        return self.llm._run(call).text

    async def aget_response(self, query_str: str, text_chunks: Sequence[str], **response_kwargs: Any) -> RESPONSE_TEXT_TYPE:
        """:meth:`get_response` with the model in worker threads."""
        call = self._call(query_str, text_chunks, response_kwargs)
        if self._qgpm_streaming:
            pieces = await asyncio.to_thread(self.llm._pieces, call)
            return _atexts(iterate_in_thread(pieces))
        result = await asyncio.to_thread(self.llm._run, call)
        return result.text


def _texts(pieces: Iterator[tuple[str, Optional[QGPMResult]]]) -> Generator[str, None, None]:
    try:
        for piece, _ in pieces:
            if piece:
                yield piece
    finally:
        pieces.close()  # type: ignore[attr-defined]  # a stream left early stops generating


async def _atexts(pieces: AsyncGenerator[tuple[str, Optional[QGPMResult]], None]) -> AsyncGenerator[str, None]:
    try:
        async for piece, _ in pieces:
            if piece:
                yield piece
    finally:
        await pieces.aclose()
