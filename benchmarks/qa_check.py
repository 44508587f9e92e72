"""How the QA task's right answers were earned: RULER's QA metric counts an answer right when
any gold string occurs anywhere in it, so two kinds of right answer say nothing about reading
the context:

* **gold in the question**: the sample's gold string occurs in its own question (``"Where is
  the home of the Sunnyside Country Club?"``, gold ``Sunnyside``): an answer that repeats the
  question's words is right;
* **gold only after the first sentence**: the answer's first sentence lacks the gold and a later
  one holds it, as when a model recites context sentences (the moved evidence among them) instead
  of answering.

Per series the table gives the right answers as scored, how many are of each kind, and the
**strict** count (right in the first sentence, on a question that does not contain its gold),
paired against the first series (and ``--against``) on the samples every series ran.

    python benchmarks/qa_check.py benchmarks/results/eval_gemma3_270m_test/rows.jsonl --length 16384 \\
        --series vanilla=HASH,qgpm=HASH,reorder=HASH --against reorder

Questions are drawn again from the rows' split, seed and length (a QA sample's question does not
depend on its depth); a regenerated gold that differs from the row's stops the script.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from qgpm.eval.scoring import is_correct
from qgpm.eval.significance import mcnemar_exact
from qgpm.segment import split_sentences

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grid_table import grid_parser, load_rows, parse_series  # noqa: E402  (the sibling table's arguments and row loading)

QA_TASKS = ("qa_1", "qa_2")


_LABEL_LINE = re.compile(r"^\s*answer\s*:\s*$", re.I)
_ENUMERATOR = re.compile(r"^\(?\d+[.)]$")


def first_sentence(answer: str) -> str:
    """The answer's first sentence: in its first line that is not a bare ``Answer:`` label (a
    plain-text answer may run on), with a list number (``1.``) joined to what follows it."""
    lines = [ln for ln in answer.strip().split("\n") if ln.strip() and not _LABEL_LINE.match(ln)]
    sentences = [x.text for x in split_sentences(lines[0])] if lines else []
    while len(sentences) > 1 and _ENUMERATOR.match(sentences[0]):
        sentences[:2] = [sentences[0] + " " + sentences[1]]
    return sentences[0] if sentences else ""


def gold_in_question(question: str, gold: list[str]) -> bool:
    """True when a gold string occurs in the question (case-insensitive)."""
    q = question.lower()
    return any(g.strip() and g.strip().lower() in q for g in gold)


def kinds(row: dict, question: str) -> dict[str, bool]:
    """What a row's answer earned: ``right`` as scored, ``in_question``, ``late`` (right only
    after the first sentence) and ``strict`` (right in the first sentence, gold not in the question)."""
    right = bool(row["correct"])
    in_q = gold_in_question(question, row["gold"])
    early = right and is_correct(row["metric"], first_sentence(row["answer"] or ""), row["gold"])
    return {"right": right, "in_question": right and in_q, "late": right and not early, "strict": early and not in_q}


def questions(samples: dict[tuple[str, int], tuple[int, int, list[str]]]) -> dict[tuple[str, int], str]:
    """``(task, index) -> question`` for ``samples`` (``(task, index) -> (seed, length, gold)``),
    drawn again with the embedded tokenizer (the question is the same at every depth)."""
    from qgpm.loading import load_tokenizer, resolve_source  # heavy: only when there are QA rows
    from qgpm.samples.tasks import generate

    tok = load_tokenizer(resolve_source(None))
    out: dict[tuple[str, int], str] = {}
    for (task, index), (seed, length, gold) in sorted(samples.items()):
        s = generate(task, n=1, length=length, tokenizer=tok, seed=seed, depths=[0.5])[0]
        if list(s.answers) != list(gold):
            raise SystemExit(f"{task} sample {index}: the regenerated gold {list(s.answers)} differs from the row's {gold}")
        out[(task, index)] = s.question
    return out


def main(argv=None) -> int:
    args = grid_parser(__doc__).parse_args(argv)
    series = parse_series(args.series)
    labels = list(series)
    if args.against is not None and args.against not in labels:
        raise SystemExit(f"--against {args.against!r} is not a label of --series ({', '.join(labels)})")
    rows = {m: {k: r for k, r in by_key.items() if k[0] in QA_TASKS}
            for m, by_key in load_rows(args.rows, series, args.length).items()}
    missing = [m for m in labels if not rows.get(m)]
    if missing:
        raise SystemExit(f"no QA rows at {args.length} tokens for {missing}")
    common = sorted(set.intersection(*(set(rows[m]) for m in labels)), key=str)
    first = rows[labels[0]]
    splits = sorted({first[k]["split"] for k in common})
    if len(splits) > 1:
        raise SystemExit(f"the rows hold several splits ({', '.join(splits)}): give rows of one split")
    samples = {(k[0], k[3]): (first[k]["seed"], first[k]["length"], first[k]["gold"]) for k in common}
    qs = questions(samples)
    got = {m: {k: kinds(rows[m][k], qs[(k[0], k[3])]) for k in common} for m in labels}
    in_q = [f"{t} sample {i}" for (t, i), (_, _, gold) in sorted(samples.items()) if gold_in_question(qs[(t, i)], gold)]
    print(f"{len(common)} QA samples every series ran ({len(samples)} questions), {args.length} tokens. "
          f"Questions that contain their gold: {', '.join(in_q) or 'none'}.\n")

    def pair(m: str, ref: str) -> str:
        w = sum(got[m][k]["strict"] and not got[ref][k]["strict"] for k in common)
        l_ = sum(got[ref][k]["strict"] and not got[m][k]["strict"] for k in common)
        return f"{w}/{l_}, {mcnemar_exact(w, l_):.2g}"

    base, other = labels[0], args.against
    print("| series | right as scored | of them: gold in the question | of them: right only after the first sentence | strict right"
          f" (wins / losses, p against {base}" + (f"; then against {other}" if other else "") + ") |")
    print("|---|---:|---:|---:|---|")
    for m in labels:
        count = {kind: sum(got[m][k][kind] for k in common) for kind in ("right", "in_question", "late", "strict")}
        cell = str(count["strict"])
        if m != base:
            cell += f" ({pair(m, base)}" + (f"; {pair(m, other)}" if other and m != other else "") + ")"
        print(f"| {m} | {count['right']} | {count['in_question']} | {count['late']} | {cell} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
