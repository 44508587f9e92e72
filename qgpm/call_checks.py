"""A call's arguments, checked before any model work: :class:`CallOptions` and the checks the engine runs on them.

:func:`check_call` runs them in order, cheapest first, so that input too large for the window
is refused before a reranker is loaded.
:func:`check_config` refuses a config the model cannot run (layers, local layers, the relevance
source, the term filter's BM25, reorder masks); :func:`check_method_args` refuses arguments the
call's method does not read (``evidence=``, ``k=``, ``reranker=``); :func:`check_replan` refuses
what :meth:`QGPM.replan <qgpm.QGPM.replan>` cannot do. Each raises with what was wrong and what
to do, before pass 1 or the prompt is built.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, Sequence

from .baselines import resolve_options
from .config import QGPMConfig
from .decoding import did_you_mean
from .defaults import ANSWER_ARGUMENTS, PASS1_FIELDS
from .generation import Generator
from .editing import check_k
from .hooks import reorder_mask_kind, sliding_window_of
from .lexical import require_bm25
from .limits import check_fits, check_input_size
from .methods import METHOD_SPECS, Method, MethodSpec, Stage, method_spec
from .partial import check_heads_fit
from .plan import REORDER_LAYERED_ERROR, check_local_layers, reorder_needs_masks
from .prompt import DEFAULT_TEMPLATE, PromptSpec, check_prompt_inputs, check_prompt_settings, check_template, count_prompt_tokens, normalize_spec
from .rerank import check_reranker_spec, get_reranker
from .results import PreparedCall
from .sources import parse_source

if TYPE_CHECKING:
    from .preparing import ModelView

__all__ = ["CallOptions", "CheckedSetting", "check_call", "check_config", "check_edit_args", "check_engine_args", "check_engine_config",
           "check_evidence", "check_method_args", "check_options", "check_prompt_fits", "check_replan", "check_reuse_prefill"]


@dataclass(frozen=True)
class CallOptions:
    """How to prepare one call: the arguments of :meth:`QGPM.prepare` besides context and question.

    :meth:`QGPM.answer`, :meth:`QGPM.prepare` and :meth:`QGPM.stream` take these as keyword
    arguments (see :meth:`QGPM.answer` for each); the engine carries them as one object.
    ``max_new_tokens`` is the generation budget the prompt must leave room for. Values are
    stored as given and checked when the call is prepared.
    """

    method: Method = "qgpm"
    evidence: Sequence[str] | None = None
    system: str | None = None
    instruction: str | None = None
    answer_prefix: str | None = None
    template: str = DEFAULT_TEMPLATE
    reranker: Any = None
    k: int | None = None  # None: DEFAULT_K
    config: QGPMConfig | None = None
    max_new_tokens: int = 0
    options: Any = None

    @classmethod
    def take(cls, kwargs: dict[str, Any], **defaults: Any) -> "CallOptions":
        """Pop this class's fields out of ``kwargs`` (the rest stays there).

        ``defaults`` replace the class defaults for fields ``kwargs`` does not hold.
        """
        values = dict(defaults)
        for f in dataclasses.fields(cls):
            if f.name in kwargs:
                values[f.name] = kwargs.pop(f.name)
        return cls(**values)

    @classmethod
    def take_all(cls, kwargs: dict[str, Any]) -> "CallOptions":
        """:meth:`take`, refusing what is left (``TypeError``): decoding settings, which belong to
        generation, said as such, and a misspelt field named with the closest one."""
        opts = cls.take(kwargs)
        if kwargs:
            decoding = sorted(set(kwargs) & set(ANSWER_ARGUMENTS))  # temperature, seed, ...: generation's
            raise TypeError(f"unexpected arguments: {sorted(kwargs)}" + (f" ({', '.join(decoding)}: give them to generate_prepared())" if decoding else "")
                            + did_you_mean(sorted(set(kwargs) - set(decoding)), [f.name for f in dataclasses.fields(cls)]))
        return opts


def check_config(eng: ModelView, cfg: Any, spec: MethodSpec) -> QGPMConfig:
    """``cfg`` checked against the engine's model before any model work: what pass 1, the plan
    and the patching would refuse later (split layer, layer counts, local layers, the relevance
    source and its reranker, the term filter's BM25, a reorder that needs per-layer masks)."""
    if not isinstance(cfg, QGPMConfig):
        raise TypeError(f"config must be a qgpm.QGPMConfig, got {type(cfg).__name__}")
    if not spec.config or eng.rotary is None:
        return cfg
    n = eng.n_layers
    if cfg.split_layer is not None and cfg.split_layer > n:
        raise ValueError(f"config.split_layer={cfg.split_layer} is beyond this model's {n} layers (use 0..{n}, or None for {n // 2})")
    if cfg.unmodulated_layers > n:
        raise ValueError(f"config.unmodulated_layers={cfg.unmodulated_layers} exceeds this model's {n} layers")
    check_local_layers(cfg, eng.rotary)
    if cfg.remap == "reorder" and reorder_needs_masks(cfg, n):  # two maps or vanilla layers: per-layer masks (sdpa / eager)
        if eng.rotary.layered:
            raise ValueError(REORDER_LAYERED_ERROR)
        window = sliding_window_of(eng.model)
        if window is not None:
            raise ValueError(
                f"remap='reorder' with two maps or unmodulated layers sets each layer's causal mask, but this model's "
                f"layers attend within a sliding window of {window} tokens, which that mask would drop: use one map on "
                "every layer (split_layer=0, unmodulated_layers=0; the prompt then runs in slot order through the "
                "model's own attention), or remap='stride'"
            )
        reorder_mask_kind(eng.model)
    if spec.stage is Stage.HEADS:  # last: a reranker loads here (MiniLM: about 2 s), after the cheap refusals
        source = parse_source(cfg.relevance)
        if source.heads:  # no head set: the engine's own error, with what to do; heads in layers not loaded: named
            check_heads_fit(eng.heads, eng.model, loaded=True)
        if source.reranker is not None:  # an unknown spec or a missing package fails here, before any model work
            get_reranker(source.reranker)
        if cfg.term_ratio is not None:  # the query-term filter's BM25, before pass 1
            require_bm25("QGPMConfig.term_ratio (the query-term filter)")
    return cfg


def check_evidence(evidence: Any, spec: MethodSpec | None = None) -> list[str] | None:
    """Oracle evidence as a list of strings; a single string is one evidence item. With the
    call's ``spec``: evidence only for a method that reads it, and required by one."""
    if spec is not None:
        if evidence is not None and not spec.evidence:
            raise ValueError("evidence= is only used by method='oracle'")
        if spec.evidence and not evidence:
            raise ValueError(f"method={spec.name!r} needs evidence=[exact substrings of the context]")
    if evidence is None:
        return None
    if isinstance(evidence, str):
        return [evidence]
    if isinstance(evidence, (bytes, Mapping)) or not hasattr(evidence, "__iter__"):
        raise TypeError(f"evidence must be a string or a list of strings (exact substrings of the context), got {type(evidence).__name__}")
    items = list(evidence)
    for i, ev in enumerate(items):
        if not isinstance(ev, str):
            raise TypeError(f"evidence item {i} is {type(ev).__name__}, expected str (an exact substring of the context)")
    return items


def check_edit_args(spec: MethodSpec, *, reranker: Any = None, k: Any = None) -> None:
    """Refuse ``reranker=`` (given: not ``None``) for a method that edits the context with no
    reranker, ``k=`` for one that does not keep the best ``k`` chunks (only ``topk`` does), and a
    ``k`` that is not an int >= 1 (:func:`~qgpm.editing.check_k`) or a reranker spec
    :func:`~qgpm.rerank.get_reranker` does not know (by name: nothing loads)."""
    if k is not None and spec.takes_k:
        check_k(k)
    if reranker is not None and spec.reranker:
        check_reranker_spec(reranker)
    if k is not None and not spec.takes_k:
        raise ValueError(f"k= is how many chunks method='topk' keeps; method={spec.name!r} takes none"
                         + (" (it keeps every chunk)" if spec.reranker else ""))
    if reranker is not None and not spec.reranker:
        raise ValueError(f"reranker= sets the reranker of method='topk' / 'reorder'; method={spec.name!r} takes none"
                         + (" (it ranks sentences by config.relevance, e.g. QGPMConfig(relevance='bm25'))" if spec.stage is Stage.HEADS else ""))


def check_method_args(spec: MethodSpec, opts: CallOptions) -> list[str] | None:
    """The call's evidence (:func:`check_evidence`), once the arguments only some methods read
    are checked against ``spec`` (:func:`check_edit_args`)."""
    evidence = check_evidence(opts.evidence, spec)
    check_edit_args(spec, reranker=opts.reranker, k=opts.k)
    return evidence


def check_options(spec: MethodSpec, opts: CallOptions) -> tuple[Any, list[str] | None]:
    """The checks of a call's options that need neither its texts nor the model, which
    :func:`check_call` runs first: the method's options and arguments (:func:`check_method_args`),
    the prompt settings' types, the template, and the config's type. Returns ``(options, evidence)``."""
    options = resolve_options(spec.name, opts.options)
    evidence = check_method_args(spec, opts)
    check_prompt_settings(instruction=opts.instruction, system=opts.system, answer_prefix=opts.answer_prefix)
    check_template(opts.template)
    if opts.config is not None and not isinstance(opts.config, QGPMConfig):
        raise TypeError(f"config must be a qgpm.QGPMConfig, got {type(opts.config).__name__}")
    return options, evidence


def check_replan(call: Any, config: Any, engine_config: QGPMConfig) -> None:
    """Refuse what :meth:`QGPM.replan <qgpm.QGPM.replan>` cannot do: a call that is not a
    prepared qgpm / oracle call, or a config that changes pass 1 or the prompt."""
    if not isinstance(call, PreparedCall):
        raise TypeError(f"call must be a PreparedCall from QGPM.prepare(), got {type(call).__name__}")
    if call.method not in METHOD_SPECS or not method_spec(call.method).config or call.z is None or call.prompt is None:
        raise ValueError(f"replan needs a qgpm or oracle call from QGPM.prepare(), got method={call.method!r}")
    if not isinstance(config, QGPMConfig):
        raise TypeError(f"config must be a qgpm.QGPMConfig, got {type(config).__name__}")
    old = call.config or engine_config
    changed = [f for f in PASS1_FIELDS if getattr(old, f) != getattr(config, f)]
    if changed:
        raise ValueError(f"{', '.join(changed)} change pass 1 or the prompt: call prepare() again with config= instead of replan()")


class EngineView(Protocol):
    """What :func:`check_call` reads from the engine (:class:`qgpm.QGPM` has all of it, and all of
    :class:`~qgpm.preparing.ModelView`, which :func:`check_config` reads)."""

    tokenizer: Any
    config: QGPMConfig
    generator: Any

    @property
    def max_length(self) -> int: ...


def check_call(eng: EngineView, spec: MethodSpec, context: Any, question: Any, opts: CallOptions) -> tuple[Any, QGPMConfig, list[str] | None]:
    """A call's arguments checked before any model work, cheapest first: the method's settings
    and arguments (:func:`check_options`), the texts and their size (a bound on characters, then a bounded token count),
    then the engine's generator (what it cannot run at all comes before what this engine would
    need to run it) and the config against the model (:func:`check_config`, which loads the
    relevance source's reranker). Returns ``(options, config, evidence)``."""
    options, evidence = check_options(spec, opts)
    docs = check_prompt_inputs(context, question, instruction=opts.instruction, system=opts.system, answer_prefix=opts.answer_prefix)
    others = [question, opts.instruction or "", opts.system or "", opts.answer_prefix or ""]
    check_input_size(eng.tokenizer, eng.max_length, others, opts.max_new_tokens, context=docs, exact=not spec.shortens)
    cfg = eng.config if opts.config is None else opts.config
    if not isinstance(cfg, QGPMConfig):
        raise TypeError(f"config must be a qgpm.QGPMConfig, got {type(cfg).__name__}")
    eng.generator.check(spec, cfg)  # a generator that cannot run this method's pass 2 says so before any work
    return options, check_config(eng, cfg, spec), evidence


def check_prompt_fits(eng: EngineView, spec: MethodSpec, context: Any, question: str, opts: CallOptions) -> None:
    """The exact "prompt too long" rule (:func:`~qgpm.limits.check_fits`) on the prompt a call of
    ``spec`` builds from arguments :func:`check_call` has passed, before any model work: the whole
    prompt tokenized, template and chat markers included. A call runs the same rule once its
    prompt is built; this is for checking ahead (``check_request``, ``answer_many``). Methods that
    edit the context (Top-K, Reorder, LLMLingua-2) build their prompt only after the edit: for
    them only :func:`check_call`'s bounds on the raw text apply."""
    if spec.stage in (Stage.EDIT, Stage.COMPRESS) or not eng.max_length:
        return
    prompt = normalize_spec(PromptSpec(context=context, question=question, instruction=opts.instruction, system=opts.system,
                                       answer_prefix=opts.answer_prefix, template=opts.template))
    check_fits(eng.max_length, count_prompt_tokens(eng.tokenizer, prompt), opts.max_new_tokens)


# ----------------------------------------------------------------------------- the engine's own settings

def check_engine_config(config: Any) -> None:
    """An engine's ``config`` must be a :class:`~qgpm.QGPMConfig` (``TypeError`` otherwise)."""
    if not isinstance(config, QGPMConfig):
        raise TypeError(f"config must be a qgpm.QGPMConfig (e.g. QGPMConfig(k_sharp=3.0), or engine.config.with_(k_sharp=3.0)), "
                        f"got {type(config).__name__}")


def check_reuse_prefill(value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"reuse_prefill must be True or False, got {value!r}")


def check_engine_args(*, config: Any, reuse_prefill: Any, heads: Any = None, generator: Any = None) -> None:
    """The arguments of :class:`~qgpm.QGPM` and :meth:`~qgpm.QGPM.from_pretrained` that can be
    checked before a model loads: the config's type, ``reuse_prefill``, a head-set file that
    must exist, and the generator's type."""
    if config is not None:
        check_engine_config(config)
    check_reuse_prefill(reuse_prefill)
    if isinstance(heads, (str, os.PathLike)) and heads != "calibrate" and not Path(heads).expanduser().is_file():
        raise FileNotFoundError(f"head-set file not found: {heads} (heads= takes a head-set JSON file, a list of (layer, head), "
                                "None for the stored set, or 'calibrate')")
    if generator is not None and not isinstance(generator, Generator):
        raise TypeError(f"generator must have check(), generate() and stream() (qgpm.generation.Generator, e.g. "
                        f"qgpm.serving.VLLMServer), got {type(generator).__name__}")


class CheckedSetting:
    """An engine attribute whose every assignment is checked by ``check`` (stored as ``_<name>``)."""

    def __init__(self, check: Any) -> None:
        self.check = check

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = "_" + name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else getattr(obj, self.slot)

    def __set__(self, obj: Any, value: Any) -> None:
        self.check(value)
        setattr(obj, self.slot, value)
