"""Generation: pass 2 and decoding, behind one seam.

A :class:`Generator` takes a prepared call and a :class:`~qgpm.decoding.Decoding` and returns
the new text (:class:`Generated`), whole or as a stream of pieces. :class:`TransformersGenerator`
runs pass 2 in this process: the prompt in slot order where the plan allows it
(:func:`pass2_inputs`), else under the call's plan installed on the model
(:func:`~qgpm.runtime.apply_plan`), starting from pass 1's prefill where that is exact
(:mod:`qgpm.prefill`). :class:`qgpm.serving.VLLMServer` runs the calls whose pass 2 is a
plain forward on a vLLM server.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from dataclasses import dataclass, field
from queue import Queue
from typing import Any, Iterator, Protocol, runtime_checkable

import torch
from transformers import LogitsProcessorList, StoppingCriteria, StoppingCriteriaList, TextIteratorStreamer

from .config import QGPMConfig
from .decoding import Decoding, SeededSampler, check_generate_extras, finish_text
from .diagnostics import FIELDS as DIAGNOSTIC_FIELDS
from .methods import METHOD_SPECS, MethodSpec, Stage
from .prefill import rewind, take_prefill, fresh_cache
from .results import PreparedCall, QGPMResult, Usage
from .rope import PositionPlan
from .layers import input_device
from .runtime import CallCancelled, apply_plan, cache_kwarg, cancelled_by

__all__ = ["build_result", "check_generate_extras", "checked_decoding", "Generated", "Generator", "PieceStream", "TransformersGenerator", "pass2_inputs", "pass2_kind", "score_prefill"]


@dataclass
class Generated:
    """The new text of one call: ``text`` (decoded, special tokens skipped, before the stop
    rules), ``token_ids`` (the new tokens), the clock (``t0`` start of pass 2, ``first`` first
    new token, ``t1`` end), ``reused`` prompt tokens taken from pass 1's prefill, and entries for
    ``result.details``."""

    text: str
    token_ids: list[int]
    t0: float
    first: float | None
    t1: float
    reused: int = 0
    details: dict[str, Any] = field(default_factory=dict)
    eos: bool | None = None  # the last new token ends the sequence (None: not known)


class PieceStream(Protocol):
    """Raw text pieces of one generation; ``generated`` is set once the iterator is exhausted,
    ``cancel()`` stops it early (the stop rules of :mod:`qgpm.streaming` call it)."""

    generated: Generated | None

    def __iter__(self) -> Iterator[str]: ...

    def cancel(self) -> None: ...


@runtime_checkable
class Generator(Protocol):
    """Where pass 2 and decoding run. ``check(spec, config)`` raises, before any work, for a
    method (``None``: plain chat) whose pass 2 this generator cannot run under ``config``;
    ``generate`` / ``stream`` run a prepared call. A generator may also have
    ``check_decoding(decoding)``, which the engine calls before any work
    (:func:`checked_decoding`) to refuse decoding extras it would not apply."""

    name: str

    def check(self, spec: MethodSpec | None, config: QGPMConfig) -> None: ...

    def generate(self, call: PreparedCall, decoding: Decoding, *, score: list[int] | None = None) -> Generated: ...

    def stream(self, call: PreparedCall, decoding: Decoding) -> PieceStream: ...


def pass2_inputs(call: PreparedCall, device: torch.device) -> tuple[torch.Tensor, Any]:
    """What pass 2 feeds the model and under which plan: the prompt in slot order with no
    plan where a ``remap="reorder"`` plan allows it (:meth:`PositionPlan.feed_order
    <qgpm.rope.PositionPlan.feed_order>`: the same computation through the model's own causal
    attention, without the ``[N, N]`` mask), the prompt with no plan where the plan changes
    nothing (:meth:`PositionPlan.is_standard <qgpm.rope.PositionPlan.is_standard>`), else the
    prompt in text order under the call's plan."""
    plan = call.plan
    if isinstance(plan, PositionPlan) and plan.is_standard():  # a call that fell back: the model's plain forward
        return call.input_ids.to(device), None
    order = plan.feed_order() if isinstance(plan, PositionPlan) else None
    if order is None:
        return call.input_ids.to(device), plan
    return call.input_ids[:, order].to(device), None


