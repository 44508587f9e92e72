"""Benchmark task generators (qgpm.samples) and scorers (qgpm.eval.scoring): offline, seeded, budget-exact."""

from __future__ import annotations

import re

import pytest

from qgpm.eval import scoring
from qgpm.samples.base import BudgetError, SPLIT_SEEDS, closest_gap, fit_units, split_of_seed, split_seed
from qgpm.samples.tasks import TASKS, generate

NIAH = ("niah_single_2", "niah_multikey_1", "niah_multikey_2", "niah_multivalue")
DEPTHS = (0.0, 0.5, 1.0)
LENGTHS = (1024, 2048)
TEST_SEED = split_seed("test", 3)


@pytest.fixture(scope="module")
def tok():
    from qgpm.loading import default_model_source, load_tokenizer

    return load_tokenizer(default_model_source())


_CACHE: dict = {}


@pytest.fixture(scope="module")
def samples(tok):
    """(task, length) -> samples at DEPTHS plus one RULER-random sample (depth None)."""

    def get(task, length):
        key = (task, length)
        if key not in _CACHE:
            swept = generate(task, n=1, length=length, tokenizer=tok, seed=TEST_SEED, depths=DEPTHS)
            rand = generate(task, n=1, length=length, tokenizer=tok, seed=TEST_SEED)
            _CACHE[key] = swept + rand
        return _CACHE[key]

    return get


