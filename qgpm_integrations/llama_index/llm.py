"""``QGPMLLM``: a LlamaIndex ``CustomLLM`` over a :class:`qgpm.QGPM` engine.

    from llama_index.core.query_engine import RetrieverQueryEngine
    from qgpm_integrations.llama_index import QGPMLLM, QGPMSynthesizer

    llm = QGPMLLM()                                   # embedded SmolLM2-135M-Instruct
    synthesizer = QGPMSynthesizer(llm=llm)            # the nodes and the question, handed over apart
    query_engine = RetrieverQueryEngine(index.as_retriever(similarity_top_k=4), synthesizer)
    response = query_engine.query("Who is the reading room named after?")
    print(response, response.metadata["qgpm"].explain(3))

Like LlamaIndex's ``HuggingFaceLLM``, the class writes ``complete``, ``stream_complete`` and
``metadata``; chat comes from ``CustomLLM``, which joins the messages into one prompt with
``messages_to_prompt`` (default: :func:`messages_to_prompt`) and completes it (``achat`` /
``astream_chat`` through the async completions). ``acomplete``
and ``astream_complete`` run the model in worker threads, so the event loop stays free, and
cancelling either stops generation.

What a completion does with its prompt
--------------------------------------
The prompt is read as a question-answering prompt (:func:`._prompt.read_prompt`:
LlamaIndex's default QA / tree-summarize / refine templates exactly, any other template by
the core's prompt-shape reader). Where a context and a question are found, the call is
``engine.answer(documents, question, method=...)`` with QGPM's own prompt (instruction,
context, question -- the question last, where QGPM reads relevance from); on refine steps
the earlier answer goes into :attr:`QGPMLLM.refine_instruction`. Otherwise the prompt is
answered as one user message through the model's chat template (``engine.chat``,
``result.method == "plain"``). So ``index.as_query_engine(llm=QGPMLLM(...))`` answers with
QGPM in every response mode; :class:`~qgpm_integrations.llama_index.QGPMSynthesizer` does
the same without formatting and reading back any prompt, with the nodes as documents.

Where the result goes
---------------------
Every finished call's :class:`qgpm.QGPMResult` is in ``CompletionResponse.raw["result"]``
(with ``raw["usage"]``; a stream's last response, an empty delta, carries them), in
:attr:`QGPMLLM.last_result`, and, for calls a response synthesizer makes, in the
response's ``metadata["qgpm"]`` (a :class:`~qgpm_integrations.llama_index.QGPMTrace`).

The model's tokenizer counts LlamaIndex's tokens only where asked: :func:`set_tokenizer`
(or ``QGPMLLM(..., set_global_tokenizer=True)``) sets the global tokenizer; building an
LLM leaves LlamaIndex's ``Settings`` as they are.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from contextlib import aclosing
from typing import Any, Generator, Iterator, Optional, Sequence

from llama_index.core.base.llms.types import CompletionResponse, CompletionResponseAsyncGen, CompletionResponseGen, LLMMetadata
from llama_index.core.bridge.pydantic import ConfigDict, Field, PrivateAttr
from llama_index.core.base.llms.generic_utils import astream_completion_response_to_chat_response, completion_response_to_chat_response
from llama_index.core.base.llms.types import ChatMessage, ChatResponse, ChatResponseAsyncGen
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.llms.custom import CustomLLM

from qgpm import QGPM, QGPMResult
from qgpm.defaults import DEFAULT_K, DEFAULT_METHOD, DEFAULT_RERANKER, METHODS
from qgpm.methods import Stage, method_spec
from qgpm.serving import VLLMServer
from qgpm.sources import parse_source

from .._common import Cancellable, is_loaded_model, iterate_in_thread, shared_engine
from . import _tracing
from ._prompt import PromptParts, is_own_plain_prompt, read_prompt
from ._responses import LLMCall, acompletions, completion, completions
from ._tokens import plain_ids, qgpm_prompt_overhead, set_tokenizer
from ._tracing import QGPMTrace
from .call_args import check_context_window, check_init_args, check_no_query_wrapper, check_window, config_window, decoding_args

logger = logging.getLogger("qgpm")
dispatcher = get_dispatcher(__name__)

__all__ = ["QGPMLLM", "DEFAULT_REFINE_INSTRUCTION"]

DEFAULT_REFINE_INSTRUCTION = (
    "Answer the question using the text below. An earlier answer, found in other parts of "
    "the text, was: {existing_answer}\nKeep the earlier answer unless the text below gives a better one."
)
"""Instruction of a refine step; ``{existing_answer}`` is replaced by the answer so far."""


class QGPMLLM(CustomLLM):
    """LlamaIndex LLM over a :class:`qgpm.QGPM` engine.

    Model settings follow LlamaIndex's ``HuggingFaceLLM``: ``model_name`` (an HF id, a
    folder or a ``.gguf`` file; default the embedded SmolLM2-135M-Instruct) with
    ``model_kwargs`` / ``device_map`` for loading, or an already-loaded ``model`` and
    ``tokenizer``, or a shared ``engine``. The model loads when the LLM is built; an engine
    built from a model id is shared by every LLM and LangChain chat model of this process
    that names the same model, head set, loading arguments and server.

    Args:
        engine: A loaded engine to share (several ``QGPMLLM`` with different ``method``
            can share one).
        model_name: HF id, folder or ``.gguf`` path to load (``None`` = the embedded
            SmolLM2-135M-Instruct).
        model: An already-loaded transformers causal LM (with ``tokenizer``). A string
            here is taken as ``model_name``.
        tokenizer: The fast tokenizer of ``model``.
        model_kwargs: ``AutoModelForCausalLM.from_pretrained`` arguments: ``device_map``,
            ``dtype`` (or ``torch_dtype``), ``quantization_config``, ``attn_implementation``, ...
        device_map: Shortcut for ``model_kwargs["device_map"]`` (as in ``HuggingFaceLLM``).
        generate_kwargs: Further ``model.generate`` arguments (``repetition_penalty``,
            ``top_k``, ...); settings with a field of their own go in that field.
        heads: ``None`` (the stored head set), ``"calibrate"``, a head-set JSON path or
            ``[(layer, head), ...]``.
        context_window: Window reported to LlamaIndex, which packs retrieved text into it
            (default: the model's window less the tokens QGPM's own prompt takes around the
            context and question, :meth:`prompt_overhead`; larger values are rejected).
        is_chat_model: What ``metadata.is_chat_model`` reports (synthesizers then send
            LlamaIndex's chat templates, which ``messages_to_prompt`` joins into one prompt).
        method: ``qgpm`` | ``vanilla`` | ``oracle`` | ``topk`` | ``reorder`` | ``string`` |
            ``ms-poe`` | ``self-extend`` | ``llmlingua-2``.
        options: Settings of a baseline method (``qgpm.StringOptions``, ``MsPoEOptions``,
            ``SelfExtendOptions``, ``LLMLingua2Options``); ``None`` = the method's defaults.
        max_new_tokens: Answer budget (also ``metadata.num_output``).
        temperature, top_p, seed, stop: Decoding (greedy when ``temperature == 0``).
        system_prompt: System message of unformatted ``complete`` calls and of the prompts
            ``predict`` formats (LlamaIndex's ``LLM`` field); ``chat`` sends the messages as
            given, as ``HuggingFaceLLM`` does.
        instruction: Instruction of QGPM's prompt on first steps (``None`` = QGPM's default).
        refine_instruction: Instruction of refine steps, with ``{existing_answer}``.
        answer_prefix: Text that starts the answer (after the assistant header).
        reranker, k: For ``topk`` / ``reorder`` (a :func:`qgpm.rerank.get_reranker` spec).
        relevance: For ``qgpm``: where sentence relevance comes from (``"heads"``, a
            reranker spec, ``"heads+<reranker>"``; ``None`` = the engine's setting).
        evidence: For ``oracle``: exact substrings of the context to treat as evidence.
            Those absent from a call's context are ignored. A call whose context holds none
            of them (a refine step over another chunk, a retrieval that missed) answers with
            ``vanilla``: its result names that method, its
            ``details["llama_index"]["evidence_found"]`` is ``False``, and a warning is logged.
        vllm_url: Run pass 2 and decoding on a vLLM server at this address
            (:class:`qgpm.serving.VLLMServer`); pass 1 stays in this process. ``vllm_model``:
            the served model's name (default: the only one).
        set_global_tokenizer: Also call :func:`set_tokenizer` (off by default: building an
            LLM changes no LlamaIndex setting); a global tokenizer LlamaIndex already has is
            kept, with a warning (``set_tokenizer(llm, force=True)`` replaces it).

    Unknown arguments raise ``TypeError`` before anything is loaded.
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True, protected_namespaces=())

    model_name: Optional[str] = Field(default=None, description="HF id, folder or .gguf path the model was loaded from.")
    model_kwargs: dict[str, Any] = Field(default_factory=dict, description="AutoModelForCausalLM.from_pretrained arguments.")
    generate_kwargs: dict[str, Any] = Field(default_factory=dict, description="Further model.generate arguments.")
    context_window: Optional[int] = Field(
        default=None, gt=0, description="Window reported to LlamaIndex (default: the model's, less the tokens of QGPM's own prompt).")
    is_chat_model: bool = Field(default=False, description="What metadata.is_chat_model reports.")
    method: str = Field(default=DEFAULT_METHOD, description=" | ".join(METHODS))
    options: Any = Field(default=None, description="Baseline settings (qgpm.StringOptions / MsPoEOptions / SelfExtendOptions / LLMLingua2Options).")
    max_new_tokens: int = Field(default=64, gt=0, description="Tokens to generate at most.")
    temperature: float = Field(default=0.0, ge=0.0, description="0 = greedy decoding.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: Optional[int] = Field(default=None)
    stop: Optional[list[str]] = Field(default=None, description="Stop strings (cut from the answer).")
    instruction: Optional[str] = Field(default=None, description="Instruction of first-step prompts.")
    refine_instruction: str = Field(default=DEFAULT_REFINE_INSTRUCTION)
    answer_prefix: Optional[str] = Field(default=None)
    reranker: Any = Field(default=DEFAULT_RERANKER, description="Reranker spec for topk / reorder.")
    k: int = Field(default=DEFAULT_K, gt=0, description="Chunks kept by topk.")
    relevance: Optional[str] = Field(
        default=None,
        description="method='qgpm': where sentence relevance comes from ('heads', a reranker spec such as 'minilm' or "
        "'bm25', or 'heads+<reranker>'); None = the engine's setting (QGPMConfig.relevance).",
    )
    evidence: Optional[list[str]] = Field(default=None, description="Evidence for method='oracle'.")
    vllm_url: Optional[str] = Field(default=None, description="Generate on a vLLM server at this address (qgpm.serving.VLLMServer).")
    vllm_model: Optional[str] = Field(default=None, description="The served model's name on the vllm_url server (default: the only one).")

    _engine: Any = PrivateAttr()
    _lock: Any = PrivateAttr(default=None)
    _last: Optional[QGPMResult] = PrivateAttr(default=None)
    _warned_plain: set = PrivateAttr(default_factory=set)  # True: LlamaIndex's own plain prompts said; False: any other said
    _overheads: dict = PrivateAttr(default_factory=dict)

    def __init__(
        self,
        engine: QGPM | None = None,
        *,
        model: Any = None,
        tokenizer: Any = None,
        heads: Any = None,
        device_map: Any = None,
        set_global_tokenizer: bool = False,
        **kwargs: Any,
    ) -> None:
        spec, model, load_kwargs = check_init_args(type(self).model_fields, kwargs, engine, model, tokenizer, heads, device_map)
        super().__init__(**kwargs)
        if engine is None and not is_loaded_model(model) and self.context_window is not None:
            check_context_window(self.context_window, config_window(self.model_name), 0)  # before the weights load
        if engine is None:
            if is_loaded_model(model):
                generator = VLLMServer(self.vllm_url, model=self.vllm_model) if self.vllm_url is not None else None
                engine = QGPM(model, tokenizer, heads=heads, generator=generator)
            else:
                engine = shared_engine(self.model_name, heads, load_kwargs, self.vllm_url, self.vllm_model)
        self._engine = engine
        window = engine.max_length
        check_context_window(self.context_window, window, self.prompt_overhead())
        check_window(self.max_new_tokens, self.metadata.context_window)
        if spec.rotary:  # a family or rotary kind qgpm cannot patch: now, not as "Empty Response" at the first query
            engine.require_supported()
        if spec.stage is Stage.HEADS and parse_source(self.relevance or engine.config.relevance).heads:
            engine.heads  # raise HeadSetMissingError now rather than at the first query
        self._lock = threading.Lock()
        _tracing.install()
        if set_global_tokenizer and not set_tokenizer(engine):
            logger.warning("QGPMLLM(set_global_tokenizer=True): LlamaIndex already has a global tokenizer (its tiktoken default "
                           "once a splitter or an index has asked for one), so it keeps counting tokens with that one; call "
                           "set_tokenizer(llm, force=True) to count with the model's tokenizer")

    @classmethod
    def from_model_id(cls, model_id: str, **kwargs: Any) -> "QGPMLLM":
        """Same as ``QGPMLLM(model_name=model_id, **kwargs)`` (named like LangChain's ``from_model_id``)."""
        return cls(model_name=model_id, **kwargs)

    @classmethod
    def class_name(cls) -> str:
        return "QGPMLLM"

    @property
    def engine(self) -> QGPM:
        """The :class:`qgpm.QGPM` engine."""
        return self._engine

    @property
    def metadata(self) -> LLMMetadata:
        """What LlamaIndex packs prompts by: the window (``context_window``, never more than the model's
        window less :meth:`prompt_overhead`), the answer budget, the model's name."""
        window = self._engine.max_length
        room = max(window - self.prompt_overhead(), 1) if window else 0
        return LLMMetadata(
            context_window=min(self.context_window, room) if self.context_window and room else self.context_window or room,
            num_output=self.max_new_tokens,
            is_chat_model=self.is_chat_model,
            model_name=self.model_name or self._engine.name,
        )

    @property
    def last_result(self) -> Optional[QGPMResult]:
        """The :class:`qgpm.QGPMResult` of the latest finished call of this LLM (any thread)."""
        with self._lock:
            return self._last

    def prompt_overhead(self) -> int:
        """Tokens QGPM's own prompt takes around a call's context and question, first or refine
        step (instruction, ``system_prompt``, ``answer_prefix``, the chat template's markers).

        LlamaIndex measures the prompt it formats; QGPM answers with its own (:mod:`qgpm.prompt`),
        so :attr:`metadata` leaves this much of the model's window out of ``context_window``.
        """
        key = (self.instruction, self.refine_instruction, self.system_prompt, self.answer_prefix)
        if key not in self._overheads:
            tok = self._engine.tokenizer
            parts = {"system": self.system_prompt, "answer_prefix": self.answer_prefix}
            refine = self.refine_instruction.replace("{existing_answer}", "")
            self._overheads[key] = max(qgpm_prompt_overhead(tok, instruction=self.instruction, **parts), qgpm_prompt_overhead(tok, instruction=refine, **parts))
        return self._overheads[key]

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` under the model's tokenizer (special-token strings count as text, as QGPM sends them)."""
        return len(self.token_ids(text))

    def token_ids(self, text: str) -> list[int]:
        """Token ids of ``text`` under the model's tokenizer, as plain text (a tokenizer for LlamaIndex's helpers)."""
        return plain_ids(self._engine.tokenizer, text)

    # ------------------------------------------------------------------ one call
    def _prompt_call(self, prompt: str, formatted: bool, kwargs: dict[str, Any]) -> LLMCall:
        """The call for a completion prompt.

        An unformatted prompt goes through ``completion_to_prompt`` and gets
        ``system_prompt`` as its system message. A formatted one is taken as is, except that
        a leading ``system_prompt`` (LlamaIndex puts it before templated prompts) becomes the
        system message again.
        """
        check_no_query_wrapper(self.query_wrapper_prompt)  # a field LlamaIndex lets one set after construction
        system: Optional[str] = None
        if not formatted:
            prompt, system = self.completion_to_prompt(prompt), self.system_prompt
        elif self.system_prompt and prompt.startswith(self.system_prompt + "\n\n"):
            prompt, system = prompt[len(self.system_prompt) + 2 :], self.system_prompt
        parts = None if self.output_parser is not None else read_prompt(prompt)
        if parts is not None:
            return self._answer_call(parts, system, kwargs)
        decoding = decoding_args(self, kwargs)  # a call that fails here warns of nothing
        # LlamaIndex's own prompts that ask no question over nodes (a chat engine's query rewriting, ...) are plain by
        # nature: said apart, at INFO, so they do not use up the warning a custom QA template that is not read needs
        own = len(self._warned_plain) < 2 and self.output_parser is None and is_own_plain_prompt(prompt)  # matched while unsaid
        if len(self._warned_plain) < 2 and own not in self._warned_plain:
            self._warned_plain.add(own)
            if own:
                logger.info("QGPMLLM answers LlamaIndex's own prompts that ask no question over nodes (query rewriting, keyword "
                            "extraction, ...) as plain chat without QGPM (result.method == 'plain'). Logged once per LLM instance.")
            else:
                why = ("an output_parser is set" if self.output_parser is not None
                       else "the prompt is not one of LlamaIndex's QA / refine templates and has no 'Context:' block before a question")
                logger.warning("QGPMLLM answers a prompt as plain chat without QGPM (%s; result.method == 'plain'). To answer over "
                               "nodes with QGPM, use QGPMSynthesizer or the default templates. Logged once per LLM instance.", why)
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        return LLMCall(None, (messages,), decoding, self._join_trace(), {"step": "plain"})

    def _answer_call(self, parts: PromptParts, system: Optional[str], kwargs: dict[str, Any]) -> LLMCall:
        """The ``engine.answer`` call for ``parts``, with this LLM's method and prompt settings."""
        documents = list(parts.documents)
        details: dict[str, Any] = {"step": parts.step, "documents": len(documents), "prompt": parts.source}
        if parts.system_text is not None:  # the prompt's own text beside the template, the context and the question
            system = f"{system}\n\n{parts.system_text}" if system else parts.system_text
        kw: dict[str, Any] = dict(system=system, answer_prefix=self.answer_prefix)
        if parts.existing_answer is not None:
            kw["instruction"] = self.refine_instruction.replace("{existing_answer}", parts.existing_answer.strip())
        else:
            kw["instruction"] = self.instruction
        method = self.method
        spec = method_spec(method)
        if spec.reranker:
            kw["reranker"] = self.reranker
        if spec.takes_k:
            kw["k"] = self.k
        elif spec.options:
            kw["options"] = self.options
        elif spec.evidence:
            joined = "\n\n".join(documents)
            present = [e for e in self.evidence or [] if e.strip() and e.strip() in joined]
            details["evidence_found"] = bool(present)
            if present:
                kw["evidence"] = present
            else:
                logger.warning("qgpm: none of the oracle's evidence is in this call's context, so it answers with method='vanilla' "
                               "(standard positions); its result says method='vanilla'")
                method = "vanilla"
        if spec.stage is Stage.HEADS and self.relevance is not None:
            kw["config"] = self._engine.config.with_(relevance=self.relevance)
        kw["method"] = method
        return LLMCall(parts, (documents, parts.question), {**kw, **decoding_args(self, kwargs)}, self._join_trace(), details)

    @staticmethod
    def _join_trace() -> Optional[QGPMTrace]:
        """The trace of the synthesis this call belongs to (counted now, filled when the call finishes)."""
        trace = _tracing.current_trace()
        if trace is not None:
            trace.call_started()
        return trace

    def _finish(self, call: LLMCall, result: QGPMResult) -> QGPMResult:
        result.details["llama_index"] = dict(call.details)
        with self._lock:
            self._last = result
        if call.trace is not None:
            call.trace.add_result(result)
        return result

    def _run(self, call: LLMCall) -> QGPMResult:
        """Run ``call`` to the end."""
        run = self._engine.chat if call.parts is None else self._engine.answer
        return self._finish(call, run(*call.args, **call.kwargs))

    def _pieces(self, call: LLMCall) -> Iterator[tuple[str, Optional[QGPMResult]]]:
        """Start ``call`` streaming now; iterate ``(text piece, None)``, then ``("", result)`` once it ends.

        Closing the iterator early stops generation.
        """
        stream = (self._engine.stream_chat if call.parts is None else self._engine.stream)(*call.args, **call.kwargs)

        def pieces() -> Generator[tuple[str, Optional[QGPMResult]], None, None]:
            try:
                for piece in stream:
                    yield piece, None
            finally:
                stream.close()
            if stream.result is not None:
                yield "", self._finish(call, stream.result)

        return Cancellable(pieces(), stream.cancel)  # a cancelled async caller stops a call still waiting for the model

    # ------------------------------------------------------------------ CustomLLM
    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        """Answer ``prompt`` (see the module docs); keyword arguments: ``max_new_tokens`` /
        ``max_tokens``, ``temperature``, ``top_p``, ``stop``, ``seed`` (any other raises ``TypeError``)."""
        return completion(self._run(self._prompt_call(prompt, formatted, kwargs)))

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        """:meth:`complete`, streamed; the last response is an empty delta carrying usage and the result."""
        return completions(self._pieces(self._prompt_call(prompt, formatted, kwargs)))

    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        """:meth:`complete` with the model in worker threads (the call runs as a stream, the same
        answer): cancelling the awaiting task stops generation, as for :meth:`astream_complete`."""
        return completion(await self._arun(self._prompt_call(prompt, formatted, kwargs)))

    async def _arun(self, call: LLMCall) -> QGPMResult:
        """Run ``call`` to the end in worker threads, as a stream (cancelling the awaiting task stops it)."""
        result: Optional[QGPMResult] = None
        async with aclosing(iterate_in_thread(await asyncio.to_thread(self._pieces, call))) as pieces:
            async for _piece, finished in pieces:
                result = finished or result
        if result is None:  # the stream ended without its result: it was closed from outside
            raise RuntimeError("QGPMLLM: the call's stream ended without a result")
        return result

    # --------------------------------------------- QGPMSynthesizer's calls: spans and completion events of this LLM (``prompt``: shown)
    @dispatcher.span
    @llm_completion_callback()
    def _complete_nodes(self, prompt: str, call: LLMCall) -> CompletionResponse:
        return completion(self._run(call))

    @dispatcher.span
    @llm_completion_callback()
    def _stream_nodes(self, prompt: str, pieces: Iterator[tuple[str, Optional[QGPMResult]]]) -> CompletionResponseGen:
        return completions(pieces)

    @dispatcher.span
    @llm_completion_callback()
    async def _acomplete_nodes(self, prompt: str, call: LLMCall) -> CompletionResponse:
        return completion(await self._arun(call))

    @dispatcher.span
    @llm_completion_callback()
    async def _astream_nodes(self, prompt: str, pieces: Any) -> CompletionResponseAsyncGen:
        return acompletions(pieces)

    @llm_completion_callback()
    async def astream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseAsyncGen:
        """:meth:`stream_complete` with the model in worker threads."""
        call = self._prompt_call(prompt, formatted, kwargs)
        return acompletions(iterate_in_thread(await asyncio.to_thread(self._pieces, call)))

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        """:meth:`chat` through :meth:`acomplete` (CustomLLM's own ran the model in the event loop's thread)."""
        return completion_response_to_chat_response(await self.acomplete(self.messages_to_prompt(messages), formatted=True, **kwargs))

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        """:meth:`stream_chat` through :meth:`astream_complete` (the model in worker threads)."""
        return astream_completion_response_to_chat_response(await self.astream_complete(self.messages_to_prompt(messages), formatted=True, **kwargs))
