"""One :class:`~qgpm_integrations.langchain.QGPMChatModel` call's arguments.

LangChain messages become qgpm's role / content dicts and :class:`qgpm.chat_prompt.ChatParts`
(:func:`build_request`); a call's keyword arguments, over the chat model's fields, become the
decoding arguments (:func:`decoding_args`) and the ``QGPM.answer`` arguments
(:func:`answer_args`) of the call; its result becomes ``response_metadata`` and
``usage_metadata`` (:func:`response_metadata`). Every check here runs before any model work.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from langchain_core.messages import AIMessage, BaseMessage, ChatMessage, FunctionMessage, SystemMessage, ToolMessage
from langchain_core.messages.ai import UsageMetadata

from qgpm.call_checks import CallOptions, check_options
from qgpm.chat_prompt import ChatParts, read_chat
from qgpm.conversation import ChatRequest
from qgpm.decoding import Decoding, check_stop
from qgpm.prompt import check_prompt_settings
from qgpm.editing import check_k
from qgpm.methods import Stage, method_spec

from .._common import check_relevance
from .prompts import document_texts

if TYPE_CHECKING:
    from .chat_models import QGPMChatModel

__all__ = ["CALL_KWARGS", "CONTEXT_ONLY_KWARGS", "GENERATE_FIELDS", "as_dicts", "build_request", "check_call_kwargs", "check_report_args", "decoding_args",
           "check_generator", "answer_args", "plain_args", "with_engine", "unused_in_plain_chat", "response_metadata"]

CALL_KWARGS = frozenset(
    {
        "context", "question", "method", "evidence", "system", "instruction", "answer_prefix",
        "reranker", "k", "qgpm_config", "max_tokens", "max_new_tokens", "num_predict", "temperature", "top_p", "seed",
        "explain_k", "explain_html", "model", "timeout", "stream", "options", "on_empty_context", "relevance",
    }
)
"""The keyword arguments a call may pass (``invoke(..., **kw)`` / ``bind(**kw)``)."""

GENERATE_FIELDS = {
    "max_new_tokens": "max_tokens", "max_tokens": "max_tokens", "num_predict": "max_tokens", "temperature": "temperature", "top_p": "top_p",
    "seed": "seed", "stop": "stop", "max_time": "timeout",
}
"""``generate`` arguments that have a field of their own on the chat model (and the field's name)."""

CONTEXT_ONLY_KWARGS = ("method", "evidence", "reranker", "k", "options", "relevance", "qgpm_config", "instruction",
                       "answer_prefix")
"""Call keywords that set how an answer over a context is made; a plain chat call (no context) has no use for them."""


def _role(msg: BaseMessage) -> str:
    if isinstance(msg, SystemMessage):
        return "system"
    if isinstance(msg, AIMessage):
        return "assistant"
    if isinstance(msg, ChatMessage) and msg.role in ("system", "user", "assistant"):
        return msg.role
    return "user"  # human messages, and chat messages of other roles


TOOLS_REFUSED = ("QGPMChatModel does not take part in tool calling (it answers from text: no bind_tools, no tool "
                 "messages); put a tool's result in context= or in a human message's text")


def as_dicts(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    """LangChain messages as qgpm's role / content dicts (content blocks kept, with their marks).
    A tool or function message, or an AI message with tool calls, raises: the model cannot have
    made those calls, and a tool result taken as a human turn could become the question."""
    out = []
    for i, m in enumerate(messages):
        if isinstance(m, (ToolMessage, FunctionMessage)) or getattr(m, "tool_calls", None):
            kind = type(m).__name__ + (" with tool_calls" if getattr(m, "tool_calls", None) else "")
            raise ValueError(f"message {i} is a {kind}: {TOOLS_REFUSED}")
        out.append({"role": _role(m), "content": m.content})
    return out


def build_request(messages: Sequence[BaseMessage], kw: dict[str, Any]) -> ChatParts:
    """Context, question, instruction, system and history of one call (:func:`qgpm.chat_prompt.read_chat`)."""
    context = document_texts(kw["context"]) if kw.get("context") is not None else None
    question = kw.get("question")
    if question is not None and not isinstance(question, str):
        raise TypeError(f"question= must be a string (the question to answer), got {type(question).__name__} {question!r}; "
                        "leave it out to use the last human message")
    return read_chat(as_dicts(messages), context=context, question=question)


def check_call_kwargs(kwargs: dict[str, Any]) -> None:
    """``TypeError`` naming a call keyword the chat model does not take."""
    unknown = set(kwargs) - CALL_KWARGS
    if unknown:
        raise TypeError(f"QGPMChatModel got unexpected keyword arguments {sorted(unknown)}; allowed: {sorted(CALL_KWARGS)}")


def _setting(kwargs: dict[str, Any], name: str, default: Any) -> Any:
    """A call's ``name``, or ``default`` (the model's own) where the call leaves it out or gives ``None``."""
    value = kwargs.get(name)
    return default if value is None else value


def check_report_args(kwargs: dict[str, Any]) -> None:
    """Refuse a call's ``explain_k`` / ``explain_html`` that the model's fields would refuse."""
    k = kwargs.get("explain_k")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int)):
        raise TypeError(f"explain_k must be an int >= 0 (top sentences reported), got {type(k).__name__} {k!r}")
    if k is not None and k < 0:
        raise ValueError(f"explain_k must be >= 0 (0: none reported), got {k}")
    html = kwargs.get("explain_html")
    if html is not None and not isinstance(html, bool):
        raise TypeError(f"explain_html must be True or False, got {type(html).__name__} {html!r}")


