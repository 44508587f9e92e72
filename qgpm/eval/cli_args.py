"""The arguments of the evaluation commands (``eval``, ``tune``, ``calibrate``): their types,
checked when the command line is parsed (before any model loads), the argument groups the
commands share, and the command line as run (stored with every run's rows and head sets).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import Sequence

from qgpm._cliutil import CONFIG_HELP, DEVICE_HELP, DTYPE_HELP, HEADS_HELP, VLLM_MODEL_HELP, VLLM_TIMEOUT_HELP, VLLM_URL_HELP, csv_list, tasks_arg
from qgpm.defaults import DEFAULT_MODEL, DEFAULT_MODEL_NAME
from qgpm.samples.resources import HAYSTACKS

__all__ = ["depths_arg", "lengths_arg", "shard_arg", "haystack_arg", "positive_int", "command_line",
           "add_model_args", "add_sample_args", "add_config_args"]


def depths_arg(s: str) -> list[float] | None:
    """Needle depths: a comma list of numbers, or ``random`` / ``none`` (``None``: random depths)."""
    if s.strip().lower() in ("none", "random"):
        return None
    depths = [float(x) for x in csv_list(s)]
    if not depths:
        raise argparse.ArgumentTypeError("no depth given: a comma list of numbers in [0, 1], or 'random'")
    bad = [d for d in depths if not 0.0 <= d <= 1.0]
    if bad:
        raise argparse.ArgumentTypeError(f"depths lie in [0, 1] (0 = start of the context, 1 = end), got {', '.join(map(str, bad))}")
    return depths


depths_arg.__name__ = "depths (comma list of numbers, or 'random')"  # argparse names the type in its error


def lengths_arg(s: str) -> list[int]:
    """Token budgets: a comma list of ints >= 1."""
    lengths = [int(x) for x in csv_list(s)]
    if not lengths:
        raise argparse.ArgumentTypeError("no length given: a comma list of token budgets, e.g. 2048,4096")
    bad = [n for n in lengths if n < 1]
    if bad:
        raise argparse.ArgumentTypeError(f"lengths are token budgets >= 1, got {', '.join(map(str, bad))}")
    return lengths


lengths_arg.__name__ = "lengths (comma list of ints)"


def shard_arg(s: str | None) -> tuple[int, int] | None:
    """``i/N``: this job's shard ``i`` of ``N``."""
    if not s:
        return None
    a, sep, b = s.partition("/")
    try:
        i, n = int(a), int(b)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not i/N (this job's shard i of N, e.g. 0/2)") from None
    if not sep or n < 1 or not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"{s!r}: a shard is i/N with N >= 1 and 0 <= i < N, e.g. 0/2 and 1/2")
    return i, n


shard_arg.__name__ = "shard"


def haystack_arg(s: str) -> str:
    """A haystack name of :data:`qgpm.samples.resources.HAYSTACKS`."""
    if s not in HAYSTACKS:
        raise argparse.ArgumentTypeError(f"unknown haystack {s!r}; one of {', '.join(sorted(HAYSTACKS))}")
    return s


haystack_arg.__name__ = "haystack"


def positive_int(s: str) -> int:
    """An int >= 1."""
    value = int(s)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


positive_int.__name__ = "int >= 1"


def command_line(args: argparse.Namespace | None = None) -> str:
    """The command line as run (``qgpm ...`` via the entry point, else ``python -m qgpm.eval.cli ...``;
    ``accelerate launch --num_processes N`` in front when it runs on several processes)."""
    argv = getattr(args, "argv", None)
    if argv is None:
        argv = sys.argv[1:]
    prog = "qgpm" if sys.argv and os.path.basename(sys.argv[0]) == "qgpm" else "python -m qgpm.eval.cli"
    launcher = ""
    world = os.environ.get("WORLD_SIZE")
    if world and world != "1":
        launcher = f"accelerate launch --num_processes {world} "
    return launcher + prog + " " + " ".join(shlex.quote(a) for a in argv)


def add_model_args(p: argparse.ArgumentParser, heads: bool = True, answers: bool = True) -> None:
    """The model to load, where it runs, and (``answers``) where the answers are generated."""
    g = p.add_argument_group("model")
    g.add_argument("--model", default=DEFAULT_MODEL, help=f"{DEFAULT_MODEL} (the embedded {DEFAULT_MODEL_NAME}), an HF id, a local folder or a .gguf file")
    g.add_argument("--device", default="auto", help=DEVICE_HELP)
    g.add_argument("--dtype", default="auto", help=DTYPE_HELP)
    g.add_argument("--attn-implementation", default=None, help="eager | sdpa | flash_attention_2 (default: transformers' choice)")
    if answers:
        g.add_argument("--vllm-url", default=None, metavar="URL", help=VLLM_URL_HELP)
        g.add_argument("--vllm-model", default=None, metavar="NAME", help=VLLM_MODEL_HELP)
        g.add_argument("--vllm-timeout", type=float, default=None, metavar="S", help=VLLM_TIMEOUT_HELP)
        g.add_argument("--no-reuse-prefill", dest="reuse_prefill", action="store_false",
                       help="QGPM calls always stop pass 1 at the deepest head's layer and prefill the whole prompt in pass 2 "
                            "(QGPM(reuse_prefill=False); rows made before the reuse existed were computed so)")
    if heads:
        g.add_argument("--heads", default=None, help=HEADS_HELP)


def add_sample_args(p: argparse.ArgumentParser, *, split_choices: Sequence[str], default_split: str, default_n: int) -> None:
    """Which benchmark samples a run answers."""
    g = p.add_argument_group("samples")
    g.add_argument("--tasks", type=tasks_arg, default=None, help="comma list or 'all' (default: niah_multikey_1,nolima_direct)")
    g.add_argument("--lengths", type=lengths_arg, default=[2048], help="token budgets, comma list (default 2048)")
    g.add_argument("--depths", type=depths_arg, default=[0.0, 0.25, 0.5, 0.75, 1.0], help="needle depths, comma list, or 'random' (default 0,0.25,0.5,0.75,1)")
    g.add_argument("--n", type=positive_int, default=default_n, help=f"samples per (task, length, depth) (default {default_n})")
    g.add_argument("--split", choices=list(split_choices), default=default_split, help=f"seed split (default {default_split})")
    g.add_argument("--haystack", type=haystack_arg, default=None, help="haystack for NoLiMa / essay NIAH tasks (essays, squad)")
    g.add_argument("--max-new-tokens", type=positive_int, default=None, help="override every task's generation budget")


def add_config_args(p: argparse.ArgumentParser) -> None:
    """The QGPM config of a run: a JSON file and field overrides."""
    g = p.add_argument_group("QGPM config")
    g.add_argument("--config", action="append", default=None, metavar="FILE|FIELD=VALUE", help=CONFIG_HELP)
    g.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE", help="same as --config FIELD=VALUE (repeatable)")
