"""``QGPMLLM``: a LlamaIndex LLM that answers retrieved context with QGPM.

    from llama_index.core import Settings, VectorStoreIndex
    from qgpm_integrations.llama_index import QGPMLLM

    llm = QGPMLLM()                                   # embedded SmolLM2-135M-Instruct
    engine = index.as_query_engine(llm=llm)           # or Settings.llm = llm
    response = engine.query("Who is the reading room named after?")
    print(response, response.metadata["qgpm"].explain(3))

How context and question are found
----------------------------------
LlamaIndex's response synthesizers do not send a finished prompt string: they call
``llm.predict(template, context_str=...)`` (and ``stream`` / ``apredict`` / ``astream``)
with the question already bound in the template (``template.partial_format(query_str=...)``,
visible in ``template.kwargs``). ``QGPMLLM`` overrides those four methods, merges the
template's bound variables with the call's arguments and takes

* the **context** from ``context_str`` (first step of compact / refine, tree_summarize,
  simple_summarize) or ``context_msg`` (refine steps), split back into the retrieved node
  texts where they can be found verbatim (see :func:`._tracing.split_context`);
* the **question** from ``query_str``;
* on refine steps, ``existing_answer`` goes into the instruction
  (:attr:`QGPMLLM.refine_instruction`), so QGPM ranks the new chunk against the
  original question while the model sees the earlier answer.

It then calls ``engine.answer(context, question, method=...)`` with QGPM's own prompt
(instruction, context, question -- question last, where QGPM reads relevance from); the
LlamaIndex template text itself is not sent to the model. Calls whose template has no
context or no question (``complete``, ``chat``, prompts of other components, or templates
with an output parser) fall back to ordinary generation through the model's chat
template (``engine.chat`` / ``engine.stream_chat``, ``result.method == "plain"``).

Where the explanation goes
--------------------------
Every finished call's :class:`qgpm.QGPMResult` is

* in ``response.metadata["qgpm"]`` (a :class:`QGPMTrace`, one result per LLM call) for
  responses made by a query engine / response synthesizer (streaming: filled in once the
  stream is consumed);
* in ``CompletionResponse.raw["result"]`` for direct ``complete`` calls (with
  ``raw["usage"]`` for LlamaIndex's token counters);
* in ``llm.last_result`` (the latest call of this LLM object, any thread).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from typing import Any, AsyncGenerator, Generator, Optional, Sequence

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
)
from llama_index.core.bridge.pydantic import ConfigDict, Field, PrivateAttr
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.events.llm import LLMPredictEndEvent, LLMPredictStartEvent
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.llm import LLM, astream_completion_response_to_tokens, stream_completion_response_to_tokens
from llama_index.core.prompts import BasePromptTemplate
from llama_index.core.prompts.base import SelectorPromptTemplate
from llama_index.core.types import TokenAsyncGen, TokenGen

from qgpm import QGPM, QGPMResult
from qgpm.baselines import resolve_options
from qgpm.methods import Stage, method_spec
from qgpm.serving import VLLMServer
from qgpm.sources import parse_source
from qgpm.tokens import encode_plain
from qgpm.defaults import DEFAULT_K, DEFAULT_METHOD, DEFAULT_RERANKER, METHODS

from .._common import check_generate_kwargs, check_heads, check_model_args, is_loaded_model

from . import _tracing
from ._tracing import QGPMTrace, split_context

logger = logging.getLogger("qgpm")

__all__ = ["QGPMLLM", "DEFAULT_REFINE_INSTRUCTION", "set_tokenizer"]

dispatcher = get_dispatcher(__name__)

DEFAULT_REFINE_INSTRUCTION = (
    "Answer the question using the text below. An earlier answer, found in other parts of "
    "the text, was: {existing_answer}\nKeep the earlier answer unless the text below gives a better one."
)
"""Instruction of a refine step; ``{existing_answer}`` is replaced by the answer so far."""

_ROLE_MAP = {
    MessageRole.SYSTEM: "system",
    MessageRole.DEVELOPER: "system",
    MessageRole.USER: "user",
    MessageRole.ASSISTANT: "assistant",
    MessageRole.CHATBOT: "assistant",
    MessageRole.MODEL: "assistant",
}

_CALL_KEYS = ("max_new_tokens", "temperature", "top_p", "stop", "seed")

# generate arguments that have a field of their own on QGPMLLM
_GENERATE_FIELDS = {"max_new_tokens": "max_new_tokens", "max_tokens": "max_new_tokens", "temperature": "temperature",
                    "top_p": "top_p", "seed": "seed", "stop": "stop"}


def _plain_ids(tok: Any, text: str) -> list[int]:
    """Token ids of ``text`` as plain text, as QGPM tokenizes retrieved text (special-token strings are text)."""
    if hasattr(tok, "backend_tokenizer"):
        return encode_plain(tok, text)
    return tok(text, add_special_tokens=False, verbose=False)["input_ids"]  # a non-HF tokenizer (test stand-ins)


def _template_values(tmpl: BasePromptTemplate, prompt_args: dict[str, Any]) -> dict[str, Any]:
    """The variables ``tmpl.format(**prompt_args)`` fills in, read from the template's public fields.

    The same steps as LlamaIndex's own formatting: the bound ``kwargs`` merged with the
    call's arguments, then ``function_mappings`` computed from them (a computed value wins
    over a fixed one), then ``template_var_mappings`` renaming variables to the names the
    template text uses.
    """
    args = {**tmpl.kwargs, **prompt_args}
    values = {name: fn(**args) for name, fn in (tmpl.function_mappings or {}).items()}
    values.update((name, v) for name, v in args.items() if name not in values)
    renames = tmpl.template_var_mappings or {}
    return {renames.get(name, name): v for name, v in values.items()}


def set_tokenizer(engine: QGPM, *, force: bool = False) -> bool:
    """Make LlamaIndex count tokens with ``engine``'s own tokenizer.

    Sets the global tokenizer behind ``Settings.tokenizer`` (used by text splitters and the
    prompt helper that packs chunks into the window), so no tiktoken encoding is ever
    loaded or downloaded. Without ``force`` an already chosen tokenizer is kept. Returns
    whether it was set.
    """
    import llama_index.core
    from llama_index.core import Settings

    if llama_index.core.global_tokenizer is not None and not force:
        return False
    tok = engine.tokenizer

    def encode(text: str) -> list[int]:
        return _plain_ids(tok, text)

    Settings.tokenizer = encode
    return True


class QGPMLLM(LLM):
    """LlamaIndex LLM over a :class:`qgpm.QGPM` engine.

    Model settings follow LlamaIndex's ``HuggingFaceLLM``: ``model_name`` (an HF id, a
    folder or a ``.gguf`` file; default the embedded SmolLM2-135M-Instruct) with
    ``model_kwargs`` / ``device_map`` for loading, or an already-loaded ``model`` and
    ``tokenizer``, or a shared ``engine``. The model loads when the LLM is built.

    Args:
        engine: A loaded engine to share (several ``QGPMLLM`` with different ``method``
            can share one).
        model_name: HF id, folder or ``.gguf`` path to load (``None`` = the embedded
            SmolLM2-135M-Instruct; weights are cached per process).
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
        context_window: Window reported to LlamaIndex (default: the model's own window;
            larger values are rejected).
        is_chat_model: What ``metadata.is_chat_model`` reports (LlamaIndex then sends
            chat messages instead of text prompts on fallback calls). Both paths format
            prompts with the model's chat template; QGPM's own context path is the same.
        method: ``qgpm`` | ``vanilla`` | ``oracle`` | ``topk`` | ``reorder`` | ``string`` |
            ``ms-poe`` | ``self-extend`` | ``llmlingua-2``.
        options: Settings of a baseline method (``qgpm.StringOptions``, ``MsPoEOptions``,
            ``SelfExtendOptions``, ``LLMLingua2Options``); ``None`` = the method's defaults.
        max_new_tokens: Answer budget (also ``metadata.num_output``).
        temperature, top_p, seed, stop: Decoding (greedy when ``temperature == 0``).
        instruction: Instruction of first-step prompts (``None`` = QGPM's default).
        refine_instruction: Instruction of refine steps, with ``{existing_answer}``.
        answer_prefix: Text that starts the answer (after the assistant header).
        reranker, k: For ``topk`` / ``reorder`` (a :func:`qgpm.rerank.get_reranker` spec).
        evidence: For ``oracle``: exact substrings of the context to treat as evidence
            (those absent from a call's context are ignored; with none present that call
            runs ``vanilla``, with a warning).
        vllm_url: Run pass 2 and decoding on a vLLM server at this address
            (:class:`qgpm.serving.VLLMServer`); pass 1 stays in this process. Methods whose
            plan needs per-plane positions are refused. ``vllm_model``: the served model's
            name (default: the only one).
        context_keys, question_keys: Template variables read as context / question.
        set_global_tokenizer: Count tokens with the model's tokenizer in LlamaIndex
            (see :func:`set_tokenizer`; an already chosen tokenizer is kept).

    Unknown arguments raise ``TypeError`` before anything is loaded.
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True, protected_namespaces=())

    model_name: Optional[str] = Field(default=None, description="HF id, folder or .gguf path the model was loaded from.")
    model_kwargs: dict[str, Any] = Field(default_factory=dict, description="AutoModelForCausalLM.from_pretrained arguments.")
    generate_kwargs: dict[str, Any] = Field(default_factory=dict, description="Further model.generate arguments.")
    context_window: Optional[int] = Field(default=None, gt=0, description="Window reported to LlamaIndex (default: the model's).")
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
    context_keys: tuple[str, ...] = Field(default=("context_str", "context_msg"))
    question_keys: tuple[str, ...] = Field(default=("query_str",))

    _engine: QGPM = PrivateAttr()
    _lock: Any = PrivateAttr(default=None)
    _last: Optional[QGPMResult] = PrivateAttr(default=None)

    def __init__(
        self,
        engine: QGPM | None = None,
        *,
        model: Any = None,
        tokenizer: Any = None,
        heads: Any = None,
        device_map: Any = None,
        set_global_tokenizer: bool = True,
        **kwargs: Any,
    ) -> None:
        owner = "QGPMLLM"
        unknown = sorted(set(kwargs) - set(type(self).model_fields))
        if unknown:
            allowed = sorted(set(type(self).model_fields) | {"engine", "model", "tokenizer", "heads", "device_map", "set_global_tokenizer"})
            raise TypeError(f"{owner} got unexpected arguments {unknown}; allowed: {', '.join(allowed)}")
        method = kwargs.get("method", DEFAULT_METHOD)
        spec = method_spec(method)
        if spec.evidence and not kwargs.get("evidence"):
            raise ValueError(f"method={method!r} needs evidence=[exact substrings of the context]")
        resolve_options(method, kwargs.get("options"))  # options of another method, or for a method without any, fail here
        if kwargs.get("relevance") is not None:
            parse_source(kwargs["relevance"])
            if spec.stage is not Stage.HEADS:
                raise ValueError(f"relevance={kwargs['relevance']!r} sets how method='qgpm' ranks sentences; method={method!r} takes none")
        if isinstance(model, (str, os.PathLike)):
            if kwargs.get("model_name") is not None:
                raise ValueError("pass the model id as model_name= (or model=), not both")
            kwargs["model_name"] = str(model)
            model = None
        model_kwargs = dict(kwargs.get("model_kwargs") or {})
        if device_map is not None:
            if "device_map" in model_kwargs and model_kwargs["device_map"] != device_map:
                raise ValueError(f"device_map given twice: {device_map!r} and model_kwargs['device_map']={model_kwargs['device_map']!r}")
            model_kwargs["device_map"] = device_map
        kwargs["model_kwargs"] = model_kwargs
        check_generate_kwargs(kwargs.get("generate_kwargs"), owner, _GENERATE_FIELDS)
        if engine is not None:
            given = [n for n, v in (("model", model), ("model_name", kwargs.get("model_name")), ("tokenizer", tokenizer),
                                    ("heads", heads), ("model_kwargs", model_kwargs or None), ("vllm_url", kwargs.get("vllm_url")))
                     if v is not None]
            if given:
                raise ValueError(f"pass either engine= or {'/'.join(given)}=, not both (the engine is already loaded)")
            load_kwargs = {}
        else:
            load_kwargs = check_model_args(owner, model, tokenizer, model_kwargs)
            check_heads(heads, owner)
        if kwargs.get("vllm_model") is not None and kwargs.get("vllm_url") is None:
            raise ValueError("vllm_model= names the model on the vllm_url= server: pass vllm_url= too")
        generator = VLLMServer(kwargs["vllm_url"], model=kwargs.get("vllm_model")) if kwargs.get("vllm_url") is not None else None
        super().__init__(**kwargs)
        if engine is None:
            if is_loaded_model(model):
                engine = QGPM(model, tokenizer, heads=heads, generator=generator)
            else:
                engine = QGPM.from_pretrained(self.model_name, heads=heads, generator=generator, **load_kwargs)
        window = engine.max_length
        if self.context_window is not None and window and self.context_window > window:
            raise ValueError(f"context_window={self.context_window} is larger than the model window ({window} tokens)")
        if spec.stage is Stage.HEADS:
            engine.heads  # raise HeadSetMissingError now rather than at the first query
        self._engine = engine
        self._lock = threading.Lock()
        _tracing.install()
        if set_global_tokenizer:
            set_tokenizer(engine)

    @classmethod
    def from_model_id(cls, model_id: str, **kwargs: Any) -> "QGPMLLM":
        """Same as ``QGPMLLM(model_name=model_id, **kwargs)`` (named like LangChain's ``from_model_id``)."""
        return cls(model_name=model_id, **kwargs)

    # ------------------------------------------------------------------ basics
    @classmethod
    def class_name(cls) -> str:
        return "QGPMLLM"

    @property
    def engine(self) -> QGPM:
        """The shared :class:`qgpm.QGPM` engine."""
        return self._engine

    @property
    def metadata(self) -> LLMMetadata:
        """What LlamaIndex packs prompts by: the model's window, the answer budget, the model's name."""
        return LLMMetadata(
            context_window=self.context_window or self._engine.max_length,
            num_output=self.max_new_tokens,
            is_chat_model=self.is_chat_model,
            model_name=self.model_name or self._engine.name,
        )

    @property
    def last_result(self) -> Optional[QGPMResult]:
        """The :class:`qgpm.QGPMResult` of the latest finished call of this LLM (any thread)."""
        with self._lock:
            return self._last

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` under the model's tokenizer (special-token strings count as text, as QGPM sends them)."""
        return len(_plain_ids(self._engine.tokenizer, text))

    # ------------------------------------------------------------------ prompt parsing
    def _qgpm_parts(self, prompt: BasePromptTemplate, prompt_args: dict[str, Any]) -> Optional[dict[str, Any]]:
        """Context / question / refine answer from a synthesizer's template call, or None."""
        if prompt.output_parser is not None or self.output_parser is not None:
            return None
        tmpl = prompt.select(llm=self) if isinstance(prompt, SelectorPromptTemplate) else prompt
        try:
            values = _template_values(tmpl, prompt_args)
        except Exception:
            return None
        used = set(tmpl.template_vars or [])
        ctx_key = next((k for k in self.context_keys if k in values and (not used or k in used)), None)
        q_key = next((k for k in self.question_keys if k in values and (not used or k in used)), None)
        if ctx_key is None or q_key is None:
            return None
        context, question = values[ctx_key], values[q_key]
        if isinstance(context, (list, tuple)) and all(isinstance(c, str) for c in context):
            context = "\n\n".join(c.strip() for c in context if c.strip())  # simple_summarize passes a list
        if not isinstance(context, str) or not isinstance(question, str) or not context.strip() or not question.strip():
            return None
        parts: dict[str, Any] = {"context": split_context(context, _tracing.known_chunks()), "question": question, "step": "qa"}
        existing = values.get("existing_answer")
        if ctx_key == "context_msg" or existing is not None:
            parts["step"] = "refine"
            parts["existing_answer"] = "" if existing is None else str(existing)
        return parts

    # ------------------------------------------------------------------ prompt chaining (synthesizers)
    def predict(self, prompt: BasePromptTemplate, **prompt_args: Any) -> str:
        parts = self._qgpm_parts(prompt, prompt_args)
        if parts is None:
            return super().predict(prompt, **prompt_args)
        dispatcher.event(LLMPredictStartEvent(template=prompt, template_args=prompt_args))
        self._log_template_data(prompt, **prompt_args)
        output = self.complete(self._get_prompt(prompt, **prompt_args), formatted=True, qgpm=parts).text
        dispatcher.event(LLMPredictEndEvent(output=output))
        return output

    def stream(self, prompt: BasePromptTemplate, **prompt_args: Any) -> TokenGen:
        parts = self._qgpm_parts(prompt, prompt_args)
        if parts is None:
            return super().stream(prompt, **prompt_args)
        self._log_template_data(prompt, **prompt_args)
        dispatcher.event(LLMPredictStartEvent(template=prompt, template_args=prompt_args))
        gen = self.stream_complete(self._get_prompt(prompt, **prompt_args), formatted=True, qgpm=parts)
        return stream_completion_response_to_tokens(gen)

    async def apredict(self, prompt: BasePromptTemplate, **prompt_args: Any) -> str:
        parts = self._qgpm_parts(prompt, prompt_args)
        if parts is None:
            return await super().apredict(prompt, **prompt_args)
        dispatcher.event(LLMPredictStartEvent(template=prompt, template_args=prompt_args))
        self._log_template_data(prompt, **prompt_args)
        output = (await self.acomplete(self._get_prompt(prompt, **prompt_args), formatted=True, qgpm=parts)).text
        dispatcher.event(LLMPredictEndEvent(output=output))
        return output

    async def astream(self, prompt: BasePromptTemplate, **prompt_args: Any) -> TokenAsyncGen:
        parts = self._qgpm_parts(prompt, prompt_args)
        if parts is None:
            return await super().astream(prompt, **prompt_args)
        self._log_template_data(prompt, **prompt_args)
        dispatcher.event(LLMPredictStartEvent(template=prompt, template_args=prompt_args))
        gen = await self.astream_complete(self._get_prompt(prompt, **prompt_args), formatted=True, qgpm=parts)
        return await astream_completion_response_to_tokens(gen)

    # ------------------------------------------------------------------ engine calls
    def _split_kwargs(self, kwargs: dict[str, Any]) -> tuple[Optional[dict[str, Any]], dict[str, Any]]:
        parts = kwargs.pop("qgpm", None)
        gen = {k: getattr(self, k) for k in _CALL_KEYS}
        for k in _CALL_KEYS:
            if k in kwargs:
                gen[k] = kwargs.pop(k)
        if "max_tokens" in kwargs:
            gen["max_new_tokens"] = kwargs.pop("max_tokens")
        gen.update(self.generate_kwargs)
        # other keyword arguments (e.g. from synthesizer response_kwargs) are ignored
        return parts, gen

    def _answer_kwargs(self, parts: dict[str, Any]) -> tuple[Any, str, dict[str, Any]]:
        context, question = parts["context"], parts["question"]
        kw: dict[str, Any] = dict(system=self.system_prompt, answer_prefix=self.answer_prefix)
        if parts["step"] == "refine":
            kw["instruction"] = self.refine_instruction.replace("{existing_answer}", parts["existing_answer"].strip())
        else:
            kw["instruction"] = self.instruction
        method = self.method
        spec = method_spec(method)
        if spec.reranker:
            kw.update(reranker=self.reranker, k=self.k)
        elif spec.options:
            kw["options"] = self.options
        elif spec.evidence:
            joined = "\n\n".join(context) if isinstance(context, list) else context
            present = [e for e in self.evidence or [] if e.strip() and e.strip() in joined]
            if present:
                kw["evidence"] = present
            else:  # e.g. a refine step over a chunk without the evidence
                logger.warning("qgpm: none of the oracle's evidence is in this context, so this call answers with method='vanilla' "
                               "(standard positions)")
                method = "vanilla"
        if spec.stage is Stage.HEADS and self.relevance is not None:
            kw["config"] = self._engine.config.with_(relevance=self.relevance)
        kw["method"] = method
        return context, question, kw

    def _messages(self, prompt: str, formatted: bool) -> list[dict[str, str]]:
        if not formatted:
            prompt = self.completion_to_prompt(prompt)
        msgs = []
        if self.system_prompt and not formatted:
            msgs.append({"role": "system", "content": self.system_prompt})
        msgs.append({"role": "user", "content": prompt})
        return msgs

    @staticmethod
    def _chat_dicts(messages: Sequence[ChatMessage]) -> list[dict[str, str]]:
        return [{"role": _ROLE_MAP.get(m.role, "user"), "content": m.content or ""} for m in messages]

    def _start(self, parts: Optional[dict[str, Any]]) -> Optional[QGPMTrace]:
        trace = _tracing.current_trace()
        if trace is not None:
            trace.call_started()
        return trace

    def _finish(self, result: QGPMResult, trace: Optional[QGPMTrace], parts: Optional[dict[str, Any]]) -> None:
        result.details.setdefault("llama_index", {"step": parts["step"] if parts else "plain"})
        if parts and isinstance(parts["context"], list):
            result.details["llama_index"]["documents"] = len(parts["context"])
        with self._lock:
            self._last = result
        if trace is not None:
            trace.add_result(result)

    @staticmethod
    def _usage(result: QGPMResult) -> dict[str, int]:
        return {
            "prompt_tokens": result.usage.prompt_tokens,
            "completion_tokens": result.usage.answer_tokens,
            "total_tokens": result.usage.total_tokens,
        }

    @classmethod
    def _result_fields(cls, result: Optional[QGPMResult]) -> dict[str, Any]:
        """What a finished call's response carries besides its text: usage and the result."""
        if result is None:
            return {}
        return {
            "raw": {"usage": cls._usage(result), "result": result},
            "additional_kwargs": {"method": result.method, "finish_reason": result.finish_reason},
        }

    @classmethod
    def _completion_response(cls, text: str, delta: Optional[str], result: Optional[QGPMResult]) -> CompletionResponse:
        return CompletionResponse(text=text, delta=delta, **cls._result_fields(result))

    @classmethod
    def _chat_response(cls, text: str, delta: Optional[str], result: Optional[QGPMResult]) -> ChatResponse:
        return ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content=text), delta=delta, **cls._result_fields(result))

    def _run(self, parts: Optional[dict[str, Any]], gen: dict[str, Any], messages: list[dict[str, str]]) -> QGPMResult:
        if parts is None:
            return self._engine.chat(messages, **gen)
        context, question, kw = self._answer_kwargs(parts)
        return self._engine.answer(context, question, **kw, **gen)

    def _stream(self, parts: Optional[dict[str, Any]], gen: dict[str, Any], messages: list[dict[str, str]]):
        if parts is None:
            return self._engine.stream_chat(messages, **gen)
        context, question, kw = self._answer_kwargs(parts)
        return self._engine.stream(context, question, **kw, **gen)

    def _call(self, parts: Optional[dict[str, Any]], gen: dict[str, Any], messages: list[dict[str, str]], respond: Any, stream: bool) -> Any:
        """Run one call on the engine; ``respond(text, delta, result)`` builds the response objects.

        Streaming starts the engine's stream now and returns :meth:`_pieces` over it.
        """
        trace = self._start(parts)
        if stream:
            return self._pieces(self._stream(parts, gen, messages), trace, parts, respond)
        result = self._run(parts, gen, messages)
        self._finish(result, trace, parts)
        return respond(result.text, None, result)

    def _pieces(self, stream: Any, trace: Optional[QGPMTrace], parts: Optional[dict[str, Any]], respond: Any) -> Generator[Any, None, None]:
        """The one streaming generator, for completions and chat alike."""
        text = ""
        try:
            for piece in stream:
                text += piece
                yield respond(text, piece, None)
        finally:
            stream.close()
        result = stream.result
        if result is None:
            return
        self._finish(result, trace, parts)
        yield respond(text, "", result)  # a last, empty delta that carries usage and the result

    def _completion(self, prompt: str, formatted: bool, kwargs: dict[str, Any], stream: bool) -> Any:
        parts, gen = self._split_kwargs(dict(kwargs))
        return self._call(parts, gen, self._messages(prompt, formatted), self._completion_response, stream)

    def _chat(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any], stream: bool) -> Any:
        _, gen = self._split_kwargs(dict(kwargs))  # chat messages never take QGPM's context path
        return self._call(None, gen, self._chat_dicts(messages), self._chat_response, stream)

    # ------------------------------------------------------------------ LLM interface
    # LlamaIndex's CustomLLM would derive chat and async from complete / stream_complete, but
    # its chat flattens the messages into one user turn (messages_to_prompt), so the model's
    # chat template would no longer see the roles, and its async methods run the model on
    # the event loop. Here every entry point is one line over _completion / _chat, and the
    # async ones run the model in a worker thread so the event loop stays free.
    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return self._completion(prompt, formatted, kwargs, stream=False)

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        return self._completion(prompt, formatted, kwargs, stream=True)

    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return await asyncio.to_thread(self._completion, prompt, formatted, kwargs, False)

    @llm_completion_callback()
    async def astream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseAsyncGen:
        return _to_async(await asyncio.to_thread(self._completion, prompt, formatted, kwargs, True))

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return self._chat(messages, kwargs, stream=False)

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        return self._chat(messages, kwargs, stream=True)

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return await asyncio.to_thread(self._chat, messages, kwargs, False)

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        return _to_async(await asyncio.to_thread(self._chat, messages, kwargs, True))


_DONE = object()


def _to_async(sync_gen: Generator[Any, None, None]) -> AsyncGenerator[Any, None]:
    """Drive a blocking generator from a worker thread, one item at a time."""

    def step() -> Any:
        return next(sync_gen, _DONE)

    async def agen() -> AsyncGenerator[Any, None]:
        try:
            while True:
                item = await asyncio.to_thread(step)
                if item is _DONE:
                    break
                yield item
        finally:
            try:
                sync_gen.close()
            except ValueError:  # still running in a worker thread (consumer cancelled): it ends on its own
                pass

    return agen()
