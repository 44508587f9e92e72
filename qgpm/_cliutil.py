"""Pieces every ``qgpm`` subcommand shares: the parser class, flag types and error handling.

Besides the standard library, module level imports only modules of the package (``import
qgpm`` has loaded all of them but :mod:`qgpm.samples.tasks`, the tasks ``tasks_arg`` checks).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Any, Callable, NoReturn, Sequence

from qgpm.config import QGPMConfig
from qgpm.config_files import load_config
from qgpm.defaults import METHODS
from qgpm.explain import printable
from qgpm.loading import resolve_source, source_fingerprint
from qgpm.samples.tasks import TASKS

__all__ = ["QGPMArgumentParser", "UsageError", "csv_list", "methods_arg", "tasks_arg", "run_cli", "run_command", "DEVICE_HELP", "DTYPE_HELP", "HEADS_HELP", "CONFIG_HELP", "RERANKER_HELP", "VLLM_URL_HELP", "VLLM_MODEL_HELP", "VLLM_TIMEOUT_HELP", "vllm_server_args"]

DEVICE_HELP = "cpu | cuda | cuda:N | auto (default auto: the first GPU if torch sees one, else the CPU; under accelerate launch, cuda = each process's own GPU)"
DTYPE_HELP = "float32 | bfloat16 | float16 | auto (default auto: the checkpoint's dtype)"
VLLM_URL_HELP = ("run pass 2 and decoding on a vLLM server at this address (e.g. http://127.0.0.1:8000, started with "
                 "scripts/vllm_server.sh); pass 1 stays here. Methods whose plan needs per-plane positions (remap stride / move, "
                 "STRING, Ms-PoE, Self-Extend) are refused")
VLLM_MODEL_HELP = "the served model's name on the --vllm-url server (default: the only model it serves)"
VLLM_TIMEOUT_HELP = ("seconds to wait for each answer chunk from the --vllm-url server (default 120: a call queued behind others "
                     "waits for their prefills first)")


def vllm_server_args(args: Any) -> dict[str, Any] | None:
    """``VLLMServer``'s keyword arguments from ``--vllm-url`` / ``--vllm-model`` / ``--vllm-timeout``,
    or ``None`` without ``--vllm-url``; the other two without it, or a timeout that is not a positive
    number of seconds, raise :class:`UsageError` (before any model loads)."""
    url, model, timeout = getattr(args, "vllm_url", None), getattr(args, "vllm_model", None), getattr(args, "vllm_timeout", None)
    if not url:
        given = [flag for flag, value in (("--vllm-model", model), ("--vllm-timeout", timeout)) if value is not None]
        if given:
            raise UsageError(f"{' and '.join(given)} only apply with --vllm-url: add --vllm-url URL, or leave {'them' if len(given) > 1 else 'it'} out")
        return None
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        raise UsageError(f"--vllm-timeout must be a positive number of seconds, got {timeout}")
    return {"model": model, **({"timeout": timeout} if timeout is not None else {})}
HEADS_HELP = ("head set for pass 1: stored (default: the set stored for this model, found by its fingerprint) | "
              "a head-set JSON file | 'layer:head,...' e.g. 14:3,15:6 | calibrate (calibrate now, not stored); read only where "
              "the config ranks with the heads (--config relevance=heads: the recipe and the presets rank with minilm)")
RERANKER_HELP = "reranker spec for topk/reorder: minilm | bm25 | judge | judge:<model> | cross-encoder:<model> | embedding:<model> (default: qgpm.defaults.DEFAULT_RERANKER, minilm)"
CONFIG_HELP = ("QGPM settings: a JSON file (e.g. best_config.json from `qgpm tune`) and/or FIELD=VALUE overrides of "
               "QGPMConfig fields (repeatable, e.g. --config k_sharp=3); overrides apply on top of the file, else on top of "
               "the model's preset")


class UsageError(Exception):
    """Bad command-line input found after parsing: printed as one line, exit code 2."""


class QGPMArgumentParser(argparse.ArgumentParser):
    """argparse with one-line errors: ``qgpm eval: error: ... (see qgpm eval --help)``, exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {_one_line(message)} (see {self.prog} --help)\n")

    def add_subparsers(self, **kwargs: Any) -> Any:
        """argparse's, kept as ``self.commands`` so that a command's own parser reports its errors."""
        self.commands = super().add_subparsers(**kwargs)
        return self.commands


