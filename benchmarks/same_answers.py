"""Do a run's answers equal the committed ones? Row by row, on the same samples and series.

    python benchmarks/same_answers.py runs/slice30 benchmarks/results/eval_smollm2_test

Each row of the run folder (``rows*.jsonl``, deduplicated) is matched to the committed row
with the same task, length, depth, index, method and config hash; the answer texts are
compared. Prints the counts per series and every difference; exit code 1 when any answer
differs or a row has no committed match.

``--series NEW=OLD`` (repeatable) matches the run's series ``NEW`` to the committed ``OLD``
(hash prefixes): a config with ``pass1_dtype="auto"`` hashes what "auto" resolves to on the
machine, so on a CPU without native bfloat16 the same command writes the SmolLM2 preset's rows
under 542941 where the committed ones are 5b41b7.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from qgpm.eval.rows import dedupe_rows, read_rows  # noqa: E402


def key(row: dict, aliases: dict[str, str] | None = None) -> tuple:
    series = row["config_hash"]
    series = (aliases or {}).get(series, series)
    return row["task"], int(row["length"]), row["depth"], int(row["index"]), row["method"], series


def alias(text: str) -> tuple[str, str]:
    new, sep, old = text.partition("=")
    if not sep or not new or not old:
        raise argparse.ArgumentTypeError(f"--series takes NEW=OLD hash prefixes, got {text!r}")
    return new, old


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="a qgpm eval --out folder")
    ap.add_argument("committed", help="a committed results folder")
    ap.add_argument("--series", type=alias, action="append", default=[], metavar="NEW=OLD",
                    help="match the run's series NEW to the committed series OLD (config hash prefixes)")
    args = ap.parse_args()
    for folder in (args.run, args.committed):
        if not (Path(folder) / "rows.jsonl").is_file() and not list(Path(folder).glob("rows.rank*.jsonl")):
            ap.error(f"{folder} holds no rows (rows.jsonl): give a qgpm eval --out folder")
    committed_rows = read_rows(args.committed, include_ranks=False)
    aliases = {}
    for new, old in args.series:
        full = {r["config_hash"] for r in committed_rows if r["config_hash"].startswith(old)}
        if len(full) != 1:
            ap.error(f"--series {new}={old}: {len(full)} committed series start with {old!r}; give a prefix of exactly one")
        aliases[new] = full.pop()
    committed = {key(r): r for r in committed_rows}
    run = dedupe_rows(read_rows(args.run))
    for new in list(aliases):
        full = {r["config_hash"] for r in run if r["config_hash"].startswith(new)}
        if len(full) != 1:
            ap.error(f"--series {new}=...: {len(full)} series of the run start with {new!r}; give a prefix of exactly one")
        aliases[full.pop()] = aliases.pop(new)
    counts: dict[tuple, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
    bad = 0
    for r in run:
        c = counts[(r["method"], r["config_hash"][:6])]
        old = committed.get(key(r, aliases))
        if old is None:
            c[2] += 1
            bad += 1
            print("no committed row:", key(r, aliases))
        elif old["answer"] == r["answer"]:
            c[0] += 1
        else:
            c[1] += 1
            bad += 1
            print("different:", key(r), repr((old["answer"] or "")[:80]), "->", repr((r["answer"] or "")[:80]),
                  *(f"(error: {x['error'][:80]})" for x in (old, r) if x.get("error")))
    for (method, series), (same, diff, missing) in sorted(counts.items()):
        print(f"{method} {series}: {same} identical, {diff} different, {missing} without a committed row")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
