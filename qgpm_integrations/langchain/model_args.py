"""A :class:`~qgpm_integrations.langchain.QGPMChatModel`'s own arguments: checked when it is
built, and reported to LangChain's tracing.

:func:`drop_remote_only` takes out the arguments of hosted chat models (accepted for drop-in
code, named in a warning when set); :func:`check_model_fields` refuses, before any model loads,
every constructor value the chat model could not run (loading arguments beside a shared engine,
``generate_kwargs`` the engine would refuse, a vLLM setting without its server, an unknown
reranker or relevance source, baseline options for another method) and returns what the model
loads with; :func:`budget_alias` reads ChatOllama's ``num_predict`` as ``max_tokens``;
:func:`tracing_params` gives LangSmith's parameters of one call, and :func:`identifying_params`
the settings LangChain's cache keys on.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from langchain_core.language_models import LangSmithParams

from qgpm.decoding import Decoding
from qgpm.defaults import BASELINE_METHODS
from qgpm.editing import check_k
from qgpm.field_checks import closest_name
from qgpm.methods import method_spec
from qgpm.serving import VLLMServer

from .._common import check_generate_kwargs, check_heads, check_model_args, check_relevance, check_reranker, heads_key, kwargs_key
from .call_args import GENERATE_FIELDS

if TYPE_CHECKING:
    from .chat_models import QGPMChatModel

__all__ = ["budget_alias", "name_unknown_fields", "ELSEWHERE", "identifying_params", "REMOTE_ONLY", "check_model_fields", "drop_remote_only", "tracing_params"]

logger = logging.getLogger("qgpm")

OWNER = "QGPMChatModel"

REMOTE_ONLY = ("api_key", "max_retries")
"""Constructor arguments of hosted chat models: accepted for drop-in code, not used (set: a warning)."""


def budget_alias(values: Any) -> Any:
    """Constructor values with ChatOllama's ``num_predict`` read as ``max_tokens`` (the answer budget;
    ``max_new_tokens`` is HuggingFace's name for it); two of the three names given raise."""
    if not isinstance(values, dict) or "num_predict" not in values:
        return values
    given = [n for n in ("max_tokens", "max_new_tokens") if n in values]
    if given:
        raise ValueError(f"num_predict and {given[0]} name one budget (the answer's tokens): pass one")
    values = dict(values)
    values["max_tokens"] = values.pop("num_predict")
    return values


ELSEWHERE = {
    **dict.fromkeys(("top_k", "repetition_penalty", "do_sample", "min_new_tokens", "no_repeat_ngram_size", "typical_p"),
                    "a generation setting: generate_kwargs={{'{name}': ...}} (temperature > 0 samples)"),
    **dict.fromkeys(("device_map", "torch_dtype", "dtype", "quantization_config", "attn_implementation", "trust_remote_code"),
                    "a loading setting: model_kwargs={{'{name}': ...}}"),
    "device": "from_model_id(..., device=...) or model_kwargs={{'device_map': ...}}",
    "pipeline_kwargs": "generate_kwargs= (generation) and model_kwargs= (loading): there is no pipeline",
    "task": "not needed: QGPMChatModel is a chat model over a causal LM",
    "max_length": "max_tokens= (the answer's budget; the prompt's room is the model's window)",
    "num_ctx": "the model's own window is used (engine.max_length); nothing to set",
    "context_window": "the model's own window is used (engine.max_length); nothing to set",
}
"""Arguments other chat models take (HuggingFacePipeline, ChatHuggingFace, ChatOllama) and where
each goes here; given, they are refused with that hint."""


def name_unknown_fields(values: Any, known: set[str]) -> Any:
    """Refuse (``ValueError``) constructor arguments the chat model does not take before pydantic's
    bare "Extra inputs are not permitted", saying where a known setting of another chat model
    goes (:data:`ELSEWHERE`), the closest field for a misspelt one, and that ``max_tokens`` and
    ``max_new_tokens`` are one budget."""
    if not isinstance(values, dict):
        return values
    if "max_tokens" in values and "max_new_tokens" in values:
        raise ValueError("max_tokens and max_new_tokens name one budget (the answer's tokens): pass one")
    unknown = [k for k in values if isinstance(k, str) and k not in known]
    if not unknown:
        return values
    said = []
    for name in unknown:
        hint = ELSEWHERE.get(name)
        if hint is None:
            close = closest_name(name, sorted(known))
            hint = f"did you mean {close!r}?" if close else "not an argument of QGPMChatModel"
        said.append(f"{name}: {hint.format(name=name)}")
    raise ValueError(f"{OWNER} does not take {', '.join(unknown)} ({'; '.join(said)})")


def drop_remote_only(values: Any) -> Any:
    """``values`` without :data:`REMOTE_ONLY`'s keys, with a warning naming those that were set.

    The chat model runs locally: LangChain's standard tests and drop-in code pass ``api_key`` /
    ``max_retries``, which are accepted and not stored (the key's value is never logged).
    """
    if not isinstance(values, dict):
        return values
    unused = [k for k in REMOTE_ONLY if values.get(k) is not None]
    if unused:
        logger.warning("QGPMChatModel runs a local model and does not use %s (settings of hosted chat models); "
                       "leave them out", " or ".join(f"{k}=" for k in unused))
    return {k: v for k, v in values.items() if k not in REMOTE_ONLY}


