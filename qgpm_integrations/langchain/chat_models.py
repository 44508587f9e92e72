"""``QGPMChatModel``: a LangChain chat model that answers with QGPM over a local model.

How the context reaches QGPM (:func:`qgpm.chat_prompt.read_chat` reads it out of the
messages and :class:`qgpm.conversation.ChatRequest` runs it; this adapter converts LangChain
messages to qgpm's role / content dicts, maps its fields to engine arguments and wraps the
results and streams into LangChain messages):

1. **Keyword arguments** -- ``llm.invoke(messages, context=docs, question=...)`` or
   ``llm.bind(context=docs)``: ``context`` is a string, a ``Document`` or a list of
   strings / ``Document`` objects; ``question`` defaults to the text of the last human
   message.
2. **Marked prompt** -- text content blocks with an extra key ``"qgpm_role"``:
   ``"context"`` (one block per document) and ``"question"``
   (:func:`~qgpm_integrations.langchain.qgpm_prompt` builds them).
3. **The prompts chains already use, unchanged** -- the context in a system message and
   the question in the last human message (``create_stuff_documents_chain``,
   ``create_retrieval_chain``); one human message with the context and then a labelled
   question (``"... {context} Question: {question}"``); the context in one human message
   and the question in a later one; chat history before the question.

``response_metadata["qgpm"]["prompt"]`` says what was taken as context and question:
the shape, the message indices and character spans, the document count and a preview.
Without any of these the model is an ordinary local chat model (standard RoPE over the
model's chat template) and says so: ``response_metadata["qgpm"]["mode"] == "plain"``
with the reason, and the first such call of a model instance logs a warning (logger
``qgpm``).

An *empty* context (``context=[]``, ``context=""``, a prompt whose context block is
empty, e.g. a retriever that found nothing) is never answered from nothing: by default
the reply is :data:`NO_CONTEXT_REPLY` without running the model
(``response_metadata["qgpm"]["mode"] == "empty_context"``); with
``on_empty_context="raise"`` the call raises :class:`qgpm.EmptyContextError` (the policy of
:mod:`qgpm.conversation`).

With context, ``response_metadata["qgpm"]`` (:meth:`qgpm.conversation.ChatRequest.report`)
holds ``mode == "context"``, the method, the top sentences of the relevance ranking with
their scores, and timings.
"""

from __future__ import annotations

import asyncio
import logging
import numbers
from contextlib import aclosing
from typing import Any, AsyncIterator, Iterator, Literal

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LangSmithParams
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from pydantic import ConfigDict, Field, PrivateAttr, StrictBool, field_validator, model_validator

from qgpm.conversation import NO_CONTEXT_REPLY, ChatRequest, check_empty_context_policy
from qgpm.defaults import DEFAULT_K, DEFAULT_METHOD, DEFAULT_MODEL_NAME, DEFAULT_RERANKER, METHODS, is_default_model
from qgpm.methods import method_spec
from qgpm.serving import VLLMServer

from .._common import (
    Cancellable,
    clear_engine_cache,
    device_map_for,
    heads_key,
    is_loaded_model,
    iterate_in_thread,
    kwargs_key,
    model_key,
    shared_engine,
)
from .call_args import (TOOLS_REFUSED, answer_args, plain_args, build_request, check_call_kwargs, check_generator, check_report_args, decoding_args, response_metadata,
                        unused_in_plain_chat, with_engine)
from .model_args import REMOTE_ONLY, budget_alias, check_model_fields, drop_remote_only, identifying_params, name_unknown_fields, tracing_params

__all__ = ["QGPMChatModel", "QGPM_METHODS", "clear_engine_cache", "NO_CONTEXT_REPLY"]

logger = logging.getLogger("qgpm")

UNMARKED_WARNING = (
    "QGPMChatModel found no context in the prompt (no context= argument, no qgpm_role marking, and no context block "
    "after a 'Context:' label, a <context> tag or an instruction that mentions the context), so it answers as a plain "
    "chat model without QGPM (response_metadata['qgpm']['mode'] == 'plain'). To answer over documents with QGPM, "
    "put the documents after such a marker, build the prompt with qgpm_prompt(), or pass context=docs (and "
    "question=...) to invoke() or bind(). Logged once per model instance."
)

QGPM_METHODS: tuple[str, ...] = METHODS
"""The methods a call may use (``qgpm.defaults.METHODS``)."""