def prompt_tokens(tok, s) -> int:
    """Measured independently of qgpm.samples: chat template on the user turn + answer prefix."""
    ctx = s.context if isinstance(s.context, str) else "\n\n".join(s.context)
    user = s.template.format(instruction=s.instruction, context=ctx, question=s.question)
    text = tok.apply_chat_template([{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True)
    return len(tok(text + s.answer_prefix, add_special_tokens=False)["input_ids"])


def rel_pos(context: str, ev: str) -> float:
    start = context.find(ev)
    assert start >= 0
    assert context.find(ev, start + 1) == -1, "evidence must occur once"
    return start / (len(context) - len(ev))


# ----------------------------------------------------------------------------- scorers


def test_string_match_all_partial_credit_and_case():
    golds = ["1234567", "7654321", "Abc-Def", "9999999"]
    pred = "The numbers are 1234567 and abc-def."
    assert scoring.score("string_match_all", pred, golds) == pytest.approx(0.5)
    assert not scoring.is_correct("string_match_all", pred, golds)
    full = "1234567, 7654321, ABC-DEF, 9999999"
    assert scoring.score("string_match_all", full, golds) == 1.0
    assert scoring.is_correct("string_match_all", full, golds)


def test_string_match_part_takes_max_over_golds():
    golds = ["Denver Broncos", "Broncos"]
    assert scoring.score("string_match_part", "the broncos won", golds) == 1.0
    assert scoring.score("string_match_part", "the panthers won", golds) == 0.0
    assert scoring.score("string_match_part", "DENVER BRONCOS", ["Denver Broncos"]) == 1.0


def test_ruler_metrics_are_rulers_own_functions(monkeypatch):
    from long_context_eval.eval.synthetic import constants

    assert scoring._ruler_metric("string_match_all_per_sample") is constants.string_match_all_per_sample
    calls = []

    def fake(preds, refs):
        calls.append((preds, refs))
        return [50.0]

    monkeypatch.setattr(constants, "string_match_part_per_sample", fake)
    scoring._ruler_metric.cache_clear()
    try:
        assert scoring.score("string_match_part", "  x\t ", ["y"]) == 0.5
        assert calls == [(["x"], [["y"]])]  # post-processed prediction, one sample
    finally:
        scoring._ruler_metric.cache_clear()


def test_contains_is_case_sensitive():
    assert scoring.score("contains_case_sensitive", "It was Yuki.", ["Yuki"]) == 1.0
    assert scoring.score("contains_case_sensitive", "it was yuki.", ["Yuki"]) == 0.0


def test_ruler_postprocess_and_errors():
    # RULER: strip, control characters -> newline, strip again.
    assert scoring.postprocess_prediction("  12\x0034\t5 \n") == "12\n34\n5"
    assert scoring.score("string_match_part", "abc\tdef", ["abc def"]) == 0.0
    assert scoring.score("string_match_all", None, ["x"]) == 0.0
    with pytest.raises(ValueError):
        scoring.score("exact_match", "x", ["x"])
    with pytest.raises(ValueError):
        scoring.score("string_match_all", "x", [])


# ----------------------------------------------------------------------------- helpers


def test_split_seed_ranges_are_disjoint():
    ranges = sorted(SPLIT_SEEDS.values(), key=lambda r: r.start)
    assert all(r.step == 1 and len(r) > 0 for r in ranges)
    assert all(a.stop <= b.start for a, b in zip(ranges, ranges[1:]))
    for split in SPLIT_SEEDS:
        assert split_of_seed(split_seed(split, 5)) == split
    with pytest.raises(ValueError):
        split_of_seed(max(r.stop for r in ranges))
    with pytest.raises(ValueError):
        split_seed("train", 0)


def test_fit_units_finds_largest_fitting_size():
    measure = lambda k: 100 + 7 * k + (k % 3)  # noqa: E731  (bumpy but increasing)
    k, t = fit_units(measure, 1000, 0, 10_000, rate_hint=1.0)
    assert t == measure(k) <= 1000 < measure(k + 1)
    k, _ = fit_units(measure, 10**9, 0, 50, rate_hint=7.0)
    assert k == 50  # capped by the haystack size
    with pytest.raises(BudgetError):
        fit_units(measure, 50, 0, 10, rate_hint=7.0)


def test_closest_gap_endpoints():
    assert closest_gap([10, 10, 10], [1, 1, 1], 1, 0.0) == 0
    assert closest_gap([10, 10, 10], [1, 1, 1], 1, 1.0) == 3
    assert closest_gap([10, 10, 10], [1, 1, 1], 1, 0.5) in (1, 2)


# ----------------------------------------------------------------------------- generators


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("task", TASKS)
def test_generated_samples_are_well_formed(task, length, samples, tok):
    for s in samples(task, length):
        assert s.task == task and s.length == length
        # Evidence is present in the context, exactly once.
        assert s.evidence
        for ev in s.evidence:
            rel_pos(s.context, ev)
        # Token budget: prompt + generation fits, and fills at least 85 %.
        n = prompt_tokens(tok, s)
        assert n == s.meta["prompt_tokens"]
        assert n + s.max_new_tokens <= length
        assert n + s.max_new_tokens >= 0.85 * length
        # Labels: the gold strings are held by the evidence.
        text = "\n".join(s.evidence)
        if task == "qa_2" and s.answers[0].lower() in {"yes", "no"}:
            pass  # HotpotQA comparison questions
        elif s.metric == "string_match_all":
            assert all(a in text for a in s.answers)
        elif s.metric == "contains_case_sensitive":
            assert all(a in text for a in s.answers)
        else:
            assert any(a.lower() in text.lower() for a in s.answers)
        assert s.metric in scoring.METRICS
        # A perfect answer scores 1, an empty one 0.
        assert scoring.is_correct(s.metric, " ".join(s.answers), s.answers)
        assert scoring.score(s.metric, "", s.answers) == 0.0


@pytest.mark.parametrize("task", NIAH + ("nolima_direct", "nolima_assoc", "kv_retrieval"))
def test_needle_sits_at_requested_depth(task, samples):
    for length, tol in ((1024, 0.08), (2048, 0.05)):
        swept = [s for s in samples(task, length) if s.depth is not None]
        assert [s.depth for s in swept] == list(DEPTHS)
        for s in swept:
            pos = rel_pos(s.context, s.evidence[0])
            assert abs(pos - s.depth) <= tol, (task, length, s.depth, pos)
            assert s.meta["needle_depths"][0] == pytest.approx(pos)


@pytest.mark.parametrize("task", ("qa_1", "qa_2"))
def test_gold_document_sits_at_requested_position(task, samples):
    for length in LENGTHS:
        for s in [s for s in samples(task, length) if s.depth is not None]:
            docs = re.split(r"\n\n(?=Document \d+:\n)", s.context)
            assert len(docs) == s.meta["num_docs"] >= len(s.evidence)
            want = round(s.depth * (len(docs) - len(s.evidence)))
            for j, ev in enumerate(s.evidence):
                assert ev in docs[want + j] or any(ev in docs[p] for p in range(want, want + len(s.evidence)))
            assert sorted(s.meta["gold_positions"]) == list(range(want, want + len(s.evidence)))
            for i, d in enumerate(docs):
                assert d.startswith(f"Document {i + 1}:\n")


_NEEDLE_RE = re.compile(r"One of the special magic numbers for (\S+) is: (\d{7})\.")


@pytest.mark.parametrize("task", NIAH)
def test_niah_labels_match_the_needles_in_the_context(task, samples):
    for s in samples(task, 1024) + samples(task, 2048):
        found: dict[str, list[str]] = {}
        for key, value in _NEEDLE_RE.findall(s.context):
            found.setdefault(key, []).append(value)
        query = s.meta["query_key"]
        assert f" for {query} mentioned in the provided text" in s.question
        assert sorted(found[query]) == sorted(s.answers)  # the gold values are the asked key's values
        values = [v for vs in found.values() for v in vs]
        assert len(values) == len(set(values))  # no value is shared by two needles
        n_keys = {"niah_multikey_1": 4}.get(task, 1)
        if task != "niah_multikey_2":
            assert len(found) == n_keys
        assert len(s.answers) == (4 if task == "niah_multivalue" else 1)


def test_ruler_prompt_facts(samples):
    s1 = samples("niah_single_2", 1024)[0]
    assert s1.instruction.startswith("A special magic number is hidden within the following text.")
    assert s1.question == f"What is the special magic number for {s1.meta['query_key']} mentioned in the provided text?"
    assert s1.answer_prefix == f"The special magic number for {s1.meta['query_key']} mentioned in the provided text is"
    assert re.fullmatch(r"One of the special magic numbers for [a-z]+-[a-z]+ is: \d{7}\.", s1.evidence[0])
    mv = samples("niah_multivalue", 1024)[0]
    assert mv.instruction.startswith("Some special magic numbers are hidden")
    assert len(mv.answers) == 4 and len(set(mv.answers)) == 4 and len(mv.evidence) == 4
    mk = samples("niah_multikey_1", 1024)[0]
    assert len(mk.meta["keys"]) == 4 and len(set(mk.meta["keys"])) == 4
    for other in mk.meta["distractor_needles"]:
        assert other in mk.context and mk.meta["query_key"] not in other
    mk2 = samples("niah_multikey_2", 1024)[0]
    lines = mk2.context.split("\n")
    assert len(lines) > 10 and all(re.fullmatch(r"One of the special magic numbers for \S+ is: \d{7}\.", x) for x in lines)
    assert sum(mk2.meta["query_key"] + " is" in x for x in lines) == 1
    qa = samples("qa_1", 1024)[0]
    assert qa.answer_prefix == "Answer:" and qa.context.startswith("Document 1:\n")
    assert qa.user_message().count(qa.instruction) == 2
    assert (s1.max_new_tokens, qa.max_new_tokens) == (128, 32)


def test_nolima_needle_is_the_only_mention_of_the_character(samples):
    for task in ("nolima_direct", "nolima_assoc"):
        for s in samples(task, 1024):
            name = s.answers[0]
            assert len(re.findall(rf"\b{name}\b", s.context)) == 1
            assert name not in s.question
    d, a = samples("nolima_direct", 1024)[0], samples("nolima_assoc", 1024)[0]
    assert d.evidence == a.evidence and d.question != a.question  # paired variants


def test_nolima_drops_haystack_paragraphs_that_could_answer(tok):
    from qgpm.samples.nolima import CHARACTER_NAMES, NEEDLES

    terms = sorted({t for spec in NEEDLES for t in spec.conflicts})
    neutral = "The committee met on a Tuesday. Minutes were taken and filed. Nobody objected to the agenda."

    def tempting():
        paras = []
        for i, t in enumerate(terms + list(CHARACTER_NAMES)):
            paras += [neutral, f"Paragraph {i} is about {t}. It says little else about {t}."]
        return paras * 3

    for task in ("nolima_direct", "nolima_assoc"):
        for s in generate(task, n=4, length=1024, tokenizer=tok, seed=TEST_SEED, haystack=tempting):
            spec = NEEDLES[s.meta["template_id"]]
            rest = s.context.replace(s.evidence[0], "")
            assert "Paragraph" in rest
            for t in spec.conflicts:
                assert not re.search(rf"(?i)\b{re.escape(t)}\b", rest), (t, s.question)
            assert not re.search(rf"\b{s.answers[0]}\b", rest)


def test_same_seed_same_samples_and_pairing_across_lengths(tok, samples):
    for task in ("niah_multikey_1", "qa_2", "nolima_assoc", "kv_retrieval"):
        again = generate(task, n=1, length=1024, tokenizer=tok, seed=TEST_SEED, depths=DEPTHS)
        assert [s.to_dict() for s in again] == [s.to_dict() for s in samples(task, 1024)[:3]]
        short, long = samples(task, 1024)[1], samples(task, 2048)[1]
        assert short.answers == long.answers and short.question == long.question
        assert short.context != long.context


def test_splits_draw_disjoint_content(tok):
    from qgpm.samples.resources import key_words

    seen: dict[str, dict[str, set]] = {}
    pools: dict[str, set] = {}
    for split in ("calibration", "dev", "test"):
        seed = split_seed(split, 1)
        niah = generate("niah_single_2", n=4, length=600, tokenizer=tok, seed=seed, max_new_tokens=16)
        nolima = generate("nolima_direct", n=4, length=600, tokenizer=tok, seed=seed, max_new_tokens=16)
        qa = generate("qa_1", n=3, length=1024, tokenizer=tok, seed=seed, max_new_tokens=16)
        kv = generate("kv_retrieval", n=3, length=600, tokenizer=tok, seed=seed, max_new_tokens=16)
        seen[split] = {
            "adjective": {s.meta["query_key"].split("-")[0] for s in niah},
            "name": {s.answers[0] for s in nolima},
            "template": {s.meta["template_id"] for s in nolima},
            "article": {s.meta["group"] for s in qa},
            "kv_key": {s.meta["key"] for s in kv},
        }
        assert all(s.meta["split"] == split for s in niah + nolima + qa + kv)
        adjectives = set(key_words(split)[0])
        assert all(s.meta["query_key"].split("-")[0] in adjectives for s in niah)
        pools[split] = adjectives
        slot = ("test", "dev", "calibration").index(split)
        assert all(int(k[0], 16) % 3 == slot for k in seen[split]["kv_key"])
        assert all(g % 3 == slot for g in seen[split]["article"])
    assert not pools["calibration"] & pools["test"] and not pools["calibration"] & pools["dev"]
    assert not pools["dev"] & pools["test"]
    for field in ("adjective", "name", "template", "article", "kv_key"):
        assert not seen["calibration"][field] & seen["test"][field], field
        assert not seen["calibration"][field] & seen["dev"][field], field
        assert not seen["dev"][field] & seen["test"][field], field


def test_alternative_haystacks_and_overrides(tok):
    from qgpm.samples.resources import squad_paragraphs

    squad_text = " ".join(squad_paragraphs()[:2000])
    s = generate("nolima_assoc", n=1, length=1024, tokenizer=tok, seed=TEST_SEED, depths=[0.25], haystack="squad")[0]
    assert s.meta["haystack"] == "squad" and s.evidence[0] in s.context
    first = s.context.split(". ")[0]
    assert first in squad_text
    m = generate("niah_multikey_1", n=1, length=1024, tokenizer=tok, seed=TEST_SEED, haystack="squad", max_new_tokens=8)[0]
    assert m.meta["haystack"] == "squad" and m.max_new_tokens == 8
    assert 0.85 * 1024 <= prompt_tokens(tok, m) + 8 <= 1024
    custom = lambda: ["The tide came in slowly. Gulls circled the pier. " * 3] * 50  # noqa: E731
    c = generate("nolima_direct", n=1, length=700, tokenizer=tok, seed=TEST_SEED, haystack=custom)[0]
    assert "Gulls circled the pier." in c.context and c.evidence[0] in c.context
    with pytest.raises(BudgetError):
        generate("qa_1", n=1, length=120, tokenizer=tok, seed=TEST_SEED)
    with pytest.raises(ValueError):
        generate("kv_retrieval", n=1, length=1024, tokenizer=tok, seed=TEST_SEED, depths=[1.5])
    with pytest.raises(ValueError):
        generate("nope", n=1, length=1024, tokenizer=tok, seed=TEST_SEED)


def test_needle_combos_is_the_draw_the_samples_take(tok):
    """needle_combos(seed)[i] is the (template, name) of sample i: the name is the gold and the
    needle is the template's, so a table can group rows by question without the haystack."""
    from qgpm.samples.nolima import NEEDLES, needle_combos

    for seed in (TEST_SEED, TEST_SEED + 7):
        got = generate("nolima_direct", n=2, length=1024, tokenizer=tok, seed=seed)
        for i, s in enumerate(got):
            t, name = needle_combos(seed)[i]
            assert s.answers == [name] and s.meta["template_id"] == t and NEEDLES[t].needle.format(name=name) in s.context
