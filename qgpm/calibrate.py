"""Head calibration (paper App. A): score every (layer, head) by the mean reciprocal rank
of the evidence sentence under that head's own sentence signal, keep the best.

Samples are anything with ``context``, ``question`` and ``evidence`` (exact substrings of
the context), plus optional ``instruction``/``answer_prefix``/``template`` attributes: the
same prompts and query rows as at inference. The caller provides them; ``qgpm
calibrate`` and ``QGPM.from_pretrained(..., heads="calibrate")`` use the synthetic
calibration split of the core package :mod:`qgpm.samples`
(:func:`qgpm.samples.calibration_samples`), whose seeds and needle keys are disjoint from
every evaluation split. This module imports neither :mod:`qgpm.samples` nor :mod:`qgpm.eval`.
"""

from __future__ import annotations

import datetime as _dt
import logging
import random
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from tqdm.auto import tqdm

from .heads import HeadSet, reciprocal_rank
from .prompt import DEFAULT_TEMPLATE, Prompt, PromptSpec, build_prompt
from .pass1 import sentence_heads_logits
from .rerank import get_reranker
from .shaping import fuse_heads
from .sources import HEADS, parse_source, reranker_relevance

logger = logging.getLogger("qgpm")

__all__ = ["HeadScores", "score_heads", "calibrate_heads", "check_lengths", "fitting_lengths", "confidence_summary", "weak_threshold", "flat_relevance_threshold", "separating_cut", "check_depth_options", "fused_mrr", "sample_head_logits", "evidence_sentences"]


