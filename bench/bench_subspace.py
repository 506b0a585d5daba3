"""Trajectory SVD: time, peak memory and disk, for MiniLM-size and BERT-base-size layers.

    .venv/bin/python bench/bench_subspace.py [--t 32] [--dtype float16] [--skip-bert]

1. Six MiniLM-size layers (BertLayer, d_model 384, d_ff 1536: 1.78 M parameters each) take a
   synthetic random walk of t = 32 steps, recorded by `TrajectoryRecorder` every step: bytes on disk
   per snapshot and recording time.
2. `analyse_trajectory`'s SVD part (`trajectory_svd` of every layer, streamed from the files), timed,
   with the peak extra anonymous memory (RssAnon of /proc/self/status, sampled every 2 ms) compared
   with one layer's trajectory W (t × D float32). tracemalloc is not used: it does not see torch's
   allocator, so it would report almost nothing.
3. Side by side on one layer: the naive route (load W whole in float32, torch.linalg.svd), its
   time and peak memory; both routes' singular values against a float64 reference SVD.
4. One BERT-base-size layer (d_model 768, d_ff 3072: 7.09 M parameters), t = 32: the same
   streamed SVD; its peak memory stays a small multiple of that one layer's W, whatever the
   number of layers (layers are processed one at a time and V is the only D-sized output).
"""

from __future__ import annotations

import argparse
import gc
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from transformers import BertConfig
from transformers.models.bert.modeling_bert import BertLayer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analysis.subspace.spectrum import trajectory_svd
from analysis.subspace.trajectory import TrajectoryRecorder, open_trajectory


