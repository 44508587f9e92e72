"""The snippets of the README and docs/ as a reader copies them. Python: each parses, every
qgpm name it imports exists, and every keyword it passes to a qgpm function, a qgpm class or a
method of an object it built from one is a keyword that call takes; the ones of docs/ marked
runnable run as written, a page's snippets in one namespace, in page order, as a reader follows
the page (the README's own run in test_docs.py). Shell: every ``qgpm`` command line parses
with the command line's own parser."""

from __future__ import annotations

import ast
import contextlib
import importlib
import io
import inspect
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUNNABLE = "<!-- runnable -->"
PACKAGES = ("qgpm", "qgpm_integrations")
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_BLOCK = re.compile(r"(" + re.escape(RUNNABLE) + r"\s*\n)?```python\n(.*?)\n```", flags=re.DOTALL)


def _blocks(page: Path) -> list[tuple[int, bool, str]]:
    """``(line, runnable, code)`` for every python block of ``page``."""
    text = page.read_text(encoding="utf-8")
    return [(text[: m.start(2)].count("\n"), bool(m.group(1)), m.group(2)) for m in _BLOCK.finditer(text)]


def _keywords_taken(target: Any) -> set[str] | None:
    """The keyword names ``target(...)`` takes, or ``None`` where it takes any (``**kwargs``).
    A pydantic model takes its field names, their aliases and its constructor's parameters."""
    try:
        params = list(inspect.signature(target).parameters.values())
    except (TypeError, ValueError):
        params = None
    named = {p.name for p in params or [] if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    fields = getattr(target, "model_fields", None) if isinstance(target, type) else None
    if isinstance(fields, dict):
        aliases = {a for info in fields.values() for a in (info.alias, info.validation_alias) if isinstance(a, str)}
        return set(fields) | aliases | named
    if params is None or any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return named


class _Built:
    """An object a snippet built from a qgpm class: its methods resolve, its other attributes
    exist or not but have no known type."""

    def __init__(self, cls: type):
        self.cls = cls

    def has(self, attr: str) -> bool:
        own = [c for c in self.cls.__mro__ if c.__module__.split(".")[0] in PACKAGES]
        return (hasattr(self.cls, attr) or attr in getattr(self.cls, "model_fields", {})
                or any(attr in getattr(c, "__annotations__", {}) or f"self.{attr} " in inspect.getsource(c) for c in own))

    def method(self, attr: str) -> Any:
        found = inspect.getattr_static(self.cls, attr, None)
        return getattr(self.cls, attr) if inspect.isfunction(found) or isinstance(found, (classmethod, staticmethod)) else None


def _snippet_faults(code: str) -> list[str]:
    """What in ``code`` names a qgpm thing that does not exist or passes it a keyword it does
    not take. Objects are followed through plain assignments: ``x = Cls(...)`` and
    ``x = Cls.from_...(...)`` make ``x.method(...)`` a call of ``Cls.method``."""
    tree = ast.parse(code)
    names: dict[str, Any] = {}
    faults: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES:
            try:
                module = importlib.import_module(node.module)
            except ImportError as exc:
                faults.append(f"line {node.lineno}: from {node.module} import ... fails: {exc}")
                continue
            for alias in node.names:
                if hasattr(module, alias.name):
                    names[alias.asname or alias.name] = getattr(module, alias.name)
                else:
                    faults.append(f"line {node.lineno}: {node.module} has no {alias.name}")

    def resolve(expr: ast.expr) -> Any:
        if isinstance(expr, ast.Name):
            return names.get(expr.id)
        if not isinstance(expr, ast.Attribute):
            return None
        owner = resolve(expr.value)
        if owner is None:
            return None
        exists = owner.has(expr.attr) if isinstance(owner, _Built) else (
            hasattr(owner, expr.attr) or expr.attr in getattr(owner, "model_fields", {}))
        if not exists:
            what = owner.cls.__name__ + " object" if isinstance(owner, _Built) else getattr(owner, "__name__", repr(owner))
            faults.append(f"line {expr.lineno}: {ast.unparse(expr)}: {what} has no {expr.attr}")
            return None
        return owner.method(expr.attr) if isinstance(owner, _Built) else getattr(owner, expr.attr, None)

    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            maker = resolve(node.value.func)
            cls = maker if isinstance(maker, type) else getattr(maker, "__self__", None)
            if isinstance(cls, type) and (maker is cls or getattr(maker, "__name__", "").startswith("from_")):
                names.update({t.id: _Built(cls) for t in node.targets if isinstance(t, ast.Name)})
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            target = resolve(node.func)
            taken = _keywords_taken(target) if target is not None else None
            for kw in node.keywords:
                if taken is not None and kw.arg is not None and kw.arg not in taken:
                    faults.append(f"line {node.lineno}: {ast.unparse(node.func)}() takes no keyword {kw.arg!r}")
    return list(dict.fromkeys(faults))  # an attribute resolved for an assignment and again for its call


def test_every_python_snippet_in_the_docs_names_what_the_code_has():
    faults, checked = [], 0
    for page in PAGES:
        for line, _, code in _blocks(page):
            checked += 1
            faults += [f"{page.relative_to(ROOT)} (block at line {line + 1}) {f}" for f in _snippet_faults(code)]
    assert checked >= 20, checked
    assert not faults, "\n".join(faults)


def test_the_snippet_check_finds_a_wrong_name_and_a_wrong_keyword():
    stale = (
        "from qgpm import QGPM, QGPMConfig, NoSuchThing\n"
        "engine = QGPM.from_pretrained()\n"
        "cfg = QGPMConfig(k_brod=2.0)\n"
        "engine.replan(None, confg=cfg)\n"
        "engine.answr('c', 'q')\n"
        "print(engine.config.k_broad, engine.model)\n"
    )
    assert sorted(f.split(": ", 1)[1] for f in _snippet_faults(stale)) == [
        "QGPMConfig() takes no keyword 'k_brod'", "engine.answr: QGPM object has no answr",
        "engine.replan() takes no keyword 'confg'", "qgpm has no NoSuchThing"]
    fine = "from qgpm import QGPM\nengine = QGPM.from_pretrained(device_map='cpu')\nengine.answer_many([], max_concurrency=2)\n"
    assert _snippet_faults(fine) == []


def test_the_snippet_check_reads_a_pydantic_models_fields_and_aliases():
    pytest.importorskip("langchain_core")
    ok = "from qgpm_integrations.langchain import QGPMChatModel\nllm = QGPMChatModel(max_tokens=8, max_new_tokens=8, method='qgpm')\n"
    assert _snippet_faults(ok) == []
    assert _snippet_faults("from qgpm_integrations.langchain import QGPMChatModel\nQGPMChatModel(max_token=8)\n")


_RUNNABLE_PAGES = [p for p in PAGES[1:] if any(runnable for _, runnable, _ in _blocks(p))]


@pytest.mark.real_model
@pytest.mark.parametrize("page", [p.relative_to(ROOT).as_posix() for p in _RUNNABLE_PAGES])
def test_the_runnable_snippets_of_a_docs_page_run_as_written(page, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a snippet may write files (why.html, relevance.png)
    namespace: dict[str, Any] = {"__name__": "docs_snippets"}
    for line, runnable, code in _blocks(ROOT / page):
        if runnable:
            exec(compile(code, f"{page} (block at line {line + 1})", "exec"), namespace)
            assert capsys.readouterr().out.strip(), f"{page}: the snippet at line {line + 1} should print what it shows"


@pytest.mark.parametrize(("page", "at_least"), [("docs/api.md", 7), ("docs/integrations.md", 5)])
def test_the_api_and_integrations_pages_mark_their_self_contained_snippets_runnable(page, at_least):
    """The snippets left unmarked name a user's own model, file or server."""
    marked = [line for line, runnable, _ in _blocks(ROOT / page) if runnable]
    assert len(marked) >= at_least, marked


def _shell_blocks(text: str) -> list[tuple[int, list[str]]]:
    """``(first line, lines)`` of every fenced block tagged bash or sh, or untagged."""
    blocks: list[tuple[int, list[str]]] = []
    current: tuple[str, int, list[str]] | None = None  # (tag, first line, lines) inside a fence
    for n, line in enumerate(text.split("\n"), 1):
        if current is None and line.startswith("```"):
            current = (line[3:].strip(), n + 1, [])
        elif current is not None and line.strip() == "```":
            if current[0] in ("bash", "sh", ""):
                blocks.append(current[1:])
            current = None
        elif current is not None:
            current[2].append(line)
    return blocks


_QGPM = re.compile(r"^(?:\S*/)?qgpm$")


def _command_lines(page: Path) -> list[tuple[int, list[str]]]:
    """``(line, argv)`` for every ``qgpm ...`` command in the shell blocks of ``page`` (lines
    joined at a trailing backslash, comments dropped, one command per ``&&`` / ``;`` / ``|``).
    A line that names qgpm and does not split into words is returned as ``["<unbalanced quotes>"]``."""
    text = page.read_text(encoding="utf-8")
    found = []
    for first, lines in _shell_blocks(text):
        joined, start = "", first
        for offset, raw in enumerate(lines):
            start = first + offset if not joined else start
            joined += raw[:-1] + " " if raw.endswith("\\") else raw
            if raw.endswith("\\"):
                continue
            line, joined = joined, ""
            if "qgpm" not in line:
                continue
            lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            try:
                words, command = list(lexer), []
            except ValueError:
                found.append((start, ["<unbalanced quotes>"]))
                continue
            for word in [*words, ";"]:
                if word in ("&&", ";", "|", "||"):
                    if command and _QGPM.match(command[0]):
                        found.append((start, command[1:]))
                    command = []
                else:
                    command.append(word)
    return found


def _parse_error(argv: list[str]) -> str | None:
    """What ``qgpm``'s own parser says of ``argv`` (``None`` when it parses)."""
    from qgpm.cli import build_parser

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(argv)
    except SystemExit as exc:
        return (err.getvalue().strip().splitlines() or [f"exit {exc.code}"])[-1] if exc.code else None
    return None


def test_every_qgpm_command_line_in_the_docs_parses():
    faults, checked = [], 0
    for page in PAGES:
        for line, argv in _command_lines(page):
            checked += 1
            error = _parse_error(argv)
            if error:
                faults.append(f"{page.relative_to(ROOT)}:{line}: qgpm {shlex.join(argv)}\n    {error}")
    assert checked >= 20, checked
    assert not faults, "\n".join(faults)


def test_the_command_line_check_reads_a_stale_flag(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```bash\nqgpm ask --methods vanilla,qgpm \\\n  --max-new-tokens 8   # fine\n"
                    "bash scripts/setup.sh && .venv/bin/qgpm eval --out runs/x --lenghts 2048\n```\n", encoding="utf-8")
    (first, ok), (second, stale) = _command_lines(page)
    assert (first, ok) == (2, ["ask", "--methods", "vanilla,qgpm", "--max-new-tokens", "8"]) and _parse_error(ok) is None
    assert second == 4 and "unrecognized arguments: --lenghts 2048" in _parse_error(stale)