def pass2_kind(planned: PositionPlan, installed: Any) -> str:
    """How a qgpm / oracle call's pass 2 ran (``result.details["pass2"]``): ``"standard"`` (a
    plan that changes nothing, e.g. a call that fell back: the plain forward), ``"slot
    order"`` (a reorder fed as a plain forward), ``"masks"`` (a reorder through per-layer
    causal masks) or ``"positions"`` (a stride / move plan: remapped rotary tables)."""
    if planned.is_standard():
        return "standard"
    if installed is None:
        return "slot order"
    return "masks" if planned.orders else "positions"


def score_prefill(model: torch.nn.Module, ids: torch.Tensor, score_ids: list[int], cache: Any = None, reused: int = 0) -> tuple[float, Any]:
    """The one teacher-forced log-prob path: ``log p(score_ids | ids)`` summed over the score
    tokens, from one forward over prompt + score that fills a fresh KV cache (or, with
    ``cache`` holding the first ``reused`` prompt tokens, over the rest of them).

    Returns ``(logprob, cache)``; run it inside ``apply_plan`` and inference mode. Only the
    last prompt row and the score rows get logits (no N x vocab tensor).
    """
    if cache is None:
        cache, reused = fresh_cache(model), 0
    full = torch.cat([ids, torch.tensor([score_ids], device=ids.device)], dim=1)
    keep = len(score_ids) + 1
    logits = model(input_ids=full[:, reused:], use_cache=True, logits_to_keep=keep, **{cache_kwarg(model.forward): cache}).logits[0, -keep:]
    logp = torch.log_softmax(logits[:-1].float(), dim=-1)
    return float(logp.gather(1, torch.tensor(score_ids, device=logp.device).unsqueeze(1)).sum()), cache


def build_result(call: PreparedCall, out: Generated, decoding: Decoding) -> QGPMResult:
    """The result of running ``call``: the answer text finished by ``decoding``'s stop rules, and
    its own copies of the timings, details and relevance list.

    With prompt tokens reused from pass 1's continued prefill, that part of the prefill
    (run at the end of pass 1) counts in ``prefill_s``."""
    text, reason = finish_text(out.text, len(out.token_ids), decoding, out.eos)
    first = out.first if out.first is not None else out.t1
    pre = call.timings
    ahead = call.prefill.seconds if out.reused and call.prefill is not None else 0.0
    tm = dataclasses.replace(pre, prefill_s=ahead + first - out.t0, decode_s=out.t1 - first,
                             total_s=pre.edit_s + pre.pass1_s + pre.plan_s + ahead + (out.t1 - out.t0))
    details = call.details.copy()
    spec = METHOD_SPECS.get(call.method)  # None: a plain chat call
    if spec is not None and spec.stage is Stage.HEADS:
        details.prefill_reused, details.prefill_continued_s = out.reused, ahead
    for key, value in out.details.items():  # the generator's facts: fields of Diagnostics, checked
        if key not in DIAGNOSTIC_FIELDS:
            raise KeyError(f"generator {type(out).__name__} reported {key!r}, which is not a Diagnostics field")
        setattr(details, key, value)
    return QGPMResult(
        text=text, method=call.method, relevance=list(call.relevance),
        usage=Usage(call.num_tokens, len(out.token_ids)), timings=tm, finish_reason=reason, edit=call.edit, details=details,
        context=call.prompt.context_text if call.prompt is not None else None,
        question=call.prompt.question_text if call.prompt is not None else None,
        config=call.config if spec is not None and spec.config else None,
    )


class _TimingStreamer:
    """A generate() streamer that records when the first new token appears and forwards tokens."""

    def __init__(self, inner: Any = None) -> None:
        self.inner = inner
        self.first_token_at: float | None = None
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
        elif self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        if self.inner is not None:
            self.inner.put(value)

    def end(self) -> None:
        if self.inner is not None:
            self.inner.end()


