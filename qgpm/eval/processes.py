"""How a run's work items are split between processes: accelerate's processes or a manual shard."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
from typing import Any

import torch

__all__ = ["partial_state", "Processes", "split_processes"]


def partial_state() -> Any:
    """``accelerate.PartialState`` (long barrier timeout), or None when accelerate is missing.

    Under ``accelerate launch`` it tells this process its index and the process count;
    a plain process gets index 0 of 1."""
    try:
        from accelerate import PartialState  # optional: only processes started by `accelerate launch` need it
    except ImportError:  # plain single process
        return None
    # Without CUDA (or with ACCELERATE_USE_CPU) processes launched by `accelerate launch
    # --multi_gpu` / torchrun must join a gloo group: PartialState only does so with cpu=True.
    cpu = os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes") or not torch.cuda.is_available()
    try:
        return PartialState(cpu=cpu, timeout=_dt.timedelta(hours=48))
    except TypeError:  # pragma: no cover - older accelerate without kwargs passthrough
        return PartialState(cpu=cpu)


class _Single:
    process_index = 0
    local_process_index = 0
    num_processes = 1
    is_main_process = True
    device = torch.device("cpu")

    def wait_for_everyone(self) -> None:
        pass


@dataclasses.dataclass(frozen=True)
class Processes:
    """This process's share of a run: it takes work items ``rank, rank + world, ...``."""

    state: Any  # accelerate.PartialState or _Single: barriers
    rank: int
    world: int
    distributed: bool  # several processes of one accelerate launch (not a manual shard)

    def barrier(self) -> None:
        if self.distributed:
            self.state.wait_for_everyone()


def split_processes(shard: tuple[int, int] | None) -> Processes:
    """The process split: ``shard=(r, P)`` by hand, else accelerate's (one process without it)."""
    state = partial_state() or _Single()
    if shard is None:
        return Processes(state, state.process_index, state.num_processes, state.num_processes > 1)
    rank, world = int(shard[0]), int(shard[1])
    if not 0 <= rank < world:
        raise ValueError(f"shard must be (index, count) with 0 <= index < count, got {shard}")
    return Processes(state, rank, world, False)

