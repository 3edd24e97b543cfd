"""Peak memory of per-token log-probs (+ backward): full (N, T, V) logits vs chunked LM head.

Each variant runs in a fresh Python process and reports how far its resident set size peaks (VmHWM)
above the resident size once the inputs exist and the code path is warmed up (the peak is reset there,
so import-time spikes do not hide it); the numbers are comparable within one run. Two allocator settings are shown:
  glibc default        what a plain CPU run gets; glibc's *dynamic* mmap threshold lets freed
                       blocks of tens of MiB stay on the heap, so RSS also counts retained garbage
  mmap threshold 64K   MALLOC_MMAP_THRESHOLD_=65536: every large tensor is its own mmap, returned
                       on free, so peak RSS tracks the peak of live tensors (the structural claim)
Timings are printed for information only (the chunked path recomputes each chunk in backward).

    .venv/bin/python bench/bench_logprobs.py                       # N*T=4096, V=32000 (~0.5 GB fp32 logits)
    .venv/bin/python bench/bench_logprobs.py --tokens 2048 --vocab 16000 --chunk-size 256
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def child_env(**extra: str) -> dict[str, str]:
    """The environment a bench worker process starts from: this one's, less torch.distributed's rendezvous
    variables (a one-rank DeepSpeed group set up earlier in this process, as in a pytest worker that ran a
    ZeRO-3 test, leaves RANK/WORLD_SIZE/MASTER_PORT with the port still held: TRL's GRPOConfig then sets up
    accelerate's group from them and fails with EADDRINUSE, CI of stop 47), with the repository importable."""
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    from rftlib.train.dist import without_group_env
    env = without_group_env(dict(os.environ))
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    return {**env, **extra}


def _status_mb(field: str) -> float | None:
    """A ``/proc/self/status`` memory field (VmRSS, VmHWM) in MiB; None where there is no procfs."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0  # kB -> MiB
    except OSError:
        pass
    return None


def _reset_peak_rss() -> bool:
    """Reset this process's peak RSS (Linux >= 4.0: writing 5 to clear_refs resets VmHWM).

    Without it the peak is a lifetime high-water mark: an import-time spike (torch, transformers)
    of ~740 MiB hides any computation that peaks below it, which made the comparison flaky.
    """
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _peak_rss_mb() -> float:
    hwm = _status_mb("VmHWM")
    if hwm is not None:
        return hwm
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB -> MiB


def worker(variant: str, tokens: int, vocab: int, hidden_size: int, chunk_size: int) -> dict:
    """Forward + backward of the log-probs of ``tokens`` tokens; peak RSS growth in MiB.

    ``variant`` "chunked-then-full" runs both in one process (one torch start-up instead of two);
    the peak is reset before each measured call, so both deltas are valid in one process.
    """
    if variant == "chunked-then-full":
        chunked = worker("chunked", tokens, vocab, hidden_size, chunk_size)
        full = worker("full", tokens, vocab, hidden_size, chunk_size)
        return {"chunked": chunked, "full": full}
    sys.path.insert(0, str(REPO_ROOT))
    import torch
    import torch.nn.functional as F

    from rftlib.algo.logprobs import chunked_logprobs_entropy, full_logprobs_entropy

    def forward_backward(hidden, weight, targets):
        if variant == "full":
            logits = F.linear(hidden, weight)  # (N, T, V) float32: the tensor chunking avoids
            logprobs, _ = full_logprobs_entropy(logits, targets)
        else:
            logprobs, _ = chunked_logprobs_entropy(hidden, weight, targets, chunk_size=chunk_size)
        logprobs.sum().backward()

    torch.manual_seed(0)
    n, t = 8, tokens // 8  # N rows of T tokens, N*T = tokens
    hidden = torch.randn(n, t, hidden_size, requires_grad=True)  # (N, T, H)
    weight = (torch.randn(vocab, hidden_size) / hidden_size**0.5).requires_grad_()  # (V, H)
    targets = torch.randint(0, vocab, (n, t))  # (N, T)
    # Warm-up on 8 tokens: the first call of a code path loads modules and thread pools (~80 MiB
    # for checkpoint's first use), a one-off cost that is not the memory being compared.
    forward_backward(hidden[:1, :8].detach().requires_grad_(), weight, targets[:1, :8])
    weight.grad = None
    # Baseline = what is resident now, with the peak reset to it; falls back to the lifetime peak
    # (the old, weaker measure) where clear_refs is not available.
    baseline = _status_mb("VmRSS") if _reset_peak_rss() else None
    if baseline is None:
        baseline = _peak_rss_mb()

    start = time.perf_counter()
    forward_backward(hidden, weight, targets)
    seconds = time.perf_counter() - start
    peak = _peak_rss_mb()
    return {"variant": variant, "baseline_mb": baseline, "peak_mb": peak, "delta_mb": peak - baseline, "seconds": seconds}


MMAP_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}  # glibc: fixed threshold, large blocks always mmap'd


def measure(variant: str, tokens: int, vocab: int, hidden_size: int, chunk_size: int, env: dict | None = None) -> dict:
    """Run ``worker`` in a fresh interpreter (same imports for every variant) and return its report."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", variant, "--tokens", str(tokens),
           "--vocab", str(vocab), "--hidden", str(hidden_size), "--chunk-size", str(chunk_size)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=REPO_ROOT, env=child_env(**(env or {})))
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=4096, help="N*T, a multiple of 8")
    p.add_argument("--vocab", type=int, default=32000, help="V")
    p.add_argument("--hidden", type=int, default=256, help="H")
    p.add_argument("--chunk-size", type=int, default=1024, help="token rows per LM-head call")
    p.add_argument("--worker", choices=["full", "chunked", "chunked-then-full"], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.tokens % 8:
        p.error(f"--tokens must be a multiple of 8, got {args.tokens}")
    if args.worker:
        print(json.dumps(worker(args.worker, args.tokens, args.vocab, args.hidden, args.chunk_size)))
        return {}

    sizes = (args.tokens, args.vocab, args.hidden, args.chunk_size)
    print(f"N*T={args.tokens} V={args.vocab} H={args.hidden} chunk_size={args.chunk_size}; one fp32 (N*T, V) "
          f"logits tensor = {args.tokens * args.vocab * 4 / 2**20:.0f} MiB, one (chunk, V) = "
          f"{args.chunk_size * args.vocab * 4 / 2**20:.0f} MiB")
    results = {}
    for label, env in (("glibc default", None), ("mmap threshold 64K", MMAP_ENV)):
        full, chunked = measure("full", *sizes, env=env), measure("chunked", *sizes, env=env)
        ratio = full["delta_mb"] / max(chunked["delta_mb"], 1e-9)
        print(f"[{label}]")
        for r in (full, chunked):
            print(f"  {r['variant']:8s} peak RSS above baseline {r['delta_mb']:8.1f} MiB "
                  f"(baseline {r['baseline_mb']:.0f}, peak {r['peak_mb']:.0f})  fwd+bwd {r['seconds']:.2f} s")
        print(f"  full / chunked peak-memory ratio: {ratio:.1f}x")
        results[label] = {"full": full, "chunked": chunked, "ratio": ratio}
    return results


if __name__ == "__main__":
    main()
