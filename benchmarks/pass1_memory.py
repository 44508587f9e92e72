"""What a pass-1 model saves: the whole model against only the layers pass 1 reads, in one run.

    python benchmarks/pass1_memory.py --tokens 4096 --out benchmarks/results/pass1_memory_cpu_smollm2.md

With generation on a server (:class:`qgpm.serving.VLLMServer`), the engine's process runs only
pass 1, and :meth:`QGPM.from_pretrained` loads the decoder layers up to the deepest head's
(:mod:`qgpm.partial`). For each relevance source (``--relevance``, default the heads and MiniLM),
each way of loading runs in a fresh process: ``whole`` (every layer, as an in-process engine)
and ``pass1`` (a stand-in remote generator that is never called, so only loading and pass 1
are measured). Reported: decoder layers loaded, parameter bytes, peak resident memory after
loading and after one ``prepare`` (pass 1 and the plan) of a ``--tokens`` prompt, that call's
time, and whether the sentence relevance equals the whole model's. Nothing else may run on the
machine while it measures.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


class _NoGeneration:
    """A remote generator stand-in: the measured calls stop before generation."""

    name = "none"

    def check(self, spec, config) -> None:
        pass

    def generate(self, call, decoding, score=None):
        raise RuntimeError("this benchmark does not generate")

    def stream(self, call, decoding):
        raise RuntimeError("this benchmark does not generate")


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _resident_mib() -> float:
    """The resident set now (VmRSS), after a garbage collection."""
    gc.collect()
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def child(mode: str, relevance: str, tokens: int) -> dict:
    from qgpm import QGPM
    from qgpm.config import QGPMConfig
    from qgpm.loading import default_model_source, source_fingerprint
    from speed import QUESTION, context_of, long_text

    torch.set_num_threads(1)
    config = QGPMConfig.for_model(source_fingerprint(default_model_source()).key).with_(relevance=relevance)
    base = _resident_mib()
    t = time.perf_counter()
    if mode == "whole":
        engine = QGPM.from_pretrained(config=config)
    else:
        engine = QGPM.from_pretrained(config=config, generator=_NoGeneration())
    load_s = time.perf_counter() - t
    after_load, resident_load = _peak_mib(), _resident_mib()
    params = sum(p.numel() * p.element_size() for p in engine.model.parameters())
    ctx = context_of(engine, long_text(), tokens)
    t = time.perf_counter()
    call = engine.prepare(ctx, QUESTION, max_new_tokens=32)
    prepare_s = time.perf_counter() - t
    resident_pass1 = _resident_mib()
    z = call.z.to(torch.float64).numpy().tobytes() if call.z is not None else b""
    return {"mode": mode, "relevance": relevance, "layers": engine.layers_loaded, "of": engine.n_layers, "params_mib": params / 2**20,
            "not_loaded_mib": engine.weights_not_loaded / 2**20, "resident_start_mib": base, "load_mib": after_load, "peak_mib": _peak_mib(),
            "resident_load_mib": resident_load, "resident_pass1_mib": resident_pass1,
            "load_s": load_s, "prepare_s": prepare_s, "prompt_tokens": call.num_tokens, "z": hashlib.sha256(z).hexdigest()[:16]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--relevance", default="heads,minilm", help="comma-separated QGPMConfig.relevance values")
    p.add_argument("--out", default=None, help="write the table here (markdown)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.tokens < 256:
        p.error("--tokens must be >= 256")
    if args.child:
        mode, relevance = args.child.split(":", 1)
        print(json.dumps(child(mode, relevance, args.tokens)))
        return 0
    rows = []
    for relevance in [r.strip() for r in args.relevance.split(",") if r.strip()]:
        for mode in ("whole", "pass1"):
            out = subprocess.run([sys.executable, __file__, "--child", f"{mode}:{relevance}", "--tokens", str(args.tokens)],
                                 capture_output=True, text=True, check=True)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(rows[-1], file=sys.stderr)
    lines = [f"# Pass-1 model against the whole model: SmolLM2-135M-Instruct, {args.tokens}-token prompt, CPU", "",
             f"Command: `python benchmarks/pass1_memory.py --tokens {args.tokens}"
             f"{'' if args.relevance == 'heads,minilm' else ' --relevance ' + args.relevance}`; "
             f"{platform.processor() or platform.machine()}, torch {torch.__version__}, one thread, each row a fresh process. "
             "Peak: the process's peak resident set (ru_maxrss); resident: its resident set (VmRSS) at that point; "
             "each after loading and after one `prepare` (pass 1 and the plan); "
             "`prepare s` is that call's time. `same z`: the sentence relevance equals the whole model's.", "",
             "| relevance | loaded | layers | parameters MiB | not loaded MiB | resident before load MiB | resident after load MiB | resident after pass 1 MiB "
             "| peak after load MiB | peak after pass 1 MiB | load s | prepare s | same z |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    whole = {r["relevance"]: r for r in rows if r["mode"] == "whole"}
    for r in rows:
        w = whole[r["relevance"]]
        lines.append(f"| {r['relevance']} | {r['mode']} | {r['layers']} / {r['of']} | {r['params_mib']:.1f} | {r['not_loaded_mib']:.1f} | "
                     f"{r['resident_start_mib']:.0f} | {r['resident_load_mib']:.0f} | {r['resident_pass1_mib']:.0f} | {r['load_mib']:.0f} | {r['peak_mib']:.0f} | {r['load_s']:.1f} | {r['prepare_s']:.2f} | {'yes' if r['z'] == w['z'] else 'no'} |")
    lines.append("")
    for rel, w in whole.items():
        p1 = next(r for r in rows if r["mode"] == "pass1" and r["relevance"] == rel)
        lines.append(f"- {rel}: the pass-1 model holds {p1['params_mib'] / w['params_mib']:.2f} of the whole model's parameter bytes; "
                     f"resident memory after pass 1 {p1['resident_pass1_mib'] / w['resident_pass1_mib']:.2f} of the whole model's, "
                     f"peak {p1['peak_mib'] / w['peak_mib']:.2f}.")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
