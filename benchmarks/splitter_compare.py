"""Sentence splitter: qgpm.segment (rules, App. B) against pysbd with character spans.

    python benchmarks/splitter_compare.py --out benchmarks/results/sentence_splitter_data.md

What matters to QGPM is that an evidence sentence is one unit: pass 1 ranks sentences,
so a needle cut in two, or glued to its neighbour, blurs the ranking. Measured on:

* evidence integrity: every evidence string of the bundled sample report (3), the
  cookbook corpus questions (6) and generated benchmark samples (RULER NIAH / QA,
  NoLiMa-style, key-value; calibration split, SmolLM2 tokenizer) -- *aligned* = a
  sentence starts where the evidence starts and one ends where it ends; *intact* = no
  sentence starts inside it (single-sentence evidence: every source but QA paragraphs
  and multi-line key-value records);
* boundary agreement on the RULER haystacks (Paul Graham essays, SQuAD paragraphs) and
  the bundled corpora, with sampled disagreements printed for reading;
* speed.

Both splitters cut at line breaks (qgpm's rule; pysbd runs per line) and cut units over
600 characters at whitespace, so only the punctuation rules differ. NLTK punkt is not
measured: its model data is not installed here and cannot be downloaded (no network).
pysbd is optional: ``pip install pysbd`` (measured with 0.3.4).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from qgpm.segment import _cut_long, split_sentences  # noqa: E402

Spans = list[tuple[int, int]]


def _strip_span(text: str, a: int, b: int) -> tuple[int, int] | None:
    piece = text[a:b]
    if not piece.strip():
        return None
    lead = len(piece) - len(piece.lstrip())
    trail = len(piece) - len(piece.rstrip())
    return a + lead, b - trail


def qgpm_spans(text: str) -> Spans:
    out = []
    for s in split_sentences(text):
        sp = _strip_span(text, s.start, s.end)
        if sp:
            out.append(sp)
    return out


def pysbd_spans_fn() -> Callable[[str], Spans] | None:
    try:
        import pysbd
    except ImportError:
        return None
    seg = pysbd.Segmenter(language="en", clean=False, char_span=True)

    def spans(text: str) -> Spans:
        out: Spans = []
        pos = 0
        for line in text.split("\n"):
            if line.strip():
                cuts = []
                for s in seg.segment(line):
                    cuts.append((pos + s.start, pos + s.end))
                # pysbd's char spans come from str.find on the sentence text: re-tile them
                starts = sorted({a for a, _ in cuts} | {pos})
                bounds = starts + [pos + len(line)]
                for a, b in zip(bounds, bounds[1:]):
                    for c0, c1 in zip([a, *_cut_long(text, a, b, 600)], [*_cut_long(text, a, b, 600), b]):
                        sp = _strip_span(text, c0, c1)
                        if sp:
                            out.append(sp)
            pos += len(line) + 1
        return out

    return spans


# ----------------------------------------------------------------------------- evidence


def evidence_cases(n: int, lengths: list[int]) -> list[tuple[str, str, str, bool]]:
    """``(source, text, evidence, single_sentence)`` for every evidence string."""
    from qgpm.cli import sample_document

    cases = []
    report, questions = sample_document()
    cases += [("sample report", report, q["evidence"], True) for q in questions]
    corpus = ROOT / "cookbooks" / "data"
    for q in json.loads((corpus / "questions.json").read_text()):
        cases.append(("cookbook corpus", (corpus / "corpus" / q["file"]).read_text(), q["evidence"], True))

    from qgpm.samples.tasks import generate
    from qgpm.loading import default_model_source, load_tokenizer

    tok = load_tokenizer(default_model_source())
    for task in ("niah_single_2", "niah_multikey_1", "niah_multivalue", "qa_1", "nolima_direct", "nolima_assoc", "kv_retrieval"):
        for length in lengths:
            for s in generate(task, n=n, length=length, tokenizer=tok, seed=2_000_000, depths=[0.0, 0.5, 1.0]):
                docs = s.context if isinstance(s.context, list) else [s.context]
                for ev in s.evidence:
                    doc = next((d for d in docs if ev in d), None)
                    if doc is not None:
                        cases.append((task, doc, ev, task not in ("qa_1",) and "\n" not in ev.strip()))
    return cases


def evidence_table(cases, splitters: dict[str, Callable[[str], Spans]]) -> tuple[list[str], dict]:
    by_source: dict[str, dict[str, list[int]]] = {}
    failures: dict[str, list[str]] = {name: [] for name in splitters}
    cache: dict[tuple[str, int], Spans] = {}
    for source, text, ev, single in cases:
        a = text.find(ev.strip())
        b = a + len(ev.strip())
        for name, fn in splitters.items():
            key = (name, id(text))
            if key not in cache:
                cache[key] = fn(text)
            spans = cache[key]
            starts = {s for s, _ in spans}
            ends = {e for _, e in spans}
            aligned = a in starts and b in ends
            intact = not any(a < s < b for s in starts)
            row = by_source.setdefault(source, {}).setdefault(name, [0, 0, 0, 0])
            row[0] += 1
            row[1] += aligned
            row[2] += single
            row[3] += single and intact
            if not (aligned and (intact or not single)) and len(failures[name]) < 12:
                cut = sorted(s for s in starts if a - 80 <= s <= b + 80)
                failures[name].append(f"{source}: evidence {ev.strip()[:90]!r}; unit starts near it at {[s - a for s in cut]} (relative)")
    lines = ["| source | evidence | " + " | ".join(f"{n}: aligned | {n}: single sentence intact" for n in splitters) + " |",
             "|---|---:|" + "---:|---:|" * len(splitters)]
    totals = {n: [0, 0, 0, 0] for n in splitters}
    for source, rows in by_source.items():
        cells = []
        for name in splitters:
            r = rows[name]
            for i in range(4):
                totals[name][i] += r[i]
            cells += [f"{r[1]}/{r[0]}", f"{r[3]}/{r[2]}" if r[2] else "-"]
        lines.append(f"| {source} | {rows[next(iter(splitters))][0]} | " + " | ".join(cells) + " |")
    cells = []
    for name in splitters:
        t = totals[name]
        cells += [f"**{t[1]}/{t[0]}**", f"**{t[3]}/{t[2]}**"]
    lines.append(f"| all | {totals[next(iter(splitters))][0]} | " + " | ".join(cells) + " |")
    return lines, {"totals": totals, "failures": failures}


# ----------------------------------------------------------------------------- agreement


def haystacks(max_chars: int, squad_paragraphs: int) -> dict[str, str]:
    from qgpm.cli import sample_document
    from qgpm.samples import resources

    corpus = "\n\n".join(p.read_text() for p in sorted((ROOT / "cookbooks" / "data" / "corpus").glob("*.md")))
    return {
        "Paul Graham essays (RULER)": resources.essay_text()[:max_chars],
        "SQuAD paragraphs (RULER)": "\n\n".join(resources.squad_paragraphs()[:squad_paragraphs]),
        "bundled corpora (cookbook + sample report)": corpus + "\n\n" + sample_document()[0],
    }


def _show(text: str, pos: int) -> str:
    left, right = text[max(0, pos - 70) : pos], text[pos : pos + 50]
    return (left + " ⟂ " + right).replace("\n", "\\n").replace("|", "\\|")


def agreement(texts: dict[str, str], a_name: str, a_fn, b_name: str, b_fn, examples: int, seed: int = 0):
    rows, samples, speed = [], {}, {}
    rng = random.Random(seed)
    for label, text in texts.items():
        t = time.perf_counter()
        a = {s for s, _ in a_fn(text)}
        ta = time.perf_counter() - t
        t = time.perf_counter()
        b = {s for s, _ in b_fn(text)}
        tb = time.perf_counter() - t
        both = a & b
        rows.append(f"| {label} | {len(text):,} | {len(a):,} | {len(b):,} | {len(both):,} | {len(a - b):,} | {len(b - a):,} |")
        speed[label] = (len(text), ta, tb)
        only_a, only_b = sorted(a - b), sorted(b - a)
        samples[label] = (
            [_show(text, p) for p in rng.sample(only_a, min(examples, len(only_a)))],
            [_show(text, p) for p in rng.sample(only_b, min(examples, len(only_b)))],
        )
    return rows, samples, speed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="markdown file to write (default: print)")
    ap.add_argument("--n", type=int, default=3, help="samples per task, length and depth (default 3)")
    ap.add_argument("--lengths", default="2048", help="sample lengths in tokens, comma list (default 2048)")
    ap.add_argument("--haystack-chars", type=int, default=200_000, help="characters of the essay haystack (default 200000)")
    ap.add_argument("--squad-paragraphs", type=int, default=400, help="SQuAD paragraphs (default 400)")
    ap.add_argument("--examples", type=int, default=12, help="sampled disagreements shown per direction (default 12)")
    args = ap.parse_args(argv)

    pysbd_fn = pysbd_spans_fn()
    if pysbd_fn is None:
        print("pysbd is not installed (pip install pysbd): nothing to compare", file=sys.stderr)
        return 2
    import pysbd

    splitters = {"qgpm": qgpm_spans, "pysbd": pysbd_fn}
    cases = evidence_cases(args.n, [int(x) for x in args.lengths.split(",")])
    ev_lines, ev = evidence_table(cases, splitters)
    ag_rows, samples, speed = agreement(haystacks(args.haystack_chars, args.squad_paragraphs), "qgpm", qgpm_spans, "pysbd", pysbd_fn, args.examples)

    md = [
        "# Sentence splitter: qgpm.segment vs pysbd",
        "",
        f"Command: `python benchmarks/splitter_compare.py {' '.join(argv if argv is not None else sys.argv[1:])}` "
        f"(pysbd {getattr(pysbd, '__version__', '?')}, `Segmenter(language='en', clean=False, char_span=True)`, run per line; "
        "both cut units over 600 characters at whitespace). NLTK punkt: not measured (its model data is not installed and "
        "cannot be downloaded here).",
        "",
        "## Evidence integrity",
        "",
        "*aligned*: a unit starts where the evidence starts and one ends where it ends. *intact*: no unit starts inside a "
        "single-sentence evidence string. Benchmark samples: calibration split, depths 0, 0.5, 1.",
        "",
        *ev_lines,
        "",
    ]
    for name, fails in ev["failures"].items():
        if fails:
            md += [f"First evidence strings {name} does not keep whole:", ""] + [f"- {f}" for f in fails] + [""]
    md += [
        "## Boundary agreement",
        "",
        "Unit starts (first visible character of each unit) found by each splitter.",
        "",
        "| text | characters | qgpm units | pysbd units | same start | only qgpm | only pysbd |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *ag_rows,
        "",
        "| text | qgpm s per 100K chars | pysbd s per 100K chars |",
        "|---|---:|---:|",
        *[f"| {k} | {1e5 * ta / n:.3f} | {1e5 * tb / n:.3f} |" for k, (n, ta, tb) in speed.items()],
        "",
        f"## Sampled disagreements ({args.examples} per direction and text; ⟂ marks the boundary)",
        "",
    ]
    for label, (only_a, only_b) in samples.items():
        md += [f"### {label}", "", "qgpm starts a unit here, pysbd does not:", ""] + [f"- `{s}`" for s in only_a] + [""]
        md += ["pysbd starts a unit here, qgpm does not:", ""] + [f"- `{s}`" for s in only_b] + [""]
    text = "\n".join(md) + "\n"
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
        print(f"wrote {args.out}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
