"""The documentation as a user meets it: the README's snippets run as written, every results
table cites a committed result file, and the project's own text carries no development history."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
RUNNABLE = "<!-- runnable -->"

# Development history in the project's own text: ordinals before "session", "this/previous/last
# session", "issue N". Written in pieces so that this file does not match itself.
_S = "sess" + "ion"
_ORDINALS = ("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|fourteenth|fifteenth|"
             "sixteenth|seventeenth|eighteenth|nineteenth|twentieth|\\d+(?:st|nd|rd|th)")
HISTORY = re.compile(rf"\b(?:(?:{_ORDINALS}) {_S}|(?:this|previous|last|earlier|next) {_S}|{_S}s? (?:ago|since)|iss" + r"ue #?\d+)\b",
                     re.IGNORECASE)
TEXT_SUFFIXES = {".py", ".md", ".sh", ".txt", ".toml", ".cfg", ".yaml", ".yml", ".json", ".html"}


def _tracked_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    files = [ROOT / p for p in out.splitlines() if Path(p).suffix in TEXT_SUFFIXES]
    return [f for f in files if f.is_file() and f.stat().st_size < 5_000_000 and not f.name.endswith(".jsonl")]


def test_the_history_rule_catches_what_it_should_and_passes_ordinary_uses():
    assert HISTORY.search("as measured in the seventeenth " + _S)
    assert HISTORY.search("see iss" + "ue 37 for the plan") and HISTORY.search("This " + _S + " ran the grid")
    assert not HISTORY.search("a pytest " + _S + "-scoped fixture") and not HISTORY.search("an HTTP " + _S + " with retries")
    assert not HISTORY.search("requests." + _S.capitalize() + "()") and not HISTORY.search("tis" + "sue 12")  # a word that ends in the same letters


def test_no_development_history_in_the_projects_own_text():
    hits = []
    for f in _tracked_text_files():
        for n, line in enumerate(f.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if HISTORY.search(line):
                hits.append(f"{f.relative_to(ROOT)}:{n}: {line.strip()[:120]}")
    assert not hits, "development history (say when with a date or commit, how with the command):\n" + "\n".join(hits[:40])


def _sections(text: str) -> list[tuple[str, str]]:
    """``(heading, body)`` per markdown section (any heading level)."""
    parts = re.split(r"^(#{1,6} .*)$", text, flags=re.MULTILINE)
    return [("", parts[0])] + [(parts[i], parts[i + 1]) for i in range(1, len(parts) - 1, 2)]


CITED = re.compile(r"`((?:benchmarks|scripts|docs|tests|qgpm)/[^`\s]+?)`")


@pytest.mark.parametrize("page", ["README.md", "docs/results.md"])
def test_every_results_table_cites_a_committed_result_file_that_exists(page):
    text = (ROOT / page).read_text(encoding="utf-8")
    missing = sorted({p for p in CITED.findall(text) if not (ROOT / p.split("#")[0].split(":")[0]).exists()})
    assert not missing, f"{page} cites files that do not exist: {missing}"
    uncited = []
    for heading, body in _sections(text):
        has_table = re.search(r"^\|.*\|\s*$\n^\|[-:| ]+\|\s*$", body, flags=re.MULTILINE)
        numbers = has_table and re.search(r"^\|.*\d.*\|\s*$", body, flags=re.MULTILINE)
        if numbers and not any(p.startswith("benchmarks/results/") for p in CITED.findall(body)):
            uncited.append(heading or "(top)")
    assert not uncited, f"{page}: tables of numbers without a cited benchmarks/results file: {uncited}"


def test_the_readme_fits_on_a_few_screens_and_marks_its_runnable_snippets():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 260
    assert len(_runnable_blocks(text)) >= 3  # quick start, LangChain, LlamaIndex


def _runnable_blocks(text: str) -> list[str]:
    return re.findall(re.escape(RUNNABLE) + r"\s*\n```python\n(.*?)\n```", text, flags=re.DOTALL)


@pytest.mark.real_model
@pytest.mark.parametrize("index", range(len(_runnable_blocks(README.read_text(encoding="utf-8")))))
def test_the_readmes_runnable_snippets_run_as_written(index, capsys):
    code = _runnable_blocks(README.read_text(encoding="utf-8"))[index]
    exec(compile(code, f"README.md snippet {index}", "exec"), {"__name__": f"readme_snippet_{index}"})
    assert capsys.readouterr().out.strip(), "a README snippet should print what it shows"


def _field_rows(text: str) -> dict[str, list[str]]:
    """The field tables of docs/configuration.md: field name -> its three value cells."""
    rows = {}
    for line in text.splitlines():
        m = re.match(r"^\| `(\w+)` \|(.*)$", line)
        if m:
            rows[m.group(1)] = [c.strip() for c in m.group(2).split("|")][:3]
    return rows


def _cell_value(cell: str):
    import ast

    return ast.literal_eval(cell.split(" (")[0].strip().strip("`"))


def test_the_configuration_tables_show_the_codes_values():
    """Every field's columns `QGPMConfig()` / `RECIPE` / SmolLM2 in docs/configuration.md
    equal the values in the code (the page says they are read from it)."""
    from qgpm import QGPMConfig
    from qgpm.config import PRESETS, RECIPE, SMOLLM2_KEY

    configs = (QGPMConfig(), RECIPE, PRESETS[SMOLLM2_KEY])
    rows = _field_rows((ROOT / "docs" / "configuration.md").read_text(encoding="utf-8"))
    fields = [f for f in rows if hasattr(QGPMConfig(), f)]
    assert len(fields) >= 20, f"only {len(fields)} field rows found"
    wrong = {f: ([_cell_value(c) for c in rows[f]], [getattr(c, f) for c in configs]) for f in fields
             if [_cell_value(c) for c in rows[f]] != [getattr(c, f) for c in configs]}
    assert not wrong, f"docs/configuration.md (table, code): {wrong}"


def test_the_configuration_table_check_reads_a_wrong_cell():
    rows = _field_rows('| `relevance` | `"heads"` | `"heads"` | `"minilm"` | where z comes from |\n')
    assert [_cell_value(c) for c in rows["relevance"]] == ["heads", "heads", "minilm"]
    assert _cell_value("8.0 (–, one map)") == 8.0 and _cell_value("`None`") is None


def _details_table_keys(text: str) -> set[str]:
    """The keys named in the first column of docs/api.md's result.details table."""
    start = text.index("| key | set for | meaning |")
    keys = set()
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        keys.update(re.findall(r"`(\w+)`", line.split("|")[1]))
    return keys


def test_every_named_fact_of_a_call_is_in_the_details_table():
    """docs/api.md's result.details table names every field of Diagnostics, so a user can look
    up any key a result carries."""
    from qgpm.diagnostics import FIELDS

    documented = _details_table_keys((ROOT / "docs" / "api.md").read_text(encoding="utf-8"))
    missing = [f for f in FIELDS if f not in documented]
    assert not missing, f"Diagnostics fields missing from docs/api.md's result.details table: {missing}"


def test_the_details_table_reader_sees_a_missing_key():
    table = "| key | set for | meaning |\n|---|---|---|\n| `pass2` | `qgpm` | how |\n| `s_low`, `promoted` | x | y |\n\nafter"
    assert _details_table_keys(table) == {"pass2", "s_low", "promoted"}