def check_model_fields(llm: "QGPMChatModel") -> dict[str, Any]:
    """Refuse a chat model's fields that could not run, before any model loads; return the
    ``from_pretrained`` arguments it loads with (empty with ``engine=``)."""
    load_kwargs: dict[str, Any] = {}
    if llm.engine is not None:
        given = [n for n in ("model", "tokenizer", "heads", "model_kwargs", "vllm_url") if getattr(llm, n) is not None]
        if given:
            raise ValueError(f"pass either engine= or {'/'.join(given)}=, not both (the engine is already loaded)")
    else:
        load_kwargs = check_model_args(OWNER, llm.model, llm.tokenizer, llm.model_kwargs)
        check_heads(llm.heads, OWNER)
    check_generate_kwargs(llm.generate_kwargs, OWNER, GENERATE_FIELDS, remote=llm.vllm_url is not None)
    # seed=-1 and the like: refused now, not at each call (values only: the greedy-decoding note is the call's, where a
    # .bind(temperature=...) may still come)
    Decoding.check(llm.max_tokens, llm.temperature or 1.0, llm.top_p, llm.stop, llm.seed)
    if llm.timeout is not None and llm.vllm_url is not None:
        raise ValueError("timeout= stops generation in this process (transformers max_time); a vLLM server takes no such "
                         "setting: leave timeout unset with vllm_url=")
    if llm.vllm_model is not None and llm.vllm_url is None:
        raise ValueError("vllm_model= names the model on the vllm_url= server: pass vllm_url= too")
    if llm.vllm_url is not None:
        VLLMServer(llm.vllm_url, model=llm.vllm_model).close()  # a malformed address fails here, before any model work
    check_relevance(llm.relevance, llm.method)
    # values only: a call's method= (.bind, configurable_fields) may be one that reads reranker / k, and the call checks that
    if llm.reranker is not None:
        check_reranker(llm.reranker, OWNER)
    if llm.k is not None:
        check_k(llm.k)
    spec, given = method_spec(llm.method), llm.model_fields_set
    unread = [f for f, reads in (("reranker", spec.reranker), ("k", spec.takes_k)) if f in given and not reads]
    if unread:  # kept for calls whose method= reads them (.bind, configurable fields); said, not silently unused
        logger.warning("qgpm: %s set the reranker / chunk count of calls whose method is topk or reorder (a .bind(method=...)); "
                       "method=%r reads neither, so its own calls leave them unused", ", ".join(f"{f}=" for f in unread), llm.method)
    if llm.options is not None and getattr(llm.options, "method", None) != llm.method:
        raise ValueError(
            f"options={type(llm.options).__name__} does not configure method={llm.method!r}; options= sets the RoPE "
            f"baselines ({', '.join(BASELINE_METHODS)}), e.g. QGPMChatModel(method='string', options=StringOptions(...))"
        )
    return load_kwargs


def tracing_params(llm: "QGPMChatModel", stop: list[str] | None, kwargs: dict[str, Any]) -> LangSmithParams:
    """LangSmith's parameters of one call. Read before the call is checked: a bad value is left
    out here and refused by the call."""
    temperature = kwargs.get("temperature", llm.temperature)
    max_tokens = kwargs.get("max_tokens", kwargs.get("max_new_tokens", kwargs.get("num_predict", llm.max_tokens)))
    params = LangSmithParams(
        ls_provider="qgpm",
        ls_model_name=str(kwargs["model"]) if isinstance(kwargs.get("model"), str) else llm.model_name,
        ls_model_type="chat",
    )
    if isinstance(temperature, (int, float)) and not isinstance(temperature, bool):
        params["ls_temperature"] = float(temperature)
    if isinstance(max_tokens, int) and not isinstance(max_tokens, bool):
        params["ls_max_tokens"] = max_tokens
    stops = stop or llm.stop
    if stops and isinstance(stops, str):
        params["ls_stop"] = [stops]
    elif stops and isinstance(stops, (list, tuple)):
        params["ls_stop"] = list(stops)
    return params


def _engine_heads(engine: Any) -> list[list[int]] | None:
    """The heads of a given engine's head set (``None``: it has none)."""
    head_set = getattr(engine, "head_set", None)
    return None if head_set is None else [list(h) for h in head_set.heads]


def identifying_params(llm: "QGPMChatModel") -> dict[str, Any]:
    """Everything that changes a chat model's reply or its metadata (its ``_identifying_params``: LangChain's cache keys on them)."""
    engine = llm.engine
    return {
        "model": llm.model_name,
        "method": llm.method,
        "max_tokens": llm.max_tokens,
        "temperature": llm.temperature,
        "top_p": llm.top_p,
        "stop": llm.stop,
        "seed": llm.seed,
        "heads": heads_key(llm.heads) if engine is None else _engine_heads(engine),
        "options": None if llm.options is None else llm.options.to_dict(),
        "model_kwargs": dict(kwargs_key(llm.model_kwargs)),
        "generate_kwargs": dict(kwargs_key(llm.generate_kwargs)),
        "qgpm_config": None if llm.qgpm_config is None else llm.qgpm_config.to_dict(),
        "engine_config": None if engine is None or not hasattr(engine.config, "to_dict") else engine.config.to_dict(),
        "system": llm.system,
        "instruction": llm.instruction,
        "answer_prefix": llm.answer_prefix,
        "reranker": llm.reranker if isinstance(llm.reranker, str) or llm.reranker is None else type(llm.reranker).__name__,
        "k": llm.k,
        "relevance": llm.relevance,
        "timeout": llm.timeout,
        "vllm_url": llm.vllm_url,
        "vllm_model": llm.vllm_model,
        "on_empty_context": llm.on_empty_context,
        "explain_k": llm.explain_k,
        "explain_html": llm.explain_html,
    }