def checked_decoding(generator: Any, decoding: Decoding) -> Decoding:
    """``decoding`` once ``generator`` has checked its extras (a generator without
    ``check_decoding`` checks them when it runs)."""
    check = getattr(generator, "check_decoding", None)
    if check is not None:
        check(decoding)
    return decoding


class TransformersGenerator:
    """Pass 2 and decoding with transformers' ``generate()`` on the engine's own model."""

    name = "transformers"

    def __init__(self, model: torch.nn.Module, tokenizer: Any) -> None:
        self.model = model
        self.tokenizer = tokenizer

    @property
    def device(self) -> torch.device:
        return input_device(self.model)

    def check(self, spec: MethodSpec | None, config: QGPMConfig) -> None:
        """Every method runs here."""

    def check_decoding(self, decoding: Decoding) -> None:
        """Raise, before any work, for ``generate()`` extras this generator would not apply."""
        check_generate_extras(decoding.extra)

    def require(self, what: str) -> None:
        """Everything runs here (:class:`qgpm.partial.NoLocalGenerator` refuses instead)."""

    def generate_kwargs(self, input_ids: torch.Tensor, decoding: Decoding) -> dict[str, Any]:
        """``generate()``'s arguments for ``decoding`` (greedy; sampling through :class:`SeededSampler`)."""
        extra = dict(decoding.extra)
        gen: dict[str, Any] = dict(max_new_tokens=decoding.max_new_tokens, attention_mask=torch.ones_like(input_ids).to(self.device))
        # generate() itself decodes greedily; sampling is done by SeededSampler with a
        # generator local to the call, so concurrent calls never share torch's global RNG
        gen.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if decoding.temperature > 0:
            sampler = SeededSampler(decoding.temperature, decoding.top_p, decoding.seed, top_k=extra.pop("top_k", None), min_p=extra.pop("min_p", None))
            gen["logits_processor"] = LogitsProcessorList([*(extra.pop("logits_processor", None) or []), sampler])
        if decoding.stop:
            gen.update(stop_strings=list(decoding.stop), tokenizer=self.tokenizer)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        gen["pad_token_id"] = pad
        gen.update(extra)
        return gen

    @contextlib.contextmanager
    def pass2(self, call: PreparedCall) -> Iterator[tuple[torch.Tensor, Any, Any, int]]:
        """The one pass-2 setting: ``(ids, installed plan, reused cache, reused tokens)`` with the
        plan installed on the model (:func:`pass2_inputs`, :func:`~qgpm.runtime.apply_plan`) and
        pass 1's prefill cut back to what can be reused (:func:`~qgpm.prefill.take_prefill`)."""
        ids, plan = pass2_inputs(call, self.device)
        with apply_plan(self.model, plan), torch.inference_mode():
            cache, reused = take_prefill(call.prefill, call.plan, call.num_tokens, plan)
            yield ids, plan, cache, reused

    def generate(self, call: PreparedCall, decoding: Decoding, *, score: list[int] | None = None) -> Generated:
        """Generate ``call``'s answer; ``score``: token ids whose teacher-forced log-probability is
        computed in the same prefill (``details["score_logprob"]``, ``"score_tokens"``, ``"score_s"``)."""
        streamer = _TimingStreamer()
        gen = self.generate_kwargs(call.input_ids, decoding)
        details: dict[str, Any] = {}
        key = cache_kwarg(self.model.forward)  # generate takes the name forward takes
        t0 = time.perf_counter()
        with self.pass2(call) as (ids, plan, reused_cache, reused):
            if score is not None:
                details["score_logprob"], cache = score_prefill(self.model, ids, score, reused_cache, reused)
                details["score_tokens"] = len(score)
                details["score_s"] = time.perf_counter() - t0
                if rewind(cache, len(score) + 1):  # back to the prompt minus its last token, which generation recomputes
                    gen[key] = cache
            elif reused_cache is not None:
                gen[key] = reused_cache  # generation prefills only the tokens after the reused ones
            out = self.model.generate(ids, streamer=streamer, **gen)
        t1 = time.perf_counter()
        new = out[0, call.num_tokens :].tolist()
        if isinstance(call.plan, PositionPlan):
            details["pass2"] = pass2_kind(call.plan, plan)
        return Generated(self._decode(new), new, t0, streamer.first_token_at, t1, reused, details, eos=self._ends(new, decoding))

    def _ends(self, new: list[int], decoding: Decoding) -> bool:
        """Whether ``new`` ends with an end-of-sequence token (the call's ``eos_token_id``, else the model's)."""
        eos = decoding.extra.get("eos_token_id", getattr(self.model.generation_config, "eos_token_id", None))
        ids = set(torch.as_tensor(eos).flatten().tolist()) if eos is not None else set()
        return bool(new) and new[-1] in ids

    def logprob(self, call: PreparedCall, score: list[int]) -> float:
        """``log p(score | prompt)`` under the call's positions (no generation)."""
        with self.pass2(call) as (ids, _, cache, reused):
            value, _ = score_prefill(self.model, ids, score, cache, reused)
        return value

    def stream(self, call: PreparedCall, decoding: Decoding) -> "_ThreadStream":
        return _ThreadStream(self, call, decoding)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


