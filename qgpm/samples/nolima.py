"""NoLiMa-style retrieval with our own needle set (``nolima_direct``, ``nolima_assoc``).

NoLiMa (Modarressi et al., ICML 2025) hides one sentence about a named character in a
haystack and asks a question whose wording shares little with the sentence, so that
lexical matching does not find it. Its needle set is non-commercial, so this module
ships its own: 30 needle templates, each with

* a needle with a ``{name}`` slot (``"{name} rowed a small boat under the Rialto Bridge."``),
* a *direct* question that repeats the needle's key phrase
  (``"Which character rowed a boat under the Rialto Bridge?"``),
* an *association* question that needs one hop of world knowledge
  (``"Which character has been to Venice?"``),
* conflict terms: haystack paragraphs that mention any of them (or the character's name)
  are left out, so the haystack holds no competing answer (NoLiMa filters conflicts too).

The answer is the character's name; the metric is NoLiMa's ``contains`` (the gold name
occurs in the answer, case-sensitive). NoLiMa places the needle at a line boundary at a
token depth and asks with a fixed prompt ("book snippet"); here the needle is inserted
as its own sentence at the sentence boundary closest to the requested depth (relative
character position), and the prompt is our own wording of the same instructions. With
``depth=None`` the depth is drawn from NoLiMa's grid (26 points in [0, 1]).

Splits: the templates and the 30 character names are each cut into three disjoint
thirds (calibration / dev / test), so no calibration needle shares a template or a name
with an evaluation needle. Both variants draw the same (template, name, haystack start)
for the same seed and index, so direct and association results pair up.

Haystacks are pluggable: ``haystack="essays"`` (default; Paul Graham essays, in
paragraphs of six sentences), ``"squad"`` (SQuAD paragraphs), another registered name,
or any function returning a list of paragraphs. The haystack starts at a random
paragraph per sample.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

from qgpm.samples import resources
from qgpm.samples.base import (
    EvalSample,
    build_sample,
    closest_gap,
    fit_units,
    join_items,
    sample_rng,
    split_of_seed,
    split_pool,
)
from qgpm.prompt import PromptSpec, count_prompt_tokens

__all__ = ["NOLIMA_TASKS", "NoLiMaNeedle", "NEEDLES", "CHARACTER_NAMES", "NOLIMA_DEPTHS", "generate_nolima", "needle_combos"]

NOLIMA_TASKS: dict[str, str] = {"nolima_direct": "direct", "nolima_assoc": "assoc"}
NOLIMA_MAX_NEW_TOKENS = 64

# NoLiMa's default sweep: np.linspace(0, 100, 26) percent.
NOLIMA_DEPTHS: tuple[float, ...] = tuple(i / 25 for i in range(26))


@dataclass(frozen=True)
class NoLiMaNeedle:
    needle: str
    direct: str
    assoc: str
    conflicts: tuple[str, ...]


NEEDLES: tuple[NoLiMaNeedle, ...] = (
    NoLiMaNeedle("{name} spent a whole afternoon feeding pigeons beside the Trevi Fountain.",
                 "Which character fed pigeons beside the Trevi Fountain?",
                 "Which character has been to Rome?", ("Rome", "Roman", "Trevi", "Italy", "Italian")),
    NoLiMaNeedle("{name} once got lost for three hours inside the Hermitage Museum.",
                 "Which character got lost inside the Hermitage Museum?",
                 "Which character has been to Saint Petersburg?",
                 ("Petersburg", "Hermitage", "Russia", "Russian", "Leningrad")),
    NoLiMaNeedle("{name} proposed to their partner on the observation deck of the Space Needle.",
                 "Which character proposed on the observation deck of the Space Needle?",
                 "Which character has been to Seattle?", ("Seattle", "Space Needle", "Washington")),
    NoLiMaNeedle("{name} watched the sunrise over Angkor Wat from the western causeway.",
                 "Which character watched the sunrise over Angkor Wat?",
                 "Which character has been to Cambodia?", ("Cambodia", "Cambodian", "Angkor", "Khmer")),
    NoLiMaNeedle("{name} posed for a wedding photo in front of the Taj Mahal.",
                 "Which character posed for a wedding photo in front of the Taj Mahal?",
                 "Which character has been to India?", ("India", "Indian", "Taj Mahal", "Agra")),
    NoLiMaNeedle("{name} learned to surf on the beach at Waikiki.",
                 "Which character learned to surf at Waikiki?",
                 "Which character has been to Hawaii?", ("Hawaii", "Hawaiian", "Honolulu", "Waikiki", "Oahu")),
    NoLiMaNeedle("{name} had a picnic on the lawn beneath the Atomium.",
                 "Which character had a picnic beneath the Atomium?",
                 "Which character has been to Brussels?", ("Brussels", "Belgium", "Belgian", "Atomium")),
    NoLiMaNeedle("{name} crossed the finish line of a half marathon at the foot of the Petronas Towers.",
                 "Which character finished a half marathon at the foot of the Petronas Towers?",
                 "Which character has been to Malaysia?", ("Malaysia", "Malaysian", "Kuala Lumpur", "Petronas")),
    NoLiMaNeedle("{name} sketched the Alhambra from a bench across the valley.",
                 "Which character sketched the Alhambra?",
                 "Which character has been to Spain?", ("Spain", "Spanish", "Granada", "Alhambra")),
    NoLiMaNeedle("{name} bought a painted fan at a stall outside the Forbidden City.",
                 "Which character bought a painted fan outside the Forbidden City?",
                 "Which character has been to Beijing?", ("Beijing", "Peking", "China", "Chinese", "Forbidden City")),
    NoLiMaNeedle("{name} keeps a pet axolotl in a tank next to the kitchen window.",
                 "Which character keeps a pet axolotl?",
                 "Which character owns an amphibian?", ("amphibian", "amphibians", "axolotl", "salamander", "frog", "newt", "toad")),
    NoLiMaNeedle("{name} keeps a pet tarantula on the bookshelf.",
                 "Which character keeps a pet tarantula?",
                 "Which character owns an arachnid?", ("arachnid", "arachnids", "spider", "spiders", "tarantula", "scorpion")),
    NoLiMaNeedle("{name} plays the bassoon in a community orchestra.",
                 "Which character plays the bassoon?",
                 "Which character plays a woodwind instrument?", ("woodwind", "bassoon", "oboe", "clarinet", "flute")),
    NoLiMaNeedle("{name} was born in the same year the Berlin Wall fell.",
                 "Which character was born in the year the Berlin Wall fell?",
                 "Which character was born in 1989?", ("1989", "Berlin Wall")),
    NoLiMaNeedle("{name} wrote a doctoral thesis on the element with atomic number 79.",
                 "Which character wrote a thesis on the element with atomic number 79?",
                 "Which character wrote a thesis about gold?", ("gold", "atomic number")),
    NoLiMaNeedle("{name} has stood on the summit of Kilimanjaro twice.",
                 "Which character has stood on the summit of Kilimanjaro?",
                 "Which character has climbed the highest mountain in Africa?",
                 ("Kilimanjaro", "Africa", "African", "Tanzania", "highest mountain")),
    NoLiMaNeedle("{name} translates Portuguese novels for a living.",
                 "Which character translates Portuguese novels?",
                 "Which character speaks the main language of Brazil?", ("Brazil", "Brazilian", "Portuguese", "Portugal")),
    NoLiMaNeedle("{name} flies a Cessna to the coast most weekends.",
                 "Which character flies a Cessna?",
                 "Which character can pilot an airplane?", ("pilot", "pilots", "airplane", "aeroplane", "aircraft", "Cessna", "aviator")),
    NoLiMaNeedle("{name} drives a car that was built in Maranello.",
                 "Which character drives a car built in Maranello?",
                 "Which character drives a Ferrari?", ("Ferrari", "Maranello")),
    NoLiMaNeedle("{name} grew up a short walk from the Colosseum.",
                 "Which character grew up a short walk from the Colosseum?",
                 "Which character grew up in Italy?", ("Italy", "Italian", "Rome", "Roman", "Colosseum")),
    NoLiMaNeedle("{name} went diving among the corals of the Great Barrier Reef last winter.",
                 "Which character went diving at the Great Barrier Reef?",
                 "Which character has been to Australia?", ("Australia", "Australian", "Queensland", "Barrier Reef")),
    NoLiMaNeedle("{name} rode a camel around the pyramids of Giza.",
                 "Which character rode a camel around the pyramids of Giza?",
                 "Which character has been to Egypt?", ("Egypt", "Egyptian", "Giza", "Cairo")),
    NoLiMaNeedle("{name} photographed the Old Faithful geyser at sunrise.",
                 "Which character photographed the Old Faithful geyser?",
                 "Which character has been to Yellowstone National Park?", ("Yellowstone", "Wyoming", "Old Faithful", "geyser")),
    NoLiMaNeedle("{name} rowed a small boat under the Rialto Bridge.",
                 "Which character rowed a boat under the Rialto Bridge?",
                 "Which character has been to Venice?", ("Venice", "Venetian", "Rialto")),
    NoLiMaNeedle("{name} attended a tea ceremony at a temple in Kyoto.",
                 "Which character attended a tea ceremony in Kyoto?",
                 "Which character has been to Japan?", ("Japan", "Japanese", "Kyoto")),
    NoLiMaNeedle("{name} hiked the Inca Trail all the way to Machu Picchu.",
                 "Which character hiked the Inca Trail to Machu Picchu?",
                 "Which character has been to Peru?", ("Peru", "Peruvian", "Inca", "Machu Picchu")),
    NoLiMaNeedle("{name} spends most days cleaning fossils of Tyrannosaurus rex.",
                 "Which character cleans fossils of Tyrannosaurus rex?",
                 "Which character works with dinosaur remains?", ("dinosaur", "dinosaurs", "Tyrannosaurus", "fossil", "fossils")),
    NoLiMaNeedle("{name} restores harpsichords in a small workshop.",
                 "Which character restores harpsichords?",
                 "Which character repairs keyboard instruments?", ("keyboard", "harpsichord", "harpsichords", "piano", "organ")),
    NoLiMaNeedle("{name} cycled across the Golden Gate Bridge at dawn.",
                 "Which character cycled across the Golden Gate Bridge?",
                 "Which character has been to San Francisco?", ("San Francisco", "Golden Gate", "California")),
    NoLiMaNeedle("{name} practises every evening on a Stradivarius.",
                 "Which character practises on a Stradivarius?",
                 "Which character plays the violin?", ("violin", "violins", "violinist", "Stradivari", "Stradivarius")),
)

CHARACTER_NAMES: tuple[str, ...] = (
    "Yuki", "Arjun", "Mei", "Tomasz", "Astrid", "Kwame", "Lucia", "Dmitri", "Aiko", "Rafael",
    "Nadia", "Oskar", "Priya", "Matteo", "Hana", "Emeka", "Freya", "Kofi", "Ines", "Sven",
    "Leilani", "Bruno", "Zara", "Kenji", "Amara", "Felix", "Selin", "Marisol", "Anouk", "Rohan",
)

_INSTRUCTION = "Read the following text and then answer a question about it."
_TEMPLATE = (
    "{instruction}\n\n{context}\n\n"
    "Answer the question using the text above. Keep the answer short, based on facts the text states "
    "or on strong, logical inferences from them.\n\n"
    "Question: {question}\n\n"
    "Give only the final answer, without explanation or reasoning."
)


def _blocked(conflicts: Sequence[str], name: str) -> re.Pattern:
    terms = "|".join(re.escape(t) for t in conflicts)
    return re.compile(rf"\b{re.escape(name)}\b|(?i:\b(?:{terms})\b)")


def needle_combos(seed: int) -> list[tuple[int, str]]:
    """The (needle template, character name) pairs of ``seed``'s split, in the order the samples
    of ``seed`` take them (sample ``i`` takes entry ``i mod len``). The eval harness makes one
    sample per seed, so each content index draws its pair on its own: two contents can hold the
    same needle and question (a draw with replacement)."""
    split = split_of_seed(seed)
    combos = [(t, nm) for t in split_pool(range(len(NEEDLES)), split) for nm in split_pool(CHARACTER_NAMES, split)]
    sample_rng("nolima", seed, "combos").shuffle(combos)
    return combos


def generate_nolima(
    task: str,
    *,
    n: int,
    length: int,
    tokenizer: Any,
    seed: int,
    depths: Sequence[float] | None = None,
    haystack: Any = "essays",
    max_new_tokens: int | None = None,
) -> list[EvalSample]:
    variant = NOLIMA_TASKS[task]
    split = split_of_seed(seed)
    max_new = NOLIMA_MAX_NEW_TOKENS if max_new_tokens is None else int(max_new_tokens)
    hay_name, source = resources.get_haystack(haystack if haystack is not None else "essays")
    paragraphs = resources.haystack_sentences(hay_name, source)
    combos = needle_combos(seed)
    out = []
    for depth in (list(depths) if depths is not None else [None]):
        if depth is not None and not 0.0 <= depth <= 1.0:
            raise ValueError(f"depth must be in [0, 1], got {depth}")
        for i in range(n):
            t, name = combos[i % len(combos)]
            out.append(_one(task, variant, split, seed, i, depth, length, max_new, tokenizer, hay_name, paragraphs, t, name))
    return out


def _one(task, variant, split, seed, i, depth, length, max_new, tokenizer, hay_name, paragraphs, t, name) -> EvalSample:
    spec = NEEDLES[t]
    needle = spec.needle.format(name=name)
    question = spec.direct if variant == "direct" else spec.assoc
    blocked = _blocked(spec.conflicts, name)
    # Shared by both variants: the haystack start and the random depth.
    rng = sample_rng("nolima", seed, i, hay_name, "haystack")
    start = rng.randrange(len(paragraphs))
    used_depth = depth if depth is not None else sample_rng("nolima", seed, i, "depth").choice(NOLIMA_DEPTHS)
    items: list[tuple[str, str]] = []  # (separator before, sentence): the usable haystack
    chars, enough = 0, 12 * length  # far more text than `length` tokens can hold
    for p in paragraphs[start:] + paragraphs[:start]:
        if chars > enough:
            break
        if any(blocked.search(s) for s in p):
            continue
        for j, s in enumerate(p):
            items.append(("\n\n" if j == 0 else " ", s))
            chars += len(s) + 1

    def build(k: int) -> tuple[str, int]:
        part = items[:k]
        g = closest_gap([len(s) for _, s in part], [len(sep) for sep, _ in part], 1, used_depth)
        if g == 0:
            seq = [(" ", needle)] + ([(" ", part[0][1])] + part[1:] if part else [])
        else:
            seq = part[:g] + [(" ", needle)] + part[g:]
        text, starts = join_items(seq)
        return text, starts[g]

    def prompt(context: str) -> PromptSpec:
        return PromptSpec(context=context, question=question, instruction=_INSTRUCTION, answer_prefix="", template=_TEMPLATE)

    def measure(k: int) -> int:
        return count_prompt_tokens(tokenizer, prompt(build(k)[0])) + max_new

    k, total = fit_units(measure, length, 0, len(items), 30.0)
    context, pos = build(k)
    meta = {
        "split": split,
        "haystack": hay_name,
        "haystack_units": k,
        "prompt_tokens": total - max_new,
        "template_id": t,
        "character": name,
        "variant": variant,
        "target_depth": used_depth,
        "needle_depths": [pos / max(1, len(context) - len(needle))],
    }
    return build_sample(prompt(context), task=task, length=length, depth=depth, seed=seed, index=i, max_new_tokens=max_new,
                        answers=[name], evidence=[needle], metric="contains_case_sensitive", meta=meta)
