"""The whole head analysis against the bare forward pass over the same batches (issue #4).

    python bench/bench_heads.py                       # n = 300 movie snippets, real MiniLM
    python bench/bench_heads.py --n 300 --repeats 5 --memory-n 100 1000

Timing: the bare forward pass (no hooks) and the head analysis (the same forward pass with the
hooks: per-batch SVDs and covariances of every head of every layer, then PageRank and the top-k
selection of every layer) run alternately, ``--repeats`` times each; medians are compared.
Memory: each n of ``--memory-n`` runs in a fresh process; the figure is the peak resident memory
during the analysis minus the resident memory just before it (model loaded, data sampled), and
on a GPU the peak allocated CUDA memory. It should not grow with n: only sums are kept.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from analysis.config import DataSpec, ModelSpec, SampleSpec  # noqa: E402
from analysis.data import load_data, sample  # noqa: E402
from analysis.extract import iter_encoded_batches, model_inputs  # noqa: E402
from analysis.heads.collect import collect_head_stats  # noqa: E402
from analysis.heads.select import HeadSelectionConfig, analyse_heads  # noqa: E402
from analysis.models import load_model  # noqa: E402

MAX_LENGTH, BATCH_SIZE = 128, 32


def texts_for(n: int, data: str) -> list[str]:
    return sample(load_data(DataSpec(data)), SampleSpec(n=n, seed=0))["text"].tolist()


def bare_forward(loaded, texts: list[str]) -> None:
    with torch.inference_mode():
        for batch in iter_encoded_batches(
            loaded.tokenizer, texts, None, MAX_LENGTH, BATCH_SIZE, loaded.device
        ):
            loaded.model(**model_inputs(loaded.model, batch.inputs))
    _sync(loaded.device)


def head_analysis(loaded, texts: list[str]) -> None:
    stats = collect_head_stats(loaded, texts, None, 0.9, MAX_LENGTH, BATCH_SIZE)
    analyse_heads(stats, HeadSelectionConfig())
    _sync(loaded.device)


def timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def current_rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize() / 2**20


def memory_probe(n: int, data: str, what: str) -> dict:
    """Run in a fresh process: peak memory of one pass of `what` over n examples."""
    loaded = load_model(ModelSpec("minilm"))
    texts = texts_for(n, data)
    bare_forward(loaded, texts[:BATCH_SIZE])  # allocator warm-up on one batch
    if loaded.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    before_rss, before_peak = current_rss_mb(), peak_rss_mb()
    (head_analysis if what == "heads" else bare_forward)(loaded, texts)
    result = {
        "n": n,
        "what": what,
        "rss_before_mb": before_rss,
        "peak_over_before_mb": max(peak_rss_mb() - before_rss, 0.0),
        "peak_grew": peak_rss_mb() > before_peak,
    }
    if loaded.device.type == "cuda":
        result["cuda_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--data", default="movie-snippets")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memory-n", type=int, nargs="*", default=[100, 1000])
    parser.add_argument("--probe", nargs=3, metavar=("N", "DATA", "WHAT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        print(json.dumps(memory_probe(int(args.probe[0]), args.probe[1], args.probe[2])))
        return

    loaded = load_model(ModelSpec("minilm"))
    texts = texts_for(args.n, args.data)
    print(
        f"model minilm ({loaded.n_layers} layers × {loaded.n_heads} heads, d_head {loaded.d_head}) "
        f"on {loaded.device}, {torch.get_num_threads()} threads; n = {args.n} {args.data}, "
        f"batch {BATCH_SIZE}, max length {MAX_LENGTH}"
    )
    bare_forward(loaded, texts[:BATCH_SIZE])
    head_analysis(loaded, texts[:BATCH_SIZE])  # warm-up
    bare, heads = [], []
    for _ in range(args.repeats):
        bare.append(timed(bare_forward, loaded, texts))
        heads.append(timed(head_analysis, loaded, texts))
    b, h = statistics.median(bare), statistics.median(heads)
    print(f"bare forward    median {b:7.2f} s   runs {', '.join(f'{t:.2f}' for t in bare)}")
    print(f"head analysis   median {h:7.2f} s   runs {', '.join(f'{t:.2f}' for t in heads)}")
    pairs = ", ".join(f"{hh / bb:.2f}" for bb, hh in zip(bare, heads, strict=True))
    print(f"ratio heads / bare: {h / b:.2f}×  (goal ≤ 2×; per pair {pairs})")

    print("\npeak memory in a fresh process per run (MiB over the resident memory just before):")
    for n in args.memory_n:
        for what in ("bare", "heads"):
            out = subprocess.run(
                [sys.executable, __file__, "--probe", str(n), args.data, what],
                capture_output=True,
                text=True,
                check=True,
            )
            probe = json.loads(out.stdout.strip().splitlines()[-1])
            cuda = f", CUDA peak {probe['cuda_peak_mb']:.0f} MiB" if "cuda_peak_mb" in probe else ""
            print(
                f"  n = {n:>5}  {what:<5}  +{probe['peak_over_before_mb']:6.1f} MiB "
                f"(resident before {probe['rss_before_mb']:.0f} MiB){cuda}"
            )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