@dataclass
class HeadScores:
    """Per-head MRR over calibration samples: ``mrr[layer, head]``."""

    mrr: torch.Tensor
    samples: int

    def best(self, top: int, *, max_layer: int | None = None) -> list[tuple[int, int]]:
        """The ``top`` heads by MRR, best first; only layers ``< max_layer`` when it is given."""
        mrr = self.mrr
        if max_layer is not None:
            if not 1 <= max_layer <= mrr.shape[0]:
                raise ValueError(f"max_layer must be in 1..{mrr.shape[0]} (the model's layers), got {max_layer}")
            mrr = mrr[:max_layer]
        flat = mrr.flatten()
        if top > flat.numel():
            logger.warning("qgpm: top=%d asks for more heads than the %d there are%s; keeping all %d", top, flat.numel(),
                           "" if max_layer is None else f" below layer {max_layer}", flat.numel())
        order = torch.argsort(flat, descending=True, stable=True)[:top]
        n_heads = mrr.shape[1]
        return [(int(i) // n_heads, int(i) % n_heads) for i in order]

    @classmethod
    def from_head_set(cls, head_set: HeadSet) -> "HeadScores":
        """The per-head MRRs stored by :func:`calibrate_heads` in ``head_set.meta["per_head_mrr"]``."""
        grid = head_set.meta.get("per_head_mrr")
        if not grid:
            raise ValueError(f"the head set of {head_set.model!r} stores no per-head MRRs (meta['per_head_mrr']): "
                             "it was not made by calibrate_heads; calibrate the model instead")
        return cls(torch.tensor(grid, dtype=torch.float32), int(head_set.samples))


def evidence_sentences(prompt: Prompt, evidence: Sequence[str]) -> list[int]:
    """Indices of the context sentences that overlap any evidence substring."""
    gold: set[int] = set()
    for ev in evidence:
        ev = ev.strip()
        start = prompt.context_text.find(ev)
        if start < 0:
            raise ValueError(f"evidence {ev[:60]!r} is not in the context")
        end = start + len(ev)
        for s in prompt.sentences:
            if s.start < end and s.end > start and prompt.context_text[max(s.start, start) : min(s.end, end)].strip():
                gold.add(s.index)
    return sorted(gold)


def _sample_prompt(engine, sample: Any) -> Prompt:
    spec = PromptSpec(
        context=sample.context,
        question=sample.question,
        instruction=getattr(sample, "instruction", None),
        answer_prefix=getattr(sample, "answer_prefix", None),
        template=getattr(sample, "template", None) or DEFAULT_TEMPLATE,
    )
    return build_prompt(engine.tokenizer, spec, max_sentence_chars=engine.config.max_sentence_chars, query_tail=engine.config.query_tail,
                        split_run_ons=engine.config.split_run_ons)


def _all_sentence_logits(engine, prompt: Prompt, heads: list[tuple[int, int]]) -> torch.Tensor:
    return sentence_heads_logits(engine.model, prompt, heads, exclude_newline_tokens=engine.config.exclude_newline_tokens)


def score_heads(engine, samples: Sequence[Any], *, progress: bool = True) -> HeadScores:
    """MRR of the evidence sentence for every (layer, head), ties at expected rank."""
    cfg = engine.model.config
    n_layers, n_heads = engine.n_layers, cfg.num_attention_heads
    heads = [(l, h) for l in range(n_layers) for h in range(n_heads)]
    total = torch.zeros(n_layers * n_heads, dtype=torch.float64)
    it = samples
    if progress:
        it = tqdm(samples, desc="calibrating heads", unit="sample")
    for sample in it:
        prompt = _sample_prompt(engine, sample)
        gold = evidence_sentences(prompt, sample.evidence)
        sl = _all_sentence_logits(engine, prompt, heads)
        for i in range(len(heads)):
            total[i] += reciprocal_rank(sl[i], gold)
    return HeadScores((total / max(len(samples), 1)).reshape(n_layers, n_heads).float(), len(samples))


def sample_head_logits(engine, samples: Sequence[Any], heads: Sequence[tuple[int, int]]) -> list[tuple[torch.Tensor, list[int]]]:
    """For each sample: sentence logits ``[len(heads), sentences]`` and the gold sentences."""
    out = []
    for sample in samples:
        prompt = _sample_prompt(engine, sample)
        out.append((_all_sentence_logits(engine, prompt, list(heads)), evidence_sentences(prompt, sample.evidence)))
    return out


def fused_mrr(per_sample: Sequence[tuple[torch.Tensor, list[int]]], rows: Sequence[int]) -> float:
    """MRR of the gold sentence under the fused z-score (Eq. 5) of the head ``rows``."""
    rr = [reciprocal_rank(fuse_heads(sl[list(rows)]), gold) for sl, gold in per_sample]
    return sum(rr) / max(len(rr), 1)


def check_depth_options(max_layer: int | None, shallow_tolerance: float | None, *, has_holdout: bool,
                        n_layers: int | None = None, shallow_bound: int | None = None) -> None:
    """Reject bad ``max_layer`` / ``shallow_tolerance`` / ``shallow_bound`` settings of
    :func:`calibrate_heads` (callable before the model loads: ``n_layers=None`` skips the
    upper bounds)."""
    if shallow_bound is not None:
        if shallow_tolerance is None:
            raise ValueError("shallow_bound is the layer bound of the shallow set that shallow_tolerance compares: give shallow_tolerance too")
        if shallow_bound < 1 or (n_layers is not None and shallow_bound > n_layers):
            raise ValueError(f"shallow_bound must be >= 1{f' and <= {n_layers} (the model layers)' if n_layers else ''}, got {shallow_bound}")
    if shallow_tolerance is not None:
        if not has_holdout:
            raise ValueError("shallow_tolerance compares held-out fused MRRs: pass holdout samples too (--holdout > 0)")
        if max_layer is not None:
            raise ValueError("give max_layer (a fixed depth bound) or shallow_tolerance (choose by held-out MRR), not both")
        if not 0 <= shallow_tolerance <= 1:
            raise ValueError(f"shallow_tolerance is an MRR difference in [0, 1], got {shallow_tolerance}")
    if max_layer is not None and (max_layer < 1 or (n_layers is not None and max_layer > n_layers)):
        raise ValueError(f"max_layer must be >= 1{f' and <= {n_layers} (the model layers)' if n_layers else ''}, got {max_layer}")


def fitting_lengths(lengths: Sequence[int], window: int) -> list[int]:
    """The calibration sample lengths of ``lengths`` a model with this ``window`` (tokens; 0:
    unknown) can read, or ``[window]`` when none can; a shorter list than ``lengths`` is logged
    as a warning."""
    fit = ([L for L in lengths if L <= window] or [window]) if window else list(lengths)
    if fit != list(lengths):
        logger.warning("qgpm: calibration samples of %s tokens (not %s): the model's window is %d tokens", fit, list(lengths), window)
    return fit


def check_lengths(engine: Any, lengths: Sequence[int]) -> None:
    """Refuse sample lengths (token budgets) longer than the engine's window, before any sample
    is scored: heads chosen on positions the model never covers would be chosen on noise."""
    window = engine.max_length
    long = sorted({int(L) for L in lengths if window and L > window})
    if long:
        raise ValueError(f"calibration samples of {long} tokens do not fit {engine.name}'s window of {window} tokens: "
                         f"give lengths up to {window} (qgpm calibrate --lengths)")


def calibrate_heads(
    engine,
    samples: Sequence[Any],
    *,
    top: int = 8,
    holdout: Sequence[Any] | None = None,
    random_draws: int = 20,
    seed: int = 0,
    progress: bool = True,
    max_layer: int | None = None,
    shallow_tolerance: float | None = None,
    shallow_bound: int | None = None,
    scores: HeadScores | None = None,
) -> HeadSet:
    """Select the ``top`` heads by calibration MRR; report held-out fused MRR vs random heads.

    ``samples``: the calibration samples (see the module docs), e.g.
    ``qgpm.samples.calibration_samples(engine.tokenizer)``. ``holdout`` samples
    (default: none) measure the chosen set's fused MRR next to the mean fused MRR of
    ``random_draws`` random head sets of the same size.

    Depth against MRR: pass 1 runs the model only up to the deepest selected head's layer,
    so a shallower set makes QGPM's extra prefill cheaper. ``max_layer`` keeps only heads
    in layers ``< max_layer``. ``shallow_tolerance`` (needs ``holdout``) compares the best
    set in layers ``< shallow_bound`` (default ``n_layers // 2``, the lower half) with the
    best unrestricted set on the held-out samples and keeps the shallow one when its fused
    MRR is at most ``shallow_tolerance`` below; both sets and MRRs are recorded in
    ``meta["shallow"]``.

    ``scores``: per-head MRRs of an earlier calibration of the same model (e.g.
    ``HeadScores.from_head_set(HeadSet.load(path))``) instead of scoring samples again;
    ``samples`` must then be empty. The held-out check still runs the model.
    """
    engine.require_supported()  # the heads are read through the rotary patch
    check_lengths(engine, [s.length for s in [*samples, *(holdout or [])] if isinstance(getattr(s, "length", None), int)])
    check_depth_options(max_layer, shallow_tolerance, has_holdout=bool(holdout), n_layers=engine.n_layers,
                        shallow_bound=shallow_bound)
    n_heads = engine.model.config.num_attention_heads
    if scores is None:
        if not samples:
            raise ValueError("calibration needs at least one sample (or the per-head scores of an earlier calibration)")
        scores = score_heads(engine, samples, progress=progress)
    elif samples:
        raise ValueError(f"{len(samples)} calibration samples given with stored per-head scores: the scores would be used and "
                         "the samples not scored; pass one of them (samples=[] with scores)")
    elif tuple(scores.mrr.shape) != (engine.n_layers, n_heads):
        raise ValueError(f"the given per-head scores are {tuple(scores.mrr.shape)} (layers, heads) but this model has "
                         f"({engine.n_layers}, {n_heads}): they come from another model")
    chosen = scores.best(top, max_layer=max_layer)
    meta: dict[str, Any] = {
        "median_head_mrr": float(scores.mrr.flatten().median()),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "per_head_mrr": [[round(float(x), 4) for x in row] for row in scores.mrr],
    }
    if max_layer is not None:
        meta["max_layer"] = max_layer
    random_mrr = None
    if holdout:
        rng = random.Random(seed)
        every = [(l, h) for l in range(engine.n_layers) for h in range(n_heads)]
        per_sample = sample_head_logits(engine, holdout, every)
        meta["holdout_samples"] = len(holdout)
        meta["holdout_fused_mrr"] = fused_mrr(per_sample, [every.index(h) for h in chosen])
        if shallow_tolerance is not None:
            bound = shallow_bound if shallow_bound is not None else engine.n_layers // 2
            shallow = scores.best(top, max_layer=bound)
            shallow_mrr = fused_mrr(per_sample, [every.index(h) for h in shallow])
            keep = shallow_mrr >= meta["holdout_fused_mrr"] - shallow_tolerance
            meta["shallow"] = {
                "max_layer": bound,
                "tolerance": shallow_tolerance,
                "unrestricted_heads": [list(h) for h in chosen],
                "unrestricted_holdout_fused_mrr": meta["holdout_fused_mrr"],
                "shallow_heads": [list(h) for h in shallow],
                "shallow_holdout_fused_mrr": shallow_mrr,
                "kept": "shallow" if keep else "unrestricted",
            }
            if keep:
                chosen = shallow
                meta["holdout_fused_mrr"] = shallow_mrr
        draws = [fused_mrr(per_sample, rng.sample(range(len(every)), top)) for _ in range(random_draws)]
        random_mrr = sum(draws) / len(draws)
        meta["random_draws"] = random_draws
        if meta["holdout_fused_mrr"] < random_mrr:
            logger.warning("qgpm: the chosen heads find the evidence worse than random %d-head sets on the %d held-out samples "
                           "(fused MRR %.3f against %.3f): this model's heads carry little retrieval signal on these samples. "
                           "Calibrate on more samples (n, holdout), or rank with a reranker (relevance='minilm', the recipe's) "
                           "instead of the heads", top, len(holdout), meta["holdout_fused_mrr"], random_mrr)
    # the flat-relevance threshold in this model's z units, from every sample whose evidence is known
    meta["confidence"] = flat_relevance_threshold(engine, [*samples, *(holdout or [])], chosen)
    if weak_threshold(meta["confidence"]):
        logger.warning("qgpm: %s", confidence_summary(meta["confidence"]))
    mrr = [float(scores.mrr[l, h]) for l, h in chosen]
    return HeadSet(
        model=engine.name,
        heads=chosen,
        mrr=mrr,
        random_mrr=random_mrr,
        method=f"App. A MRR calibration over all {engine.n_layers}x{engine.model.config.num_attention_heads} heads, top {top}"
        + (f", layers < {max_layer}" if max_layer is not None else "")
        + (f", shallow set (layers < {meta['shallow']['max_layer']}) kept within {shallow_tolerance} held-out MRR" if meta.get("shallow", {}).get("kept") == "shallow" else ""),
        samples=scores.samples,
        meta=meta,
        fingerprint=fp.to_dict() if (fp := getattr(engine, "fingerprint", None)) is not None else {},
    )


def flat_relevance_threshold(engine, samples: Sequence[Any], heads: Sequence[tuple[int, int]] | None = None, *,
                             relevance: str = HEADS) -> dict[str, Any]:
    """The confidence rule's threshold (``QGPMConfig.min_top_z``) on a relevance source's z scale.

    For each sample: the relevance ``z`` of every sentence (``relevance="heads"``: the fused z of
    Eq. 5 over ``heads``, in this model's own units; a reranker spec such as ``"minilm"``: the
    reranker's standardized scores, the same for every model), its top value, and whether the
    top sentence holds the evidence. The threshold is the cut on the top z that best separates
    the samples whose evidence was ranked first from those whose evidence was missed (the
    largest share found above plus share missed below, Youden's J; the midpoint between the two
    top z values it falls between). A call whose top z is below it is one the source is as
    unsure of as the misses, so it keeps vanilla positions. Returns the threshold (``None`` when
    every sample's evidence was ranked first or none was: no cut separates anything) with the
    top z values behind it, for the head set's ``meta`` or the reranker's stored calibration.
    """
    source = parse_source(relevance)
    if source.heads and source.reranker is not None:
        raise ValueError(f"relevance {relevance!r}: a threshold is calibrated for one source, 'heads' or a reranker, not a fusion")
    if source.heads and not heads:
        raise ValueError("relevance='heads' needs the heads to calibrate the threshold for")
    reranker = get_reranker(source.reranker) if source.reranker is not None else None
    found: list[float] = []
    missed: list[float] = []
    for sample in samples:
        prompt = _sample_prompt(engine, sample)
        if reranker is None:
            z = fuse_heads(_all_sentence_logits(engine, prompt, list(heads)))
        else:
            z = reranker_relevance(reranker, prompt.question_text or sample.question, [s.text for s in prompt.sentences])
        gold = set(evidence_sentences(prompt, sample.evidence))
        (found if int(torch.argmax(z)) in gold else missed).append(float(z.max()))
    out: dict[str, Any] = {"min_top_z": None, "relevance": source.spec, "samples": len(found) + len(missed),
                           "found_top_z": sorted(round(v, 3) for v in found), "missed_top_z": sorted(round(v, 3) for v in missed)}
    cut = separating_cut(found, missed)
    if cut is not None:
        out.update(min_top_z=round(cut[0], 3), youden_j=round(cut[1], 3))
    return out


WEAK_J, WEAK_COUNT = 0.5, 3
"""A stored threshold is called weak below this Youden J, or with fewer samples than this on
either side of it (evidence ranked first / missed)."""


def weak_threshold(confidence: dict[str, Any]) -> bool:
    """Whether the threshold of :func:`flat_relevance_threshold`'s record separates little or rests
    on few samples (:data:`WEAK_J`, :data:`WEAK_COUNT`)."""
    found, missed = confidence.get("found_top_z") or [], confidence.get("missed_top_z") or []
    return confidence.get("min_top_z") is not None and (
        (confidence.get("youden_j") or 0.0) < WEAK_J or min(len(found), len(missed)) < WEAK_COUNT)


def confidence_summary(confidence: dict[str, Any], *, advice: bool = True) -> str:
    """One sentence on the stored flat-relevance threshold: its value and what it rests on, or why
    there is none, and (with ``advice``) what to do when it is weak."""
    found, missed = confidence.get("found_top_z") or [], confidence.get("missed_top_z") or []
    n = len(found) + len(missed)
    counts = f"{len(found)} of {n} scored samples had their evidence ranked first"
    if confidence.get("min_top_z") is None:
        if n == 0:
            why = "no sample with known evidence was scored (give --holdout N, or samples)"
        elif not found:
            why = f"the ranking put no sample's evidence first ({counts}): nothing to separate"
        else:
            why = f"the ranking put every sample's evidence first ({counts}): nothing to separate"
        return (f"confidence threshold: none stored, {why}; calls with min_top_z='calibrated' then keep the flat-relevance "
                "rule off, with a warning")
    text = f"confidence threshold (min_top_z='calibrated'): {confidence['min_top_z']} in this model's z units, Youden J {confidence.get('youden_j')}; {counts}"
    if weak_threshold(confidence) and not advice:
        text += " (weak: see the warning above)"
    elif weak_threshold(confidence):
        text += (f". A weak separation (J below {WEAK_J}, or fewer than {WEAK_COUNT} samples on a side): the rule may keep many calls at "
                 "vanilla positions; calibrate on more samples (--n, --holdout) or set min_top_z yourself")
    return text


def separating_cut(found: Sequence[float], missed: Sequence[float]) -> tuple[float, float] | None:
    """The cut ``t`` that best separates ``found`` (should be ``>= t``) from ``missed`` (``< t``):
    the largest Youden's J = share of ``found`` at or above + share of ``missed`` below - 1, at the
    midpoint between two neighbouring values (the lowest such cut on ties). ``(t, J)``, or ``None``
    when either list is empty."""
    if not found or not missed:
        return None
    values = sorted(set(found) | set(missed))
    best: tuple[float, float] | None = None
    for lo, hi in zip(values, values[1:]):
        t = (lo + hi) / 2
        j = sum(v >= t for v in found) / len(found) + sum(v < t for v in missed) / len(missed) - 1
        if best is None or j > best[1]:
            best = (t, j)
    return best
