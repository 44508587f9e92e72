"""The arguments of a :class:`~qgpm_integrations.llama_index.QGPMLLM`: checked when it is built,
and turned into decoding arguments on each call.

:func:`check_init_args` refuses, before any model loads, every constructor argument the LLM
would not use or could not run (a key it has no field for, a method setting for a method that
does not read it, loading arguments beside a shared engine, decoding values the engine would
refuse, an unknown reranker, a prompt setting without its placeholder) and returns what the
constructor loads with;
:func:`decoding_args` gives a completion's decoding arguments, refusing any call keyword but the
decoding ones.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Mapping, Optional

from qgpm.baselines import resolve_options
from qgpm.call_checks import check_edit_args
from qgpm.decoding import Decoding
from qgpm.defaults import DEFAULT_METHOD
from qgpm.field_checks import closest_name
from qgpm.limits import model_window
from qgpm.loading import model_config, resolve_source
from qgpm.methods import MethodSpec, method_spec

from .._common import check_generate_kwargs, check_heads, check_model_args, check_relevance, check_reranker
from ._prompt import messages_to_prompt

if TYPE_CHECKING:
    from .llm import QGPMLLM

__all__ = ["CALL_KEYS", "CALL_ARGS", "GENERATE_FIELDS", "INIT_ARGS", "check_init_args", "check_context_window", "config_window",
           "check_window", "check_no_query_wrapper", "decoding_args"]

OWNER = "QGPMLLM"

CALL_KEYS = ("max_new_tokens", "temperature", "top_p", "stop", "seed")
"""The decoding fields a completion call may override."""

CALL_ARGS = frozenset(CALL_KEYS) | {"max_tokens"}
"""Every keyword a completion call takes."""

GENERATE_FIELDS = {"max_new_tokens": "max_new_tokens", "max_tokens": "max_new_tokens", "temperature": "temperature",
                   "top_p": "top_p", "seed": "seed", "stop": "stop"}
"""``generate`` arguments that have a field of their own on the LLM (and the field's name)."""

INIT_ARGS = ("engine", "model", "tokenizer", "heads", "device_map", "set_global_tokenizer")
"""Constructor arguments that are not fields."""


ELSEWHERE = {
    "max_tokens": "the answer's budget is max_new_tokens= here (as HuggingFaceLLM); a call takes max_tokens= too",
    "num_predict": "the answer's budget is max_new_tokens= here (as HuggingFaceLLM)",
    "tokenizer_name": "the tokenizer is the model's own, loaded with it; an already-loaded one: tokenizer= with model=",
    "tokenizer_kwargs": "the tokenizer is the model's own, loaded with it",
    "stopping_ids": "stop strings go in stop=; token ids are not taken (the model's end token always stops an answer)",
}
"""HuggingFaceLLM / Ollama arguments QGPMLLM takes under another name or not at all, with where they go."""


def check_init_args(fields: Mapping[str, Any], kwargs: dict[str, Any], engine: Any, model: Any, tokenizer: Any, heads: Any,
                    device_map: Any) -> tuple[MethodSpec, Any, dict[str, Any]]:
    """Check a ``QGPMLLM(...)`` call before anything loads; ``(method spec, model, loading arguments)``.

    ``fields``: the LLM's pydantic fields; ``kwargs``: the field values given, completed in place
    (a model id given as ``model`` moves to ``model_name``, ``device_map`` into ``model_kwargs``,
    the default ``messages_to_prompt``). ``model`` comes back ``None`` when it was an id.
    """
    keys = sorted({"context_keys", "question_keys"} & set(kwargs))
    if keys:
        raise TypeError(
            f"{OWNER} takes no {'/'.join(keys)}: it reads the context and the question from the prompt text. "
            "Use QGPMSynthesizer to hand the nodes and the question over directly, or write the template with "
            "'Context:' before the context and 'Question: {query_str}' at the end"
        )
    unknown = sorted(set(kwargs) - set(fields))
    if unknown:
        allowed = sorted(set(fields) | set(INIT_ARGS))
        hints = [f"{n}: {ELSEWHERE[n]}" if n in ELSEWHERE else f"{n}: did you mean {c!r}?"
                 for n in unknown if n in ELSEWHERE or (c := closest_name(n, allowed))]
        raise TypeError(f"{OWNER} got unexpected arguments {unknown}" + (f" ({'; '.join(hints)})" if hints else "")
                        + f"; allowed: {', '.join(allowed)}")
    method = kwargs.get("method", DEFAULT_METHOD)
    spec = method_spec(method)
    if spec.evidence and not kwargs.get("evidence"):
        raise ValueError(f"method={method!r} needs evidence=[exact substrings of the context]")
    if kwargs.get("evidence") is not None and not spec.evidence:
        raise ValueError(f"evidence= is only used with method='oracle', not method={method!r}")
    if "reranker" in kwargs:
        check_reranker(kwargs["reranker"], OWNER)
    check_edit_args(spec, reranker=kwargs.get("reranker"), k=kwargs.get("k"))
    resolve_options(method, kwargs.get("options"))  # options of another method, or for a method without any, fail here
    check_relevance(kwargs.get("relevance"), method)
    _check_prompts(kwargs)
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
    extras = check_generate_kwargs(kwargs.get("generate_kwargs"), OWNER, GENERATE_FIELDS, remote=kwargs.get("vllm_url") is not None)
    try:  # the engine's own check of a call's decoding arguments, on the values every call will start from
        Decoding.check(**{k: kwargs[k] for k in CALL_KEYS if k in kwargs}, **extras)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{OWNER}: {exc}") from None
    if kwargs.get("context_window") is not None:
        check_window(kwargs.get("max_new_tokens", fields["max_new_tokens"].default), kwargs["context_window"])
    if engine is not None:
        given = [n for n, v in (("model", model), ("model_name", kwargs.get("model_name")), ("tokenizer", tokenizer),
                                ("heads", heads), ("model_kwargs", model_kwargs or None), ("vllm_url", kwargs.get("vllm_url")))
                 if v is not None]
        if given:
            raise ValueError(f"pass either engine= or {'/'.join(given)}=, not both (the engine is already loaded)")
        load_kwargs: dict[str, Any] = {}
    else:
        load_kwargs = check_model_args(OWNER, model, tokenizer, model_kwargs)
        check_heads(heads, OWNER)
    if kwargs.get("vllm_model") is not None and kwargs.get("vllm_url") is None:
        raise ValueError("vllm_model= names the model on the vllm_url= server: pass vllm_url= too")
    if kwargs.get("messages_to_prompt") is None:
        kwargs["messages_to_prompt"] = messages_to_prompt
    return spec, model, load_kwargs


def _check_prompts(kwargs: Mapping[str, Any]) -> None:
    """Refuse a prompt setting that would lose the text it is given for: a ``refine_instruction``
    without ``{existing_answer}`` (the earlier answer would not reach refine steps), and any
    ``query_wrapper_prompt`` (:func:`check_no_query_wrapper`)."""
    refine = kwargs.get("refine_instruction")
    if isinstance(refine, str) and "{existing_answer}" not in refine:
        raise ValueError(f"{OWNER}: refine_instruction={refine!r} has no {{existing_answer}}: refine steps put the answer so far "
                         "there, so without it every refine step answers from its own chunk alone. Add {existing_answer}")
    check_no_query_wrapper(kwargs.get("query_wrapper_prompt"))


def check_no_query_wrapper(wrapper: Any) -> None:
    """Refuse a ``query_wrapper_prompt``: QGPM writes each prompt with the model's chat template (or
    its plain-text format for a model without one), so a wrapper's text around LlamaIndex's prompt
    would be read as part of the question, and nothing else would put it before the model."""
    if wrapper is not None:
        raise ValueError(f"{OWNER} takes no query_wrapper_prompt: each prompt is written with the model's own chat template "
                         "(QGPM's plain-text format for a model without one), so a wrapper's text would end up inside the "
                         "question. Leave it unset; to change what the model is told use system_prompt, instruction or "
                         "answer_prefix")


def check_context_window(context_window: Optional[int], window: int, overhead: int) -> None:
    """Refuse a ``context_window`` larger than what LlamaIndex may pack into a model ``window`` when
    QGPM's own prompt takes ``overhead`` tokens of it (0: before the tokenizer is loaded)."""
    if context_window is None or not window or context_window <= window - overhead:
        return
    if not overhead:
        raise ValueError(f"{OWNER}: context_window={context_window} is larger than the model window ({window} tokens); "
                         "pass a smaller one, or leave it unset for the window less QGPM's own prompt")
    raise ValueError(f"{OWNER}: context_window={context_window} leaves no room for QGPM's own prompt: the model window is "
                     f"{window} tokens and QGPM's prompt takes {overhead} of them around the context and the question "
                     f"(instruction, system_prompt, chat template), so LlamaIndex may pack at most {window - overhead}; "
                     f"pass context_window <= {window - overhead}, or leave it unset")


def config_window(model_name: Optional[str]) -> int:
    """The window in the config of the model ``model_name`` names, read without its weights, so a
    ``context_window`` beyond it is refused before they load; 0 for a GGUF file (its config is in
    the file) or a config that does not load (the model load then says why)."""
    source = resolve_source(model_name)
    if source.gguf_file:
        return 0
    try:
        config = model_config(source)
    except (OSError, ValueError):
        return 0
    return model_window(config)


def check_window(max_new_tokens: Any, window: Any) -> None:
    """Refuse an answer budget that leaves no room for a prompt in ``window`` tokens (LlamaIndex
    packs prompts into ``context_window - max_new_tokens``)."""
    if isinstance(max_new_tokens, int) and isinstance(window, int) and window > 0 and max_new_tokens >= window:
        raise ValueError(f"{OWNER}: max_new_tokens={max_new_tokens} leaves no room for a prompt in the context window of "
                         f"{window} tokens (LlamaIndex packs prompts into context_window - max_new_tokens); use a smaller "
                         "max_new_tokens")


def decoding_args(llm: "QGPMLLM", kwargs: dict[str, Any]) -> dict[str, Any]:
    """Decoding arguments of one call: ``llm``'s fields, overridden by the call's own; any other call argument raises."""
    unknown = sorted(set(kwargs) - CALL_ARGS)
    if unknown:
        raise TypeError(f"{OWNER} got unexpected call arguments {unknown}; a call takes {', '.join(sorted(CALL_ARGS))} "
                        "(the method and its settings are the LLM's own fields)")
    gen = {k: kwargs.get(k, getattr(llm, k)) for k in CALL_KEYS}
    if "max_tokens" in kwargs:
        if "max_new_tokens" in kwargs:
            raise TypeError(f"{OWNER}: pass the answer budget as max_new_tokens or as max_tokens, not both")
        budget = kwargs["max_tokens"]
        if isinstance(budget, bool) or not isinstance(budget, int):
            raise TypeError(f"{OWNER}: max_tokens (the answer budget, as max_new_tokens) must be an int, got "
                            f"{type(budget).__name__} {budget!r}")
        gen["max_new_tokens"] = budget
    gen.update(llm.generate_kwargs)
    return gen