def rss_anon() -> int:
    """Anonymous resident memory of this process in bytes (heap, torch tensors; no file pages)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    return 0


class PeakAnon:
    """Peak RssAnon above the level at entry, sampled by a thread."""

    def __enter__(self) -> PeakAnon:
        gc.collect()
        self.base = self.peak = rss_anon()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, rss_anon())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_anon())
        self.extra = self.peak - self.base


def make_layers(d_model: int, n_layers: int) -> list[BertLayer]:
    config = BertConfig(hidden_size=d_model, intermediate_size=4 * d_model, num_attention_heads=12)
    torch.manual_seed(0)
    return [BertLayer(config).requires_grad_(False) for _ in range(n_layers)]


def record_walk(folder: Path, layers, t: int, dtype: str) -> tuple[dict, float]:
    """θ_j = θ_{j-1} + 1e-3 · (a fixed Gaussian vector, rolled by a different shift each step):
    t generic directions without drawing t × D random numbers. Returns (info, seconds spent in
    the recorder only)."""
    g = torch.Generator().manual_seed(1)
    noise = [
        [1e-3 * torch.randn(p.numel(), generator=g) for p in layer.parameters()] for layer in layers
    ]
    rec = TrajectoryRecorder(folder, layers, every=1, dtype=dtype)
    spent = 0.0
    for step in range(0, t + 1):
        if step:
            for layer, vectors in zip(layers, noise, strict=True):
                for p, v in zip(layer.parameters(), vectors, strict=True):
                    p.add_(v.roll(step * 7919 % v.numel()).view(p.shape))
        start = time.perf_counter()
        rec.maybe_record(step)
        spent += time.perf_counter() - start
    return rec.close(), spent


def mb(n: float) -> str:
    return f"{n / 2**20:8.1f} MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--t", type=int, default=32)
    parser.add_argument("--dtype", default="float16", choices=["float16", "float32", "bfloat16"])
    parser.add_argument("--skip-bert", action="store_true")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    root = Path(tempfile.mkdtemp(prefix="bench-subspace-"))
    try:
        print(f"torch threads: {torch.get_num_threads()}; t = {args.t}; stored as {args.dtype}\n")
        layers = make_layers(384, 6)
        dim = sum(p.numel() for p in layers[0].parameters())
        w_bytes = args.t * dim * 4
        info, rec_s = record_walk(root / "minilm", layers, args.t, args.dtype)
        print("MiniLM-size: 6 layers of", f"{dim:,} parameters")
        print(f"  bytes on disk per snapshot: {info['bytes_per_snapshot']:,} "
              f"({info['bytes_per_snapshot'] / (6 * dim):.2f} bytes/parameter); "
              f"all {info['n_snapshots']} files: {info['bytes_total'] / 2**20:.0f} MiB")  # fmt: skip
        print(
            f"  recording: {rec_s / (args.t + 1):.2f} s a snapshot (flatten, subtract θ_0, write)"
        )
        del layers
        gc.collect()
        traj = open_trajectory(root / "minilm")
        with PeakAnon() as mem:
            start = time.perf_counter()
            ranks = []
            for layer in traj.layers:
                s, V, _ = trajectory_svd(traj, layer)
                ranks.append(V.shape[1])
                del s, V
            svd_s = time.perf_counter() - start
        print(f"  streamed Gram SVD of all 6 layers: {svd_s:.2f} s "
              f"({svd_s / 6:.2f} s a layer), ranks {ranks}")  # fmt: skip
        print(f"  one layer's W (t × D float32): {mb(w_bytes)}; peak extra memory: "
              f"{mb(mem.extra)} = {mem.extra / w_bytes:.2f} × W")  # fmt: skip
        summary = f"subspace: minilm_layers_s={svd_s:.2f} minilm_peak_w={mem.extra / w_bytes:.2f}"

        with PeakAnon() as naive_mem:
            start = time.perf_counter()
            W = torch.stack([traj.delta(j, 1) for j in range(1, traj.t + 1)])  # (t, D)
            _, s_naive, vh = torch.linalg.svd(W, full_matrices=False)
            naive_s = time.perf_counter() - start
            del vh
        s_exact = torch.linalg.svdvals(W.double())  # reference, outside the timings
        del W
        with PeakAnon() as one_mem:
            start = time.perf_counter()
            s, V, _ = trajectory_svd(traj, 1)
            ours_s = time.perf_counter() - start
        rel = ((s - s_exact).abs().max() / s_exact[0]).item()
        rel_naive = ((s_naive.double() - s_exact).abs().max() / s_exact[0]).item()
        del V
        print("  layer 1 side by side:")
        print(f"    naive (W whole, torch.linalg.svd): {naive_s:6.2f} s, peak {mb(naive_mem.extra)}"
              f" = {naive_mem.extra / w_bytes:.2f} × W; max |Δs| / s_max = {rel_naive:.1e}")  # fmt: skip
        print(f"    streamed Gram route:              {ours_s:6.2f} s, peak {mb(one_mem.extra)}"
              f" = {one_mem.extra / w_bytes:.2f} × W; max |Δs| / s_max = {rel:.1e}")  # fmt: skip
        summary += (
            f" layer1_s={ours_s:.2f} naive_s={naive_s:.2f} layer1_peak_w="
            f"{one_mem.extra / w_bytes:.2f} naive_peak_w={naive_mem.extra / w_bytes:.2f}"
        )
        shutil.rmtree(root / "minilm")

        if not args.skip_bert:
            layers = make_layers(768, 1)
            dim = sum(p.numel() for p in layers[0].parameters())
            w_bytes = args.t * dim * 4
            info, rec_s = record_walk(root / "bert", layers, args.t, args.dtype)
            del layers
            gc.collect()
            traj = open_trajectory(root / "bert")
            with PeakAnon() as mem:
                start = time.perf_counter()
                s, V, _ = trajectory_svd(traj, 1)
                bert_s = time.perf_counter() - start
                del s, V
            print(f"\nBERT-base-size layer: {dim:,} parameters")
            print(f"  bytes on disk per snapshot: {info['bytes_per_snapshot']:,}; recording "
                  f"{rec_s / (args.t + 1):.2f} s a snapshot")  # fmt: skip
            print(f"  streamed Gram SVD: {bert_s:.2f} s; W would be {mb(w_bytes)}; peak extra "
                  f"memory {mb(mem.extra)} = {mem.extra / w_bytes:.2f} × W")  # fmt: skip
            print("  (V, the D × t float32 output, is itself the size of W: the floor for any "
                  "method that returns V)")  # fmt: skip
            summary += f" bert_layer_s={bert_s:.2f} bert_peak_w={mem.extra / w_bytes:.2f}"
        # The summary line (docs/benchmarks.md records each benchmark's last line).
        print(summary)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
