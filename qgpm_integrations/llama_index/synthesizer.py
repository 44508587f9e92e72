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
With no nodes, or only nodes without visible text, the response is LlamaIndex's ``"Empty Response"``
and the model is not run.

The model call is a span and an LLM event of the :class:`QGPMLLM`, as a completion through
LlamaIndex's own synthesizers is: its callback manager sees ``CBEventType.LLM`` with the prompt and the
completion (whose ``raw["usage"]`` a ``TokenCountingHandler`` counts), and the instrumentation
dispatcher ``LLMCompletionStartEvent`` / ``LLMCompletionEndEvent``. The event's prompt is the
text the engine renders from the nodes and the question (for ``topk``, ``reorder`` and
``llmlingua-2``: before the context is edited).
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncGenerator, Generator, Iterator, Optional, Sequence

from llama_index.core.base.llms.types import CompletionResponseAsyncGen, CompletionResponseGen
from llama_index.core.callbacks import CallbackManager
from llama_index.core.indices.prompt_helper import ChatPromptHelper, PromptHelper
from llama_index.core.prompts.mixin import PromptDictType
from llama_index.core.response_synthesizers import BaseSynthesizer
from llama_index.core.types import RESPONSE_TEXT_TYPE

from qgpm import QGPMResult
from qgpm.prompt import PromptSpec, has_visible_text, normalize_spec, render_prompt

from ._prompt import PromptParts
from ._responses import LLMCall
from .._common import iterate_in_thread
from .call_args import decoding_args
from .llm import QGPMLLM

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

    def _call(self, query_str: str, text_chunks: Sequence[str], response_kwargs: dict[str, Any]) -> Optional[LLMCall]:
        """The engine call for the chunks with visible text; ``None`` when none has any (the arguments still checked)."""
        documents = tuple(c for c in text_chunks if has_visible_text(c))
        if not documents:
            decoding_args(self.llm, response_kwargs)  # an unknown or bad argument raises here too
            return None
        return self.llm._answer_call(PromptParts(documents=documents, question=query_str, source="nodes"), self.llm.system_prompt, response_kwargs)

    def get_response(self, query_str: str, text_chunks: Sequence[str], **response_kwargs: Any) -> RESPONSE_TEXT_TYPE:
        """The answer to ``query_str`` from ``text_chunks`` (a text generator when streaming).

        ``response_kwargs`` may set ``max_new_tokens`` / ``max_tokens``, ``temperature``,
        ``top_p``, ``stop`` and ``seed`` for this call.
        """
        call = self._call(query_str, text_chunks, response_kwargs)
        if call is None:
            return self._empty_response_generator() if self._qgpm_streaming else self._empty_response
        prompt = _event_prompt(self.llm, call)
        if self._qgpm_streaming:
            pieces = self.llm._pieces(call)
            return _texts(self.llm._stream_nodes(prompt, pieces), pieces)
        return self.llm._complete_nodes(prompt, call).text

    async def aget_response(self, query_str: str, text_chunks: Sequence[str], **response_kwargs: Any) -> RESPONSE_TEXT_TYPE:
        """:meth:`get_response` with the model in worker threads."""
        call = self._call(query_str, text_chunks, response_kwargs)
        if call is None:
            return self._empty_response_agenerator() if self._qgpm_streaming else self._empty_response
        prompt = _event_prompt(self.llm, call)
        if self._qgpm_streaming:
            pieces = iterate_in_thread(await asyncio.to_thread(self.llm._pieces, call))
            return _atexts(await self.llm._astream_nodes(prompt, pieces), pieces)
        return (await self.llm._acomplete_nodes(prompt, call)).text


def _event_prompt(llm: QGPMLLM, call: LLMCall) -> str:
    """The prompt the engine renders for ``call``, for the LLM event (the context as the nodes give it)."""
    documents, question = call.args
    kw = call.kwargs
    spec = PromptSpec(context=list(documents), question=question, instruction=kw.get("instruction"), system=kw.get("system"),
                      answer_prefix=kw.get("answer_prefix"))
    return render_prompt(llm.engine.tokenizer, normalize_spec(spec)).text


def _texts(responses: CompletionResponseGen, pieces: Iterator[tuple[str, Optional[QGPMResult]]]) -> Generator[str, None, None]:
    try:
        for response in responses:
            if response.delta:
                yield response.delta
    finally:
        responses.close()
        pieces.close()  # type: ignore[attr-defined]  # a stream left early stops generating


async def _atexts(responses: CompletionResponseAsyncGen, pieces: AsyncGenerator[tuple[str, Optional[QGPMResult]], None]) -> AsyncGenerator[str, None]:
    try:
        async for response in responses:
            if response.delta:
                yield response.delta
    finally:
        await responses.aclose()
        await pieces.aclose()