class _ThreadStream:
    """``generate()`` in a worker thread, its text through transformers' ``TextIteratorStreamer``."""

    def __init__(self, gen: TransformersGenerator, call: PreparedCall, decoding: Decoding) -> None:
        self.gen, self.call, self.decoding = gen, call, decoding
        self.generated: Generated | None = None
        self._cancel = threading.Event()

    def cancel(self) -> None:
        self._cancel.set()

    def __iter__(self) -> Iterator[str]:
        g, call, cancel = self.gen, self.call, self._cancel
        kw = g.generate_kwargs(call.input_ids, self.decoding)
        text_streamer = TextIteratorStreamer(g.tokenizer, skip_prompt=True, skip_special_tokens=True, timeout=None)
        timing = _TimingStreamer(text_streamer)

        class _Cancel(StoppingCriteria):
            def __call__(self, input_ids, scores, **kwargs):
                return torch.full((input_ids.shape[0],), cancel.is_set(), dtype=torch.bool, device=input_ids.device)

        crit = StoppingCriteriaList([*(kw.pop("stopping_criteria", None) or ()), _Cancel()])  # a new list: the caller's stays as it was
        errors: Queue = Queue()
        held: dict[str, Any] = {}

        def work() -> None:
            try:
                with cancelled_by(cancel.is_set), g.pass2(call) as (ids, plan, cache, held["reused"]):
                    if cache is not None:
                        kw[cache_kwarg(g.model.forward)] = cache
                    held["ids"] = g.model.generate(ids, streamer=timing, stopping_criteria=crit, **kw)
                held["plan"] = plan
            except CallCancelled:  # cancelled while it waited for the model: no prefill, no answer
                text_streamer.end()
            except BaseException as exc:  # re-raised in the consumer
                errors.put(exc)
                text_streamer.end()

        t0 = time.perf_counter()
        worker = threading.Thread(target=work, name="qgpm-generate", daemon=True)
        try:
            worker.start()
            yield from text_streamer
            worker.join()
            if not errors.empty():
                raise errors.get()
            if "ids" not in held:  # cancelled before its turn on the model: generated stays None
                return
            t1 = time.perf_counter()
            new = held["ids"][0, call.num_tokens :].tolist()
            details = {"pass2": pass2_kind(call.plan, held["plan"])} if isinstance(call.plan, PositionPlan) else {}
            self.generated = Generated(g._decode(new), new, t0, timing.first_token_at, t1, held.get("reused", 0), details,
                                       eos=g._ends(new, self.decoding))
        finally:
            cancel.set()
            if worker.ident is not None:
                worker.join()
