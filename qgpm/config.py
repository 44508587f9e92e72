"""Hyperparameters of QGPM (paper App. C) in one object, with per-backbone presets.

Presets are keyed by the model's fingerprint key (:mod:`qgpm.fingerprint`), with the
readable name beside it in :data:`PRESET_NAMES`. The settings' groups (pass 1, shaping, the
confidence rules, the remap with its own options), their defaults and their checks are in
:mod:`qgpm.settings`; configs read from a JSON file and ``field=value`` overrides in
:mod:`qgpm.config_files`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from .defaults import DEFAULT_MODEL_NAME
from .field_checks import check_types
from .settings import (
    CALIBRATED,
    MIN_SENTENCE_CHARS,
    ConfidenceRules,
    MoveRemap,
    Pass1Settings,
    RemapSettings,
    ShapingSettings,
    StrideRemap,
    check_groups,
    flat_fields,
    group_of,
    remap_of,
)
from .shaping import MapParams

__all__ = ["QGPMConfig", "PRESETS", "PRESET_NAMES", "RECIPE", "CALIBRATED", "MIN_SENTENCE_CHARS"]

_PASS1, _SHAPING, _CONFIDENCE, _MOVED = Pass1Settings(), ShapingSettings(), ConfidenceRules(), MoveRemap()  # the groups' defaults


@dataclass(frozen=True)
class QGPMConfig:
    """All QGPM settings.

    Attributes
    ----------
    k_broad, t_broad:
        Broad map (lower layers): rank width K_b and softness T_b of Eq. 6.
    k_sharp, t_sharp:
        Sharp map (upper layers): K_s, T_s. ``K_s`` must be at least the number of
        evidence sentences a task needs. ``T = 0`` is a hard top-K cut.
    s_low:
        Score of the least relevant sentence (top sentence scores 1).
    eps:
        Stride floor: a low-relevance token advances by ``max(s_low, eps)`` on fast planes.
    anchor_ratio:
        ``c`` in ``L_a = c * L`` (L = context length in tokens); planes whose wavelength is
        below ``L_a`` are modulated, slower planes keep unit stride.
    anchor_basis:
        What ``L`` in ``L_a = c * L`` is: ``"context"`` (the context length, the paper's
        choice) or ``"relevant"`` (per call: tokens from the first relevant sentence to the
        end of the prompt, the span that gets compressed).
    tau:
        Width of the frequency gate in plane-index units.
    local_window:
        Band gate (0 = off): planes whose wavelength is below this many tokens keep unit
        stride too, so only the band ``local_window <= lambda < L_a`` is modulated. The
        fastest planes carry local word order; a long distance is aliased on them anyway.
    keep_length:
        Strength rule for short contexts (0 = off), in tokens: the low score used in a
        call is ``max(s_low, keep_length / N)`` for a context of ``N`` tokens, so the
        compressed context never reads shorter than about ``keep_length`` tokens. A context
        of at most ``keep_length`` tokens keeps vanilla positions (logged as a warning;
        ``result.details["s_low"]`` is 1). Lost-in-the-middle is a long-context failure;
        compressing a few hundred tokens only disturbs text the model already reads.
    unmodulated_layers:
        The first this many decoder layers keep standard positions (0 = every layer is
        modulated).
    min_top_z:
        Confidence rule (``None`` turns the threshold off; a relevance that ranks no sentence
        above another keeps vanilla positions whatever the value): when the top sentence's fused relevance z
        (Eq. 5) is below this, the call keeps vanilla positions (every score 1) and the
        engine logs a warning; ``result.details["flat_relevance"]`` says so. z is on the
        relevance source's scale (the heads': each model's own units), so a number fits one
        source and model. ``"calibrated"`` (the generic recipe's): the threshold calibrated
        for the source (:func:`qgpm.thresholds.calibrated_min_top_z`): the one stored with
        the model's head set for the heads, the one shipped with the reranker for
        ``"minilm"``; BM25, cross-encoders, fused sources and a head set without one have no
        threshold: the rule is off, with a warning.
    decisive_margin:
        Dominance rule (``None`` = off), in z units: when the top sentence's fused z
        (Eq. 5) exceeds the second sentence's by at least this much, one sentence already
        stands out in the model's own attention, and the call keeps vanilla positions (the
        engine logs a warning; ``result.details["decisive_relevance"]`` says so). Under the
        paper's strides (``remap="stride"``) moving a lone, clearly found sentence only cost
        SmolLM2 copying accuracy, so this rule was part of its preset; under
        ``remap="reorder"`` the moved sentence is read as on a physically reordered prompt and
        the preset no longer sets it (``docs/tuning/smollm2_dev_4k.md``).
    solo_margin:
        Solo rule (``None`` = off; not in the paper), in z units: when the top sentence's
        fused z (Eq. 5) exceeds the second sentence's by at least this much (but less than
        ``decisive_margin``, which keeps vanilla positions), the top sentence alone is
        relevant in every map, whatever ``K``; ``result.details["solo_relevance"]`` says
        so. ``K`` sentences move where several sentences compete at the top (several values
        of one key, or a ranking the heads are unsure of); one moves where the heads single
        one out among look-alikes (one key among several), so the look-alikes stay where
        they are. The Oracle's labels are unaffected.
    z_window:
        Relevance window (``None`` = off), in z units; not in the paper. A sentence counts
        as relevant in either map only when its fused z (Eq. 5) is within this much of the
        top sentence's, on top of the rank shape (Eq. 6): the others get the lowest score
        ``s_low``. ``K`` caps how many sentences each map promotes, the window drops the
        ones the heads themselves put well below the top (look-alikes of a queried key),
        while sentences that tie with the top (several values of one key) stay together.
        The Oracle's 0/1 labels are unaffected (every evidence unit ties with the top).
    split_layer:
        First layer that uses the sharp map; ``None`` = ``floor(n_layers / 2)``.
    query_tail:
        Query rows Q = question tokens plus every prompt token after the question (answer
        prefix, assistant header) when ``None``; an int keeps only that many tail tokens
        after the question.
    exclude_newline_tokens:
        Drop tokens containing a line break from the relevance signal (App. A).
    max_heads:
        Use only the best ``max_heads`` heads of the head set (``None`` = all of them).
    max_sentence_chars:
        Sentences longer than this (e.g. text with no punctuation) are cut at whitespace
        (at least 20).
    split_run_ons:
        Run-on rule of the sentence splitter (off by default, on in the SmolLM2 preset; not in
        the paper): a
        capitalized sentence opener (``One``, ``The``, ``If``, ...;
        :data:`qgpm.segment.RUN_ON_OPENERS`) right after a lowercase word also starts a
        sentence. Text cut mid-sentence and joined to the next text (a chunk cut at a word
        count; RULER's haystack, cut before a needle at the end of the context) is then
        split where the next sentence starts, so a moved sentence does not take the cut
        fragment along. A pass-1 setting (it changes the units relevance is summed over):
        :meth:`qgpm.QGPM.replan` cannot change it.
    remap:
        How the scores become positions. ``"stride"`` (default, the paper's Eq. 7-8): low
        scores shorten the strides of irrelevant tokens on the modulated planes, so the
        relevant text comes closer to the question. ``"move"`` (experimental): nothing is
        compressed; on the modulated planes each map's relevant sentences (score at least
        ``(1 + s_low) / 2``) take the last context slots, the top one next to the question,
        and the rest of the context keeps its order in the slots before, while the slow
        planes keep the text order (``p' = g * j + (1 - g) * pi(j)``). ``eps`` is unused
        there. What it measured: ``docs/tuning/smollm2_dev_4k.md``.
        ``"reorder"`` (the SmolLM2 preset's): the same move on every plane, with the causal order
        following it too: a token attends only to tokens whose moved slot is not later
        than its own. Each map's pass 2 then computes exactly what the model computes on
        the prompt with those sentences physically moved before the question (Reorder with
        the model's own heads as the reranker). The gate (``anchor_ratio``, ``anchor_basis``, ``tau``,
        ``local_window``) and ``eps`` do not act there. On a model with several rotary
        kinds (Gemma 3) it needs one map on every layer (the slot-order forward below).
        With one map on every layer (``split_layer=0``, no ``unmodulated_layers``; or
        any call whose two maps move the same sentences) pass 2 runs as a plain forward over
        the prompt fed in slot order (the KV cache then holds the slot order), on any
        attention implementation and at vanilla prefill cost; otherwise per-layer causal
        masks are swapped in, which needs the ``sdpa`` or ``eager`` implementation and
        materializes an ``[N, N]`` mask.
    lead_tokens:
        ``remap="move"`` / ``"reorder"`` only (0 = off; not in the paper): each moved
        sentence takes along the sentences just before it in the text, up to this many
        tokens (:func:`qgpm.positions.with_leads`), so that moved sentences sit apart by
        some of their own text, as a reranker's chunks do, and the top sentence still ends
        next to the question. Look-alike sentences moved side by side (several keys of
        one kind, only one of them queried) are then not adjacent.
    term_ratio:
        Query-term filter (``None`` = off; not in the paper), in ``(0, 1]``: among each map's
        top ``K`` sentences, those whose BM25 score for the question (over the context's
        sentences, through ``bm25s``, a core dependency) is below ``term_ratio``
        times the best one's are not relevant (:func:`qgpm.shaping.term_filter`). The heads
        choose the candidates; the question's own words drop look-alikes among them (the
        sentence of another key, built like the queried one), while sentences that share the
        question's rare words (several values of one key) stay together.
        ``result.details["term_dropped"]`` counts the dropped sentences. The Oracle's labels
        are unaffected.
    local_layers:
        Models with sliding-window ("local") layers only (Gemma 3); ``None`` = the remap's
        own choice. ``"vanilla"``: local layers keep standard positions; only the global
        layers are remapped (what ``remap="stride"`` / ``"move"`` do by default: the window
        already bounds every distance a local layer sees). ``"modulated"``: local layers are
        remapped too, each kind with its own boundary plane on its own wavelengths (Eq. 3, 7);
        the window itself (which tokens a local layer sees) does not change. ``remap="reorder"``
        always reads the reordered prompt on every layer (its slot-order forward), so it takes
        ``None`` or ``"modulated"``. On a model without local layers any value but ``None``
        is an error.
    placement:
        ``remap="move"`` / ``"reorder"`` only; where the moved sentences go (not in the
        paper). ``"question"`` (default): all of them before the question, the top one
        last. ``"ends"``: split between the two ends of the context as LangChain's
        ``LongContextReorder`` splits documents (:func:`qgpm.positions.ends_placement`): the
        top sentence next to the question, the second at the start of the context, the
        third before the top one, the fourth after the second. A look-alike ranked second
        then sits a whole context away from the top sentence instead of right before it.
    moved_order:
        ``remap="move"`` / ``"reorder"`` with ``placement="question"`` only; the order of the
        moved sentences before the question (not in the paper). ``"rank"`` (default): the
        top-ranked one last, next to the question. ``"text"``: the order they have in the
        context, as the Oracle places its evidence (several values of one key read in the
        order they were written).
    pass1_dtype:
        The precision of pass 1 (not in the paper). ``None`` (the generic default): the
        model's own dtype; the embedded SmolLM2's preset sets ``"auto"``. ``"bfloat16"`` / ``"float16"``: pass 1 runs under ``torch.autocast`` at that
        dtype (weights cast op by op, no copy kept), which on a float32 model roughly halves
        its time on hardware that multiplies that dtype natively (CPUs with AVX512-BF16 or
        AMX, GPUs); on other hardware it is slower, and the engine warns. ``"auto"``:
        bfloat16 for a float32 model on such hardware, else the model's dtype, and the
        model's dtype for a context no longer than ``keep_length`` (such a call keeps vanilla
        positions: its exact pass 1 goes on as the prefill, one prefill in all). Pass 1 only
        ranks sentences: the answer is still computed at the model's precision under the
        plan, but the ranking, and so the plan and the answer, can differ from a full-
        precision pass 1 where two sentences score close. A lower-precision pass 1 is not
        the model's prefill, so the engine's ``reuse_prefill`` does not apply to it: the call
        pays pass 1 plus one prefill (``result.details["pass1_dtype"]`` names the dtype used).
        ``"float32"`` on a float32 model is the same as ``None``.
    relevance:
        Where the sentence relevance ``z`` comes from (not in the paper; :mod:`qgpm.sources`).
        ``"heads"`` (the field's default and the paper's): the model's own heads in pass 1
        (Eq. 4-5); the generic recipe (:data:`RECIPE`) and the SmolLM2 preset take
        ``"minilm"``. A reranker spec of
        :func:`qgpm.rerank.get_reranker` (``"minilm"``, ``"bm25"``, ``"cross-encoder:<path>"``,
        ...): that reranker scores each sentence against the question and no pass 1 runs (the
        call costs about a vanilla prefill plus the reranker; no head set is needed).
        ``"heads+<reranker>"``: both, each standardized over the sentences and averaged. The
        confidence rules (``min_top_z``, ``decisive_margin``, ``solo_margin``, ``z_window``)
        read whichever ``z`` the source gives. ``result.details["relevance_source"]`` and the
        explanation name the source.

    Every field is checked on construction: numbers must be finite (no NaN or
    infinity), counts must be ints in range; a bad value raises ``TypeError`` or
    ``ValueError`` naming the field. Limits that depend on the model (``split_layer``
    and ``unmodulated_layers`` at most the number of layers) are checked by the
    engine before pass 1.

    The fields fall into four groups (:mod:`qgpm.settings`), read with :attr:`pass1`,
    :attr:`shaping`, :attr:`confidence` and :attr:`remap_settings`; :meth:`from_groups`
    builds a config from them. The defaults above are the groups'.
    """

    k_broad: float = _SHAPING.k_broad
    t_broad: float = _SHAPING.t_broad
    k_sharp: float = _SHAPING.k_sharp
    t_sharp: float = _SHAPING.t_sharp
    s_low: float = _SHAPING.s_low
    eps: float = _SHAPING.eps
    anchor_ratio: float = _SHAPING.anchor_ratio
    tau: float = _SHAPING.tau
    anchor_basis: str = _SHAPING.anchor_basis
    local_window: float = _SHAPING.local_window
    keep_length: float = _CONFIDENCE.keep_length
    unmodulated_layers: int = _SHAPING.unmodulated_layers
    min_top_z: float | str | None = _CONFIDENCE.min_top_z
    decisive_margin: float | None = _CONFIDENCE.decisive_margin
    z_window: float | None = _CONFIDENCE.z_window
    solo_margin: float | None = _CONFIDENCE.solo_margin
    split_layer: int | None = _SHAPING.split_layer
    query_tail: int | None = _PASS1.query_tail
    exclude_newline_tokens: bool = _PASS1.exclude_newline_tokens
    max_heads: int | None = _PASS1.max_heads
    max_sentence_chars: int = _PASS1.max_sentence_chars
    split_run_ons: bool = _PASS1.split_run_ons
    remap: str = StrideRemap.REMAP
    lead_tokens: int = _MOVED.lead_tokens
    placement: str = _MOVED.placement
    local_layers: str | None = _MOVED.local_layers
    term_ratio: float | None = _CONFIDENCE.term_ratio
    moved_order: str = _MOVED.moved_order
    pass1_dtype: str | None = _PASS1.pass1_dtype
    relevance: str = _PASS1.relevance
    provenance: str = field(default="initial defaults (untuned)", compare=False)

    def __post_init__(self) -> None:
        check_types(self)
        check_groups(self)

    @property
    def pass1(self) -> Pass1Settings:
        """The pass-1 settings (:class:`~qgpm.settings.Pass1Settings`)."""
        return group_of(Pass1Settings, self)

    @property
    def shaping(self) -> ShapingSettings:
        """The shaping settings (:class:`~qgpm.settings.ShapingSettings`)."""
        return group_of(ShapingSettings, self)

    @property
    def confidence(self) -> ConfidenceRules:
        """The confidence rules (:class:`~qgpm.settings.ConfidenceRules`)."""
        return group_of(ConfidenceRules, self)

    @property
    def remap_settings(self) -> RemapSettings:
        """The remap with its own options: :class:`~qgpm.settings.StrideRemap`,
        :class:`~qgpm.settings.MoveRemap` or :class:`~qgpm.settings.ReorderRemap`."""
        return remap_of(self)

    @classmethod
    def from_groups(cls, *, pass1: Pass1Settings | None = None, shaping: ShapingSettings | None = None,
                    confidence: ConfidenceRules | None = None, remap: RemapSettings | None = None,
                    provenance: str | None = None) -> QGPMConfig:
        """A config from its groups (:mod:`qgpm.settings`); a group left out takes its defaults,
        the same as ``QGPMConfig()``'s. ``provenance`` ``None`` keeps the default text.

        ``QGPMConfig.from_groups(pass1=c.pass1, shaping=c.shaping, confidence=c.confidence,
        remap=c.remap_settings, provenance=c.provenance)`` equals ``c``. An argument of the wrong
        group (a remap name such as ``"reorder"`` instead of ``ReorderRemap()``) raises
        ``TypeError``."""
        values = flat_fields(pass1=pass1, shaping=shaping, confidence=confidence, remap=remap)
        return cls(**values) if provenance is None else cls(**values, provenance=provenance)

    @property
    def broad(self) -> MapParams:
        return MapParams(self.k_broad, self.t_broad)

    @property
    def sharp(self) -> MapParams:
        return MapParams(self.k_sharp, self.t_sharp)

    def with_(self, **changes: Any) -> "QGPMConfig":
        """A copy with some fields changed (validated). Unless ``provenance`` is among the
        changes, the copy's provenance is this one's with the changed values appended
        (``"...; then overridden: remap='stride'"``), so it never describes settings the copy
        no longer has."""
        new = replace(self, **changes)
        if "provenance" not in changes:
            said = ", ".join(f"{k}={v!r}" for k, v in changes.items() if getattr(self, k) != getattr(new, k))
            if said:
                new = replace(new, provenance=f"{self.provenance}; then overridden: {said}")
        return new

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def paper(cls) -> "QGPMConfig":
        """The paper's method and settings (App. C): ``remap="stride"`` (Eq. 7-8), two maps
        (``K_b`` 8 below the middle layer, ``K_s`` 2 above), no rules of ours. The same as
        ``QGPMConfig()``; a model without a preset gets :data:`RECIPE` instead."""
        return cls(provenance="the paper's settings (App. C): remap stride, two maps")

    @classmethod
    def for_model(cls, model: Any) -> "QGPMConfig":
        """The preset for a model, else :data:`RECIPE` (the measured recipe).

        ``model``: a :class:`~qgpm.fingerprint.ModelFingerprint`, a fingerprint key, or
        a readable preset name (case-insensitive, e.g. ``"SmolLM2-135M-Instruct"``). The
        engine looks presets up by fingerprint key, so a model is matched by what it is,
        not by what its file is called.
        """
        key = getattr(model, "key", model)
        if not isinstance(key, str):
            raise TypeError(f"for_model takes a fingerprint, its key or a preset name; got {type(model).__name__}")
        if key in PRESETS:
            return PRESETS[key]
        by_name = {n.lower(): k for k, n in PRESET_NAMES.items()}
        k = by_name.get(key.strip().lower())
        return PRESETS[k] if k is not None else RECIPE


SMOLLM2_KEY = "96f8dcdd689f9245"
"""Fingerprint key (:mod:`qgpm.fingerprint`) of SmolLM2-135M-Instruct (the embedded GGUF)."""

RECIPE = QGPMConfig(
    k_sharp=4.0,
    s_low=0.45,
    anchor_ratio=2.0,
    min_top_z=CALIBRATED,
    keep_length=1024.0,
    remap="reorder",
    split_layer=0,
    term_ratio=0.6,
    split_run_ons=True,
    pass1_dtype="auto",
    relevance="minilm",
    provenance="the measured recipe (docs/tuning/recipe.md): the SmolLM2 preset's reorder with one map, K_s 4, term_ratio 0.6, "
    "keep_length 1024, split_run_ons, the sentences ranked by the MiniLM reranker with its calibrated confidence threshold",
)
"""What a model without its own preset gets (:meth:`QGPMConfig.for_model`): the settings that won
on SmolLM2 (``remap="reorder"`` with one map, ``K_s`` 4, the query-term filter, short contexts
kept as they are, the sentences ranked by the MiniLM reranker), with the flat-relevance
threshold calibrated for MiniLM's z (``min_top_z="calibrated"``: :mod:`qgpm.thresholds`)
instead of the preset's number. No pass 1 runs and no head set is needed;
``relevance="heads"`` ranks with the model's own heads and their calibrated threshold. The
paper's method is :meth:`QGPMConfig.paper`."""

PRESET_NAMES: dict[str, str] = {SMOLLM2_KEY: DEFAULT_MODEL_NAME}
"""Readable model name beside each preset's fingerprint key."""

PRESETS: dict[str, QGPMConfig] = {
    # Each setting, what it was compared with, on which split and with which numbers:
    # docs/tuning/smollm2_preset.md.
    # the recipe, with the confidence threshold chosen in SmolLM2's own z units on its dev split,
    # and the sentence relevance from the MiniLM reranker (docs/tuning/relevance_sources.md)
    SMOLLM2_KEY: RECIPE.with_(
        min_top_z=2.5,
        provenance="4K dev search: remap reorder with one map (split_layer 0), s_low 0.45, K_s 4, min_top_z 2.5, "
        "keep_length 1024, term_ratio 0.6, split_run_ons, no dominance rule, pass1_dtype auto (docs/tuning/smollm2_dev_4k.md); "
        "relevance minilm by the rule of docs/tuning/relevance_sources.md on the 4K test grid",
    ),
}