# --------------------------------------------------------------------------- engine cache (shared: qgpm_integrations._common)

_heads_key, _kwargs_key, _model_key, _get_engine = heads_key, kwargs_key, model_key, shared_engine


# --------------------------------------------------------------------------- the chat model


class QGPMChatModel(BaseChatModel):
    """A local chat model that answers over long contexts with QGPM.

    Model settings follow ``langchain-huggingface`` (``HuggingFacePipeline`` /
    ``ChatHuggingFace``) and ``langchain-ollama``:

    * ``model`` (alias ``model_id``): an HF id, a local folder or a ``.gguf`` file
      (default: the embedded SmolLM2-135M-Instruct), loaded lazily on the first call and
      cached per process; or an already-loaded transformers causal LM together with
      ``tokenizer=``;
    * ``model_kwargs``: ``AutoModelForCausalLM.from_pretrained`` arguments --
      ``device_map``, ``dtype`` (or ``torch_dtype``), ``quantization_config``,
      ``attn_implementation``, ``gguf_file``, ...;
    * ``generate_kwargs``: further ``model.generate`` arguments (``repetition_penalty``,
      ``top_k``, ``num_beams``, ...; the settings with a field of their own, such as
      ``temperature``, go in that field);
    * ``heads``: ``None`` (the head set stored for the model), ``"calibrate"``, a
      head-set JSON path or ``[(layer, head), ...]``;
    * :meth:`from_model_id` loads at once, like ``HuggingFacePipeline.from_model_id``;
    * ``engine=QGPM(...)`` shares one loaded engine between chat models.

    Context and question reach QGPM through a marked prompt (:func:`qgpm_prompt`) or
    ``context=`` / ``question=`` call keyword arguments (``invoke(..., context=docs)``,
    ``bind(context=docs)``). Other per-call keywords: ``method``, ``evidence`` (oracle),
    ``reranker`` / ``k`` (topk, reorder), ``options`` (the baselines string, ms-poe,
    self-extend, llmlingua-2: ``qgpm.StringOptions`` etc.), ``system``, ``instruction``,
    ``answer_prefix``, ``qgpm_config``, ``max_tokens`` (or ``max_new_tokens`` / ``num_predict``), ``temperature``, ``top_p``,
    ``seed``, ``explain_k``, ``explain_html``, ``model``, ``timeout``, ``on_empty_context``. Without
    any context marking it is a plain chat model (and logs a warning once per
    instance). An empty context gets :data:`NO_CONTEXT_REPLY` (``on_empty_context=
    "reply"``, the default) or raises :class:`qgpm.EmptyContextError` (``"raise"``).
    Unknown constructor or call arguments raise.

    Example:
        >>> llm = QGPMChatModel.from_model_id("Qwen/Qwen2.5-7B-Instruct",
        ...     model_kwargs={"device_map": "cuda", "dtype": "bfloat16"}, heads="calibrate")
        >>> chain = ({"context": retriever | format_documents, "question": RunnablePassthrough()}
        ...          | qgpm_prompt() | llm | StrOutputParser())
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True, arbitrary_types_allowed=True, protected_namespaces=())

    model: Any = Field(
        default=None, alias="model_id",
        description="HF id, local folder or .gguf path (None = embedded SmolLM2-135M-Instruct), or an already-loaded "
        "transformers causal LM (then pass tokenizer= too).",
    )
    tokenizer: Any = Field(default=None, exclude=True, repr=False, description="The fast tokenizer of an already-loaded model.")
    model_kwargs: dict[str, Any] | None = Field(
        default=None,
        description="AutoModelForCausalLM.from_pretrained arguments: device_map, dtype / torch_dtype, quantization_config, "
        "attn_implementation, gguf_file, ...",
    )
    generate_kwargs: dict[str, Any] | None = Field(default=None, description="Further model.generate arguments (repetition_penalty, top_k, ...).")
    engine: Any = Field(default=None, exclude=True, repr=False, description="An existing qgpm.QGPM engine to use instead of loading `model`.")
    method: str = Field(default=DEFAULT_METHOD, description=f"One of {', '.join(METHODS)}.")
    heads: Any = Field(default=None, description="Head set for pass 1: None = the stored set, 'calibrate', a head-set JSON path or [(layer, head), ...].")
    qgpm_config: Any = Field(default=None, description="A qgpm.QGPMConfig overriding the engine's settings.")
    options: Any = Field(default=None, description="Settings of the baseline given as method (qgpm.StringOptions / MsPoEOptions / "
                         "SelfExtendOptions / LLMLingua2Options); None = that method's defaults.")
    max_tokens: int = Field(default=64, ge=1, alias="max_new_tokens")
    temperature: float = Field(default=0.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stop: list[str] | None = Field(default=None, alias="stop_sequences")
    seed: int | None = None
    timeout: float | None = Field(default=None, gt=0, description="Seconds after which generation stops (transformers max_time).")
    system: str | None = Field(default=None, description="System prompt used when the messages carry none (context mode and plain chat).")
    instruction: str | None = Field(default=None, description="Instruction before the context (None = qgpm's default).")
    answer_prefix: str | None = None
    reranker: Any = Field(default=DEFAULT_RERANKER, description="Reranker spec or instance for method topk/reorder (given with "
                          "another method: ValueError).")
    k: int = Field(default=DEFAULT_K, ge=1, description="Chunks kept by method='topk' (given with another method: ValueError).")
    relevance: str | None = Field(
        default=None,
        description="Where sentence relevance comes from in method='qgpm' calls ('heads', a reranker spec such as "
        "'minilm' or 'bm25', or 'heads+<reranker>'; qgpm.QGPMConfig.relevance); None = the engine's setting. Needs "
        "method='qgpm' on the model; a call that passes another method= does not rank sentences and uses none.",
    )
    vllm_url: str | None = Field(
        default=None,
        description="Run pass 2 and decoding on a vLLM server at this address (qgpm.serving.VLLMServer, e.g. "
        "'http://127.0.0.1:8000'); pass 1 stays in this process. Methods whose plan needs per-plane positions are refused.",
    )
    vllm_model: str | None = Field(default=None, description="The served model's name on the vllm_url server (default: the only one).")
    explain_k: int = Field(default=5, ge=0, description="Top sentences reported in response_metadata['qgpm'].")
    explain_html: StrictBool = Field(
        default=False,
        description="Also put the explanation page (QGPMResult.to_html(): the context shaded by relevance, the question "
        "and the answer; self-contained, all text escaped) and every sentence's row (qgpm.explain.sentence_rows: "
        "rank, z, broad/sharp, depth, promoted, term_dropped) in response_metadata['qgpm']['html'] / ['sentences'].",
    )
    streaming: StrictBool = False
    on_empty_context: Literal["reply", "raise"] = Field(
        default="reply",
        description="Empty context (nothing retrieved): 'reply' with NO_CONTEXT_REPLY without running the model, or 'raise' qgpm.EmptyContextError.",
    )

    _engine: Any = PrivateAttr(default=None)
    _load_kwargs: dict = PrivateAttr(default_factory=dict)
    _warned_unmarked: bool = PrivateAttr(default=False)

    @model_validator(mode="before")
    @classmethod
    def _drop_remote_only(cls, values: Any) -> Any:
        known = set(cls.model_fields) | {f.alias for f in cls.model_fields.values() if f.alias} | {"num_predict", *REMOTE_ONLY}
        return budget_alias(drop_remote_only(name_unknown_fields(values, known)))  # api_key / max_retries: accepted, not used, named when set

    @field_validator("method")
    @classmethod
    def _check_method(cls, v: str) -> str:
        return method_spec(v).name

    @field_validator("max_tokens", "temperature", "top_p", "seed", "k", "explain_k", "timeout", mode="before")
    @classmethod
    def _a_number(cls, v: Any, info: Any) -> Any:
        # nothing coerced, as in a call: pydantic would read True as 1 (temperature=True: sampling
        # at 1.0), "0.5" as 0.5 and 2.0 as the int 2
        ints = info.field_name in ("max_tokens", "seed", "k", "explain_k")
        if v is None or (isinstance(v, numbers.Integral if ints else numbers.Real) and not isinstance(v, bool)):
            return v
        raise TypeError(f"QGPMChatModel: {info.field_name} must be {'an int' if ints else 'a number'}, got {type(v).__name__} {v!r}")

    @model_validator(mode="after")
    def _check(self) -> "QGPMChatModel":
        self._load_kwargs = check_model_fields(self)
        return self

    @classmethod
    def from_model_id(
        cls,
        model_id: str,
        *,
        device: int | str | None = None,
        device_map: Any = None,
        model_kwargs: dict[str, Any] | None = None,
        generate_kwargs: dict[str, Any] | None = None,
        heads: Any = None,
        **kwargs: Any,
    ) -> "QGPMChatModel":
        """Load ``model_id`` now and return a chat model over it (like ``HuggingFacePipeline.from_model_id``).

        ``device``: a CUDA index (``-1`` = CPU) or ``"cpu"`` / ``"cuda"`` / ``"cuda:N"`` /
        ``"auto"``; ``device_map``: any transformers device map (give one of the two, or put
        ``device_map`` in ``model_kwargs``). Other keyword arguments are fields of this class.
        """
        mk = dict(model_kwargs or {})
        if device is not None and device_map is not None:
            raise ValueError("pass device or device_map, not both")
        dm = device_map_for(device) if device is not None else device_map
        if dm is not None:
            if "device_map" in mk and mk["device_map"] != dm:
                raise ValueError(f"device_map given twice: {dm!r} and model_kwargs['device_map']={mk['device_map']!r}")
            mk["device_map"] = dm
        llm = cls(model=model_id, model_kwargs=mk or None, generate_kwargs=generate_kwargs, heads=heads, **kwargs)
        llm.get_engine()
        return llm

    # ------------------------------------------------------------------ identity
    @property
    def _llm_type(self) -> str:
        return "qgpm-chat"

    @property
    def model_name(self) -> str:
        """Name of the model (without loading it)."""
        if self.engine is not None:
            return str(self.engine.name)
        if self._engine is not None:
            return str(self._engine.name)
        if is_loaded_model(self.model):
            return str(getattr(self.model.config, "_name_or_path", "") or type(self.model).__name__)
        if is_default_model(self.model):
            return DEFAULT_MODEL_NAME
        return str(self.model)

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return identifying_params(self)  # LangChain's cache keys on these

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        return tracing_params(self, stop, kwargs)

    # ------------------------------------------------------------------ engine
    def get_engine(self, model: str | None = None) -> Any:
        """The ``qgpm.QGPM`` engine (loaded on first use, shared per process).

        ``model``: another model id for this call (the per-call ``model=`` override), loaded
        with this instance's ``model_kwargs`` (device, dtype, ...) and that model's stored head
        set; ``heads=`` and ``vllm_url=`` belong to this instance's own model and do not carry over.
        """
        if model is not None and _model_key(model) != self._own_model_key():
            return _get_engine(model, None, self._load_kwargs)
        if self.engine is not None:
            return self.engine
        if self._engine is None:
            if is_loaded_model(self.model):
                from qgpm import QGPM

                self._engine = QGPM(self.model, self.tokenizer, heads=self.heads, generator=self._generator())
            else:
                self._engine = _get_engine(self.model, self.heads, self._load_kwargs, self.vllm_url, self.vllm_model)
        return self._engine

    def _generator(self) -> Any:
        """The vLLM generator of ``vllm_url`` (``None``: generation in this process)."""
        if self.vllm_url is None:
            return None
        return VLLMServer(self.vllm_url, model=self.vllm_model)

    def _own_model_key(self) -> str | None:
        if self.engine is not None:
            return _model_key(self.engine.name)
        if is_loaded_model(self.model):
            return None
        return _model_key(self.model)

    def _tokenizer(self) -> Any:
        """The model's tokenizer, without loading the weights when no engine is loaded yet."""
        if self.engine is not None:
            return self.engine.tokenizer
        if self._engine is not None:
            return self._engine.tokenizer
        from qgpm.loading import load_tokenizer, resolve_source

        if is_loaded_model(self.model):
            return self.tokenizer
        return load_tokenizer(resolve_source(None if is_default_model(self.model) else self.model))

    def get_token_ids(self, text: str) -> list[int]:
        """Token ids of ``text`` under the model's own tokenizer (as plain text, as QGPM sends it).

        ``custom_get_token_ids`` still takes precedence; LangChain's GPT-2 fallback is never used.
        """
        if self.custom_get_token_ids is not None:
            return self.custom_get_token_ids(text)
        from qgpm.tokens import encode_plain

        return encode_plain(self._tokenizer(), text)

    # ------------------------------------------------------------------ call plumbing
    def _plan(self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]) -> tuple[Any, ChatRequest, dict[str, Any], dict[str, Any]]:
        """(engine, request, decoding arguments, answer arguments) of one call (:mod:`.call_args`)."""
        check_call_kwargs(kwargs)
        check_report_args(kwargs)
        policy = check_empty_context_policy(kwargs.get("on_empty_context", self.on_empty_context))
        request = ChatRequest(build_request(messages, kwargs), on_empty_context=policy)
        if not request.needs_engine:
            return None, request, {}, {}
        gen = decoding_args(self, stop, kwargs)  # every value is checked before any model loads
        call = answer_args(self, request, kwargs) if request.mode == "context" else plain_args(self, kwargs)
        unused = unused_in_plain_chat(self, request, kwargs) if request.mode == "plain" else []
        engine = self.get_engine(kwargs.get("model"))  # a model that fails to load fails before any warning
        check_generator(engine, gen)
        if request.mode == "plain" and not self._warned_unmarked:  # after the checks: a refused call warns of nothing
            self._warned_unmarked = True
            logger.warning(UNMARKED_WARNING)
        if unused:
            logger.warning("QGPMChatModel: this call found no context and answers as plain chat, so its %s (settings of an "
                           "answer over a context) are not used. Pass context=docs or mark the context in the prompt for them "
                           "to apply.", ", ".join(f"{n}=" for n in unused))
        return engine, request, gen, with_engine(engine, call) if request.mode == "context" else call

    # ------------------------------------------------------------------ generation
    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        engine, request, gen, call = self._plan(messages, stop, kwargs)
        result = request.run(engine, call, **gen)
        meta, usage = response_metadata(self, engine, request, result, kwargs)
        message = AIMessage(content=result.text, response_metadata=meta, usage_metadata=usage)
        return ChatResult(generations=[ChatGeneration(message=message, generation_info={"finish_reason": result.finish_reason})])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        # LangChain's stream() reports every chunk to run_manager (on_llm_new_token) itself.
        return self._chunks(*self._start(messages, stop, kwargs), kwargs)

    def _start(self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]) -> tuple[Any, Any, Any]:
        engine, request, gen, call = self._plan(messages, stop, kwargs)
        return engine, request, request.stream(engine, call, **gen)

    def _chunks(self, engine: Any, request: Any, stream: Any, kwargs: dict[str, Any]) -> Iterator[ChatGenerationChunk]:
        try:
            for piece in stream:
                if piece:
                    yield ChatGenerationChunk(message=AIMessageChunk(content=piece))
        finally:
            stream.close()
        result = stream.result
        if result is None:  # cancelled from outside (an async caller gone): nothing to report
            return
        meta, usage = response_metadata(self, engine, request, result, kwargs)
        yield ChatGenerationChunk(
            message=AIMessageChunk(content="", response_metadata=meta, usage_metadata=usage, chunk_position="last"),
            generation_info={"finish_reason": result.finish_reason},
        )

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        """Refused: this chat model answers from text and makes no tool calls."""
        raise NotImplementedError(TOOLS_REFUSED)

    def with_structured_output(self, schema: Any, **kwargs: Any) -> Any:
        """Refused: structured output needs tool calling or a JSON mode, and this chat model has neither."""
        raise NotImplementedError(
            "QGPMChatModel has no with_structured_output: it needs tool calling or a JSON mode, and this model answers "
            "in text. Ask for the format in the prompt and parse the answer with an output parser "
            "(langchain_core.output_parsers.PydanticOutputParser or JsonOutputParser) at the end of the chain")

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        # BaseChatModel's own runs _generate in an executor thread that a cancelled task never
        # reaches; as a stream stepped from worker threads, cancelling ainvoke stops generation.
        text, last = "", None
        async for chunk in self._astream(messages, stop, run_manager, **kwargs):
            text += chunk.message.content
            last = chunk
        message = AIMessage(content=text, response_metadata=last.message.response_metadata, usage_metadata=last.message.usage_metadata)
        return ChatResult(generations=[ChatGeneration(message=message, generation_info=last.generation_info)])

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        # BaseChatModel's _astream also steps _stream in worker threads, but leaves it running when
        # the consumer stops early; this one closes it, which stops generation and joins its thread.
        engine, request, stream = await asyncio.to_thread(self._start, messages, stop, kwargs)
        # with the stream's cancel, a cancelled task stops a call still waiting for the model at once
        async with aclosing(iterate_in_thread(Cancellable(self._chunks(engine, request, stream, kwargs), stream.cancel))) as chunks:
            async for chunk in chunks:
                yield chunk
