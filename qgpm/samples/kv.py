"""Key-value retrieval in the style of Liu et al. 2023, "Lost in the Middle" (``kv_retrieval``).

Facts from the paper's code (nelson-liu/lost-in-the-middle,
``src/lost_in_the_middle/prompts/kv_retrieval.prompt``, ``prompting.py``,
``scripts/make_kv_retrieval_data.py``, ``scripts/evaluate_kv_responses.py``):

* Records are ``(uuid4, uuid4)`` string pairs; the gold record's position is swept.
* The JSON object is written one record per line: ``{"k1": "v1",\\n "k2": "v2",\\n ...}``
  (``"{"`` before the first record, a space before the others, ``",\\n"`` between
  records, ``"}"`` after the last).
* Prompt: ``Extract the value corresponding to the specified key in the JSON object
  below.\\n\\nJSON data:\\n{records}\\n\\nKey: "{key}"\\nCorresponding value:``
* Accuracy: the gold value occurs in the response, lowercased (our
  ``string_match_part``). The paper generates up to 100 new tokens.

Here the number of records is fitted to the token budget (the paper fixes 75/140/300),
the gold record goes at index ``round(depth * (n_records - 1))``, and UUIDs come from a
seeded ``random.Random``. The gold key's first hex digit is tied to the split (``int(digit,
16) % 3 == slot``), so a calibration key can never be an evaluation key.
"""

from __future__ import annotations

import uuid
from typing import Any, Sequence

from qgpm.samples.base import (
    EvalSample,
    build_sample,
    fit_units,
    sample_rng,
    split_of_seed,
    split_slot,
)
from qgpm.prompt import PromptSpec, count_prompt_tokens

__all__ = ["KV_TASKS", "generate_kv"]

KV_TASKS: tuple[str, ...] = ("kv_retrieval",)
KV_MAX_NEW_TOKENS = 100

_INSTRUCTION = "Extract the value corresponding to the specified key in the JSON object below."
_TEMPLATE = "{instruction}\n\nJSON data:\n{context}\n\n{question}"


def _uuid(rng) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def format_records(records: Sequence[tuple[str, str]]) -> str:
    """The paper's JSON layout, one record per line."""
    lines = [f'"{k}": "{v}"' for k, v in records]
    return "{" + ",\n ".join(lines) + "}"


def generate_kv(
    task: str,
    *,
    n: int,
    length: int,
    tokenizer: Any,
    seed: int,
    depths: Sequence[float] | None = None,
    max_new_tokens: int | None = None,
) -> list[EvalSample]:
    if task not in KV_TASKS:
        raise ValueError(f"unknown kv task {task!r}")
    split = split_of_seed(seed)
    slot = split_slot(split)
    max_new = KV_MAX_NEW_TOKENS if max_new_tokens is None else int(max_new_tokens)
    out = []
    for depth in (list(depths) if depths is not None else [None]):
        if depth is not None and not 0.0 <= depth <= 1.0:
            raise ValueError(f"depth must be in [0, 1], got {depth}")
        for i in range(n):
            content = sample_rng(task, seed, i, "content")
            key = _uuid(content)
            while int(key[0], 16) % 3 != slot:
                key = _uuid(content)
            value = _uuid(content)
            layout = sample_rng(task, seed, i, depth, "layout")
            u = layout.random()  # depth=None: the paper's uniformly random gold position
            stream = _RecordStream(sample_rng(task, seed, i, "records"), {key, value})
            out.append(_one(task, split, seed, i, depth, u, length, max_new, tokenizer, key, value, stream))
    return out


class _RecordStream:
    def __init__(self, rng, taken: set[str]):
        self.rng, self.taken, self.records = rng, set(taken), []

    def take(self, k: int) -> list[tuple[str, str]]:
        while len(self.records) < k:
            kk, vv = _uuid(self.rng), _uuid(self.rng)
            if kk in self.taken or vv in self.taken:
                continue
            self.taken.update((kk, vv))
            self.records.append((kk, vv))
        return self.records[:k]


def _one(task, split, seed, i, depth, u, length, max_new, tokenizer, key, value, stream) -> EvalSample:
    question = f'Key: "{key}"\nCorresponding value:'

    def position(k: int) -> int:  # k records in all, gold included
        if depth is None:
            return min(int(u * k), k - 1)
        return round(depth * (k - 1))

    def records(k: int) -> list[tuple[str, str]]:
        recs = list(stream.take(k - 1))
        recs.insert(position(k), (key, value))
        return recs

    def prompt(k: int) -> PromptSpec:
        return PromptSpec(context=format_records(records(k)), question=question, instruction=_INSTRUCTION, answer_prefix="", template=_TEMPLATE)

    def measure(k: int) -> int:
        return count_prompt_tokens(tokenizer, prompt(k)) + max_new

    k, total = fit_units(measure, length, 2, 10**6, 60.0)
    spec = prompt(k)
    context = spec.context
    gold_line = f'"{key}": "{value}"'
    pos = position(k)
    meta = {
        "split": split,
        "num_records": k,
        "gold_index": pos,
        "gold_record_depth": pos / max(1, k - 1),
        "key": key,
        "prompt_tokens": total - max_new,
        "needle_depths": [context.find(gold_line) / max(1, len(context) - len(gold_line))],
    }
    return build_sample(spec, task=task, length=length, depth=depth, seed=seed, index=i, max_new_tokens=max_new,
                        answers=[value], evidence=[gold_line], metric="string_match_part", meta=meta)