def _one_line(msg: Any) -> str:
    """An error message on one line, its control characters shown (it may quote a document)."""
    return printable(" ".join(str(msg).split()))


def csv_list(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def methods_arg(allowed: Sequence[str] | None = None) -> Callable[[str], list[str]]:
    """An argparse type: a comma list of methods, each checked against ``allowed`` (default: all)."""

    def parse(s: str) -> list[str]:
        choices = list(allowed or METHODS)
        methods = list(dict.fromkeys(csv_list(s)))
        bad = [m for m in methods if m not in choices]
        if bad or not methods:
            raise argparse.ArgumentTypeError(f"unknown method(s) {bad or [s]}; choose from {', '.join(choices)}")
        return methods

    parse.__name__ = "methods"
    return parse


def tasks_arg(s: str) -> list[str]:
    """An argparse type: a comma list of evaluation tasks or ``all``, each checked."""
    if s.strip().lower() == "all":
        return list(TASKS)
    tasks = csv_list(s)
    bad = [t for t in tasks if t not in TASKS]
    if bad or not tasks:
        raise argparse.ArgumentTypeError(f"unknown task(s) {bad or [s]}; choose from {', '.join(TASKS)} or all")
    return tasks


tasks_arg.__name__ = "tasks"


def split_config_args(values: Sequence[str] | None, overrides: Sequence[str] = ()) -> tuple[str | None, list[str]]:
    """``--config`` values (a JSON file and/or FIELD=VALUE) plus ``--set`` values -> (file, overrides)."""
    files, sets = [], list(overrides or [])
    for v in values or []:
        if "=" in v and not os.path.isfile(v):
            sets.append(v)
        else:
            files.append(v)
    if len(files) > 1:
        raise UsageError(f"--config takes one JSON file, got {files}")
    if files and not os.path.isfile(files[0]):
        raise UsageError(f"--config {files[0]}: no such file (give a JSON file or FIELD=VALUE)")
    return (files[0] if files else None), sets


def run_cli(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    """Parse ``argv`` (``None``: the process's arguments) and run the command it names, as a
    ``main`` returns it: ``--help`` / ``--version`` 0, a usage error 2 (one line)."""
    argv = list(argv) if argv is not None else sys.argv[1:]
    try:
        if argv and argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version"):
            parser.error(f"unrecognized arguments: {argv[0]} (the command comes first: {parser.prog} ask ...)")
        args, extra = parser.parse_known_args(argv)
        if extra:  # reported by the command's own parser: "qgpm ask: error: ... (see qgpm ask --help)"
            _command_parser(parser, getattr(args, "command", None)).error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as exc:  # --help, --version, or a one-line usage error (exit code 2)
        return int(exc.code or 0)
    args.argv = argv
    return run_command(args)


def _command_parser(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser:
    """The subcommand's parser (``parser`` itself when there is none)."""
    commands = getattr(parser, "commands", None)
    return commands.choices[command] if commands is not None and command in commands.choices else parser


def run_command(args: argparse.Namespace) -> int:
    """Run ``args.func``; bad input found while running becomes one line on stderr and exit code 2.

    Set ``QGPM_TRACEBACK=1`` to see the full traceback instead.
    """
    prog = f"qgpm {getattr(args, 'command', '')}".strip()
    try:
        return int(args.func(args) or 0)
    except UsageError as exc:
        print(f"{prog}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        resumable = getattr(args, "command", None) in ("eval", "tune")
        print(f"{prog}: interrupted" + ("; the answers so far are kept: rerun the same command to resume" if resumable else ""),
              file=sys.stderr)
        return 130
    except (ValueError, TypeError, LookupError, OSError, ImportError) as exc:  # TypeError: a value of the wrong type (k_sharp=abc)
        if os.environ.get("QGPM_TRACEBACK"):
            raise
        print(f"{prog}: error: {type(exc).__name__}: {_one_line(exc)} (QGPM_TRACEBACK=1 shows the traceback)", file=sys.stderr)
        return 2


def remote_call_config(model: Any, config_file: str | None, overrides: Sequence[str]) -> Any:
    """The config of ``--config`` / ``--set`` for a model about to load with a remote generator,
    read before the weights: such an engine loads only the layers pass 1 reads under the config
    its calls use (one when they rank with a reranker). ``None`` when neither is given (the
    model's preset, which the engine finds itself)."""
    if config_file is None and not overrides:
        return None
    base = QGPMConfig.for_model(source_fingerprint(resolve_source(model, None)).key)
    return load_config(config_file, overrides, base=base)
