"""Probe: where do the Oracle's dropped-last-digit answers on multi-key NIAH come from?

    python benchmarks/probe_dropped_digit.py > benchmarks/results/probe_dropped_digit.jsonl

Two dev samples (``niah_multikey_1``, 4096 tokens, index 4, depths 0.5 and 0.75) where
the Oracle under the 4K preset's shaping (c 2, s_low 0.3; K_s 2 as in the coarse stage,
which does not matter for the Oracle) answers ``139596.`` for 1395961. Variants of the
evidence span and of the strength, one answer each (greedy, 48 new tokens):

- ``needle``: the needle sentence alone at full stride (the Oracle as run);
- ``needle+after80`` / ``before80+needle``: the 80 characters after / before it kept too
  (is the compressed text right next to the needle the cause?);
- ``needle s_low0.45``: milder compression of everything else;
- ``needle eps0.3``: the stride floor at the low score (a no-op check: eps <= s_low).
"""

from __future__ import annotations

import json

import torch

from qgpm.eval.answering import prepare_kwargs
from qgpm.eval.runner import load_engine
from qgpm.samples.base import split_seed
from qgpm.samples.tasks import generate


def main() -> int:
    torch.set_num_threads(1)
    engine = load_engine("smollm2", device="cpu", dtype="float32")
    base = engine.config.with_(k_sharp=2.0)
    for depth, idx in ((0.5, 4), (0.75, 4)):
        s = generate("niah_multikey_1", n=1, length=4096, tokenizer=engine.tokenizer, seed=split_seed("dev", idx), depths=[depth], max_new_tokens=48)[0]
        ev = s.evidence[0]
        ctx = s.context if isinstance(s.context, str) else "\n\n".join(s.context)
        a = ctx.index(ev)
        variants = {
            "needle": ([ev], base),
            "needle+after80": ([ctx[a: a + len(ev) + 80]], base),
            "before80+needle": ([ctx[max(0, a - 80): a + len(ev)]], base),
            "needle s_low0.45": ([ev], base.with_(s_low=0.45)),
            "needle eps0.3": ([ev], base.with_(eps=0.3)),
        }
        for name, (evidence, cfg) in variants.items():
            kw = prepare_kwargs(s, "oracle", config=cfg)
            kw["evidence"] = evidence
            r = engine.answer(s.context, s.question, **kw)
            print(json.dumps(dict(depth=depth, index=idx, gold=list(s.answers), variant=name, answer=r.text[:40],
                                  correct=all(g in r.text for g in s.answers))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