def decoding_args(llm: "QGPMChatModel", stop: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The decoding arguments of one call: the call's keywords over ``llm``'s fields, then its
    ``generate_kwargs``, checked as the engine checks them (:meth:`qgpm.decoding.Decoding.check`:
    no bool or float budget, no bool temperature, ...). A keyword given as ``None`` is the model's own
    setting (``seed=None``: no seed). Checked before any model loads; the one check that needs the
    engine is :func:`check_generator`."""
    try:
        call_stop = check_stop(stop)
    except TypeError as exc:
        raise TypeError(f"{exc} (the stop= of this call)") from None
    stops = [*call_stop, *check_stop(llm.stop)]
    budgets = [n for n in ("max_tokens", "max_new_tokens", "num_predict") if kwargs.get(n) is not None]  # one budget, three names
    if len({repr(kwargs[n]) for n in budgets}) > 1:
        raise ValueError(" and ".join(f"{n}={kwargs[n]!r}" for n in budgets) + " name one budget: pass one")
    budget_name = budgets[0] if budgets else "max_new_tokens"
    gen: dict[str, Any] = dict(
        max_new_tokens=_setting(kwargs, budget_name, llm.max_tokens),
        temperature=_setting(kwargs, "temperature", llm.temperature),
        top_p=_setting(kwargs, "top_p", llm.top_p),
        stop=list(dict.fromkeys(stops)) or None,
        seed=kwargs.get("seed", llm.seed),
    )
    try:
        Decoding.check(**gen)
    except (TypeError, ValueError) as exc:
        message = str(exc)
        if message.startswith("max_new_tokens") and budget_name != "max_new_tokens":
            message = budget_name + message[len("max_new_tokens"):]
        raise type(exc)(message) from None
    gen.update(llm.generate_kwargs or {})
    timeout = kwargs.get("timeout", llm.timeout)
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError(f"timeout must be a number of seconds > 0 (None: no limit), got {timeout!r}")
        gen["max_time"] = float(timeout)
    return gen


def check_generator(engine: Any, gen: dict[str, Any]) -> None:
    """Refuse decoding arguments the engine's generator cannot apply (``timeout=`` on a vLLM server)."""
    if "max_time" in gen and getattr(engine.generator, "name", None) == "vllm":
        raise ValueError("timeout= stops generation in this process (transformers max_time); a vLLM server takes no such setting")


def with_engine(engine: Any, call: dict[str, Any]) -> dict[str, Any]:
    """The ``QGPM.answer`` arguments of :func:`answer_args` (made before the engine loaded) with a
    call's ``relevance=`` applied to the engine's own config where the call gives none."""
    relevance = call.pop("relevance", None)
    if relevance is not None:
        call["config"] = (call["config"] or engine.config).with_(relevance=relevance)
    return call


def answer_args(llm: "QGPMChatModel", request: ChatRequest, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The ``QGPM.answer`` arguments of a context call: the call's keywords over ``llm``'s fields,
    checked before any model loads; :func:`with_engine` applies a ``relevance`` to the engine's config."""
    method = kwargs.get("method", llm.method)
    spec = method_spec(method)
    call: dict[str, Any] = dict(
        method=method,
        **request.prompt_kwargs(system=kwargs.get("system"), instruction=kwargs.get("instruction"),
                                default_system=llm.system, default_instruction=llm.instruction),
        answer_prefix=kwargs.get("answer_prefix", llm.answer_prefix),
        config=kwargs.get("qgpm_config", llm.qgpm_config),
    )
    if spec.evidence:
        call["evidence"] = kwargs.get("evidence")
    elif kwargs.get("evidence") is not None:
        raise ValueError("evidence= is only used with method='oracle'")
    if spec.reranker:
        call["reranker"] = kwargs.get("reranker", llm.reranker)
    if spec.takes_k:
        call["k"] = check_k(_setting(kwargs, "k", llm.k))
    # a call's own reranker= / k= for a method that does not read them reach the engine, which refuses them
    call.update({n: kwargs[n] for n in ("reranker", "k") if kwargs.get(n) is not None and n not in call})
    check_relevance(kwargs.get("relevance"), method)
    relevance = kwargs.get("relevance", llm.relevance)
    if relevance is not None and spec.stage is Stage.HEADS:
        call["relevance"] = relevance
    # the model's options belong to its own method; a call's options= go to the engine, which
    # rejects them for a method that takes none
    options = kwargs.get("options", llm.options if method == llm.method else None)
    if options is not None:
        call["options"] = options
    return call


def plain_args(llm: "QGPMChatModel", kwargs: dict[str, Any]) -> dict[str, Any]:
    """The system message of a plain chat call (:meth:`qgpm.conversation.ChatRequest.plain_messages`),
    checked as a call with a context checks it."""
    system = kwargs.get("system")
    check_prompt_settings(system=system)
    return {"system": system, "default_system": llm.system}


def unused_in_plain_chat(llm: "QGPMChatModel", request: ChatRequest, kwargs: dict[str, Any]) -> list[str]:
    """The :data:`CONTEXT_ONLY_KWARGS` a plain chat call was given (``None`` counts as not given),
    once checked as a call with a context checks them (:func:`answer_args`, then the engine's own
    :func:`qgpm.call_checks.check_options`), so a bad value raises in either mode."""
    given = [n for n in CONTEXT_ONLY_KWARGS if kwargs.get(n) is not None]
    if given:
        call = answer_args(llm, request, kwargs)
        call.pop("relevance", None)
        check_options(method_spec(call["method"]), CallOptions(**call))
    return given


def response_metadata(llm: "QGPMChatModel", engine: Any, request: ChatRequest, result: Any,
                      kwargs: dict[str, Any]) -> tuple[dict[str, Any], UsageMetadata]:
    """``response_metadata`` (with the request's report under ``"qgpm"``) and ``usage_metadata`` of a call's result."""
    meta = {
        "model_name": str(engine.name) if engine is not None else llm.model_name,
        "method": result.method,
        "finish_reason": result.finish_reason,
        "qgpm": request.report(result, top_k=_setting(kwargs, "explain_k", llm.explain_k),
                               html=_setting(kwargs, "explain_html", llm.explain_html)),
    }
    usage = UsageMetadata(
        input_tokens=int(result.usage.prompt_tokens),
        output_tokens=int(result.usage.answer_tokens),
        total_tokens=int(result.usage.prompt_tokens + result.usage.answer_tokens),
    )
    return meta, usage
