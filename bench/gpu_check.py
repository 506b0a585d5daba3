"""The GPU path in one command: every CUDA code path of tunescope, checked and timed.

    .venv/bin/python bench/gpu_check.py [--device cuda] [--json gpu.json]   # on a CUDA machine
    .venv/bin/python bench/gpu_check.py --smoke                              # CPU, tiny, ~20 s

Stages (each timed; on CUDA each reports its peak GPU memory, ``torch.cuda.max_memory_allocated``):

1. ``environment``: torch / CUDA versions, the card, bf16 support, the devices the runs worker
   would serve (one worker per GPU: `analysis.runs.worker.all_devices`).
2. ``extraction``: `extract_states` on the device in float32, bfloat16 and float16 (autocast;
   fp16 only on CUDA) against float32 on the CPU, MiniLM on 2,000 movie snippets. Tolerances, as
   the relative Frobenius error ‖S_dev − S_cpu‖ / ‖S_cpu‖ of each layer's states: float32 1e-4
   (TF32 stays off for matmuls by default, so only summation order differs), float16 1e-2 and
   bfloat16 3e-2 (unit round-off 2⁻¹¹ and 2⁻⁸, grown through the layers); plus the ν curve's
   argmin ℓ* and its largest relative difference.
3. ``heads``: head statistics (batched ``svdvals`` of every head's output on the device) against
   the CPU: mean information richness within 0.05, correlations within 1e-3 relative.
4. ``finetune``: one short run (2 steps, with mixed precision on CUDA) of every method —
   full, layers, heads, adapter, LoRA, BitFit, frozen, subspace, subspace-random — on the device:
   finite loss and score, step time, peak memory. The full run records a trajectory (snapshots
   taken from the device), which the subspace methods and stage 5 use.
5. ``trajectory_svd``: `analysis.subspace.spectrum.trajectory_svd` (streamed Gram route) of that
   trajectory against ``torch.linalg.svdvals`` of the same W on the device: 1e-4 relative.
6. ``large``: a randomly initialised BERT-large-shaped encoder (24 layers, d = 1,024, 16 heads,
   FFN 4,096, built offline from its config; MiniLM's WordPiece tokenizer) extracting N = 100,000
   texts truncated to 64 tokens, float32 and bfloat16: throughput, peak GPU memory, peak host RSS,
   time per stage, then the streamed layer metrics of those states (`cached_layer_metrics`).

``--smoke`` runs every stage on the CPU at toy sizes (a 2-layer random BERT with a letter-level
tokenizer, 64 texts, a 2-layer × 64 "large" model): it proves the script and the code paths it
drives, not the GPU. The suite runs it (tests/test_gpu_check.py). A stage that fails is recorded
with its error and the others still run; the exit status is 1 if any failed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

from analysis.cache import DiskCache  # noqa: E402
from analysis.config import (  # noqa: E402
    DataSpec,
    ExtractConfig,
    ModelSpec,
    SampleSpec,
)
from analysis.finetune.registry import method_names  # noqa: E402
from analysis.models import LoadedModel, load_model, wrap_model  # noqa: E402

TOLERANCE = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 3e-2}  # relative Frobenius error


@dataclass(frozen=True)
class Sizes:
    extract_n: int = 2000
    heads_n: int = 300
    train_n: int = 256
    batch_size: int = 16
    large_n: int = 100_000
    large_tokens: int = 64
    large_layers: int = 24
    large_d: int = 1024
    large_heads: int = 16
    large_batch: int = 256


SMOKE = Sizes(
    extract_n=64, heads_n=24, train_n=32, batch_size=8, large_n=256, large_tokens=16,
    large_layers=2, large_d=64, large_heads=4, large_batch=32,
)  # fmt: skip


class Check:
    """Runs the stages, times them, records peak memory and failures."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.results: dict[str, dict[str, Any]] = {}

    def stage(self, name: str, fn: Callable[[], dict[str, Any]]) -> None:
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        start = time.perf_counter()
        try:
            result = {"ok": True, **fn()}
        except Exception as exc:  # record and go on: one run should report every stage
            result = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                      "trace": traceback.format_exc(limit=6)}  # fmt: skip
        result["seconds"] = time.perf_counter() - start
        if cuda:
            result["peak_gpu_mb"] = torch.cuda.max_memory_allocated(self.device) / 2**20
        result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        self.results[name] = result
        status = "ok  " if result["ok"] else "FAIL"
        shown = {k: _short(v) for k, v in result.items() if k not in ("ok", "trace")}
        print(f"[{status}] {name}: {json.dumps(shown, default=str)}", flush=True)


def _short(value: Any) -> Any:
    """Floats to 4 significant digits, for the printed line (the JSON file keeps them all)."""
    if isinstance(value, float):
        return float(f"{value:.4g}")
    if isinstance(value, dict):
        return {k: _short(v) for k, v in value.items()}
    return value


def _within(name: str, value: float, limit: float) -> None:
    if not value <= limit:
        raise AssertionError(f"{name} = {value:.3g} exceeds {limit:.3g}")


# --- models and data ---------------------------------------------------------------------------------


def letter_tokenizer(folder: Path):
    """A WordPiece tokenizer over single letters and digits (offline, tiny): every word becomes
    one piece per character, so short texts still give long sequences."""
    import transformers as tf

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    chars = [chr(c) for c in range(ord("a"), ord("z") + 1)] + list("0123456789.,!'-()")
    vocab = {
        t: i for i, t in enumerate(dict.fromkeys(specials + chars + [f"##{c}" for c in chars]))
    }
    tokenizer = tf.BertTokenizerFast(vocab=vocab, do_lower_case=True)
    tokenizer.save_pretrained(folder)
    return tokenizer


def random_bert(
    name: str,
    tokenizer,
    n_layers: int,
    d_model: int,
    n_heads: int,
    device: torch.device,
    pooler: bool = False,
) -> LoadedModel:
    """A randomly initialised BERT of the given shape (FFN 4·d), built offline from its config,
    with eager attention as `load_model` gives every analysis."""
    import transformers as tf

    config = tf.BertConfig(
        vocab_size=max(len(tokenizer), 128), hidden_size=d_model, num_hidden_layers=n_layers,
        num_attention_heads=n_heads, intermediate_size=4 * d_model, max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id or 0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = tf.BertModel(config, add_pooling_layer=pooler)
    model.config._attn_implementation = "eager"
    return wrap_model(ModelSpec(name), model, tokenizer, "bert", device=device)


def small_model(work: Path, device: torch.device, smoke: bool) -> tuple[LoadedModel, LoadedModel]:
    """(on the device, on the CPU): MiniLM, or in smoke mode a 2-layer random BERT saved to disk
    so that both copies load the same weights."""
    if not smoke:
        return load_model(ModelSpec("minilm"), device=device), load_model(
            ModelSpec("minilm"), device="cpu"
        )
    folder = work / "tiny-bert"
    if not (folder / "config.json").exists():
        tokenizer = letter_tokenizer(folder)
        cpu = torch.device("cpu")
        random_bert(str(folder), tokenizer, 2, 32, 4, cpu, pooler=True).model.save_pretrained(
            folder
        )
    spec = ModelSpec(str(folder))
    return load_model(spec, device=device), load_model(spec, device="cpu")


def long_texts_csv(path: Path, n: int, words: int) -> Path:
    """``n`` train examples (n / 0.8 rows: the 80/10/10 split keeps n for train) of at least
    ``words`` words each, distinct, labels alternating."""
    from analysis.data import load_data

    snippets = load_data(DataSpec("movie-snippets")).parts["train"]["text"].tolist()
    rows = math.ceil(n / 0.8) + 10
    texts = []
    for i in range(rows):
        text, k = f"{i}", i
        while len(text.split()) < words:
            text += " " + snippets[k % len(snippets)]
            k += 7919
        texts.append(text)
    pd.DataFrame({"text": texts, "label": np.arange(rows) % 2}).to_csv(path, index=False)
    return path


# --- stages --------------------------------------------------------------------------------------


def environment(device: torch.device) -> dict[str, Any]:
    from analysis.runs.worker import all_devices

    out = {"torch": torch.__version__, "device": str(device), "workers_would_serve": all_devices()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        out.update(
            cuda=torch.version.cuda, gpu=props.name, gpu_gb=props.total_memory / 1e9,
            bf16=torch.cuda.is_bf16_supported(), n_gpus=torch.cuda.device_count(),
            tf32_matmul=torch.backends.cuda.matmul.allow_tf32,
        )  # fmt: skip
    return out


def relative_errors(states: torch.Tensor, reference: torch.Tensor) -> list[float]:
    """Per layer ‖S − R‖_F / ‖R‖_F of (L+1, N, d) states."""
    diff = (states.double() - reference.double()).flatten(1).norm(dim=1)
    return (diff / reference.double().flatten(1).norm(dim=1)).tolist()


def extraction(check: Check, on_device: LoadedModel, on_cpu: LoadedModel, work: Path, n: int):
    from analysis.extract import extract_states
    from analysis.layers.table import layer_metrics

    base = ExtractConfig(on_device.spec, DataSpec("movie-snippets"), SampleSpec(n=n))
    reference = extract_states(base, cache=DiskCache(work / "cpu"), loaded=on_cpu)
    nu_ref = layer_metrics(reference.states, reference.labels, which=("nu",))["nu"].to_numpy()
    precisions = ["float32", "bfloat16"] + (["float16"] if check.device.type == "cuda" else [])
    for precision in precisions:

        def run(precision: str = precision) -> dict[str, Any]:
            cfg = ExtractConfig(base.model, base.data, base.sample, precision=precision)
            start = time.perf_counter()
            got = extract_states(cfg, cache=DiskCache(work / precision), loaded=on_device)
            seconds = time.perf_counter() - start
            errors = relative_errors(got.states, reference.states)
            nu = layer_metrics(got.states, got.labels, which=("nu",))["nu"].to_numpy()
            out = {
                "n": got.n, "texts_per_s": got.n / seconds, "max_rel_error": max(errors),
                "tolerance": TOLERANCE[precision],
                "nu_max_rel_diff": float(np.max(np.abs(nu - nu_ref) / np.abs(nu_ref))),
                "l_star": int(np.argmin(nu[1:]) + 1), "l_star_cpu": int(np.argmin(nu_ref[1:]) + 1),
            }  # fmt: skip
            _within(f"{precision} relative error", max(errors), TOLERANCE[precision])
            return out

        check.stage(f"extraction_{precision}", run)


def heads(on_device: LoadedModel, on_cpu: LoadedModel, n: int) -> dict[str, Any]:
    from analysis.data import load_data, sample
    from analysis.heads.collect import collect_head_stats

    rows = sample(load_data(DataSpec("movie-snippets")), SampleSpec(n=n))
    texts = rows["text"].tolist()
    start = time.perf_counter()
    got = collect_head_stats(on_device, texts)
    seconds = time.perf_counter() - start
    ref = collect_head_stats(on_cpu, texts)
    richness = float(np.max(np.abs(got.richness - ref.richness)))
    scale = float(np.max(np.abs(ref.correlation))) or 1.0
    correlation = float(np.max(np.abs(got.correlation - ref.correlation))) / scale
    _within("mean richness difference", richness, 0.05)
    _within("correlation relative difference", correlation, 1e-3)
    return {"n": n, "texts_per_s": n / seconds, "richness_max_diff": richness,
            "correlation_max_rel_diff": correlation}  # fmt: skip


def method_config(method: str, loaded: LoadedModel, sizes: Sizes, trajectory: Path | None, **kw):
    from analysis.finetune.config import FinetuneConfig
    from analysis.finetune.methods.heads import HeadsOptions
    from analysis.finetune.methods.subspace import SubspaceOptions
    from analysis.heads.selection_file import HeadSelection

    n_layers = loaded.n_layers
    options = None
    if method == "heads":
        heads_of = {layer: (0, 1) for layer in range(1, n_layers + 1)}
        options = HeadsOptions(HeadSelection(heads_of))
    elif method in ("subspace", "subspace-random"):
        options = SubspaceOptions(str(trajectory) if trajectory else None)
    return FinetuneConfig(
        model=loaded.spec, data=DataSpec("movie-snippets"), method=method,
        layers=(1, max(1, n_layers // 2), n_layers) if method == "layers" else None,
        options=options, steps=2, batch_size=sizes.batch_size, max_length=64,
        n_train=sizes.train_n, n_eval=sizes.batch_size * 2, eval_every=2,
        device=str(loaded.device), **kw,
    )  # fmt: skip


def finetune(check: Check, loaded: LoadedModel, sizes: Sizes, work: Path) -> Path | None:
    """One 2-step run of every method; returns the trajectory the full run recorded."""
    from analysis.data import load_data
    from analysis.finetune.engine import run_finetune

    data = load_data(DataSpec("movie-snippets"))
    trajectory: Path | None = None
    for method in ["full", *(m for m in method_names() if m != "full")]:

        def run(method: str = method) -> dict[str, Any]:
            nonlocal trajectory
            extra = {"trajectory_every": 1} if method == "full" else {}
            cfg = method_config(method, loaded, sizes, trajectory, **extra)
            run_dir = work / f"run-{method}"
            result = run_finetune(cfg, loaded=loaded, data=data, run_dir=run_dir)
            if method == "full":
                trajectory = run_dir / "trajectory"
            losses = [v for _, v in result.curves["train_loss"]]
            if not all(math.isfinite(v) for v in losses) or result.score is None:
                raise AssertionError(f"non-finite loss or score: {losses}, {result.score}")
            return {"step_ms": 1000 * result.step_time_s, "peak_mem_mb": result.peak_mem_mb,
                    "n_trainable": result.n_trainable, "loss": losses[-1],
                    "score": result.score, "ran_on": result.device}  # fmt: skip

        check.stage(f"finetune_{method}", run)
    return trajectory


def trajectory_svd(trajectory: Path, device: torch.device) -> dict[str, Any]:
    from analysis.subspace.spectrum import trajectory_svd as streamed_svd
    from analysis.subspace.trajectory import open_trajectory

    traj = open_trajectory(trajectory)
    layer = traj.layers[0]
    start = time.perf_counter()
    svd = streamed_svd(traj, layer)
    streamed_s = time.perf_counter() - start
    w = torch.stack([traj.delta(j, layer).float() for j in range(1, traj.t + 1)]).to(device)
    start = time.perf_counter()
    direct = torch.linalg.svdvals(w.double()).cpu()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    direct_s = time.perf_counter() - start
    kept = svd.singular_values[svd.singular_values > 0]
    diff = float(((kept - direct[: len(kept)]).abs() / direct[: len(kept)]).max())
    _within("singular value relative difference", diff, 1e-4)
    return {"t": traj.t, "n_params": traj.n_params(layer), "rank": len(kept),
            "streamed_s": streamed_s, "device_svdvals_s": direct_s, "max_rel_diff": diff}  # fmt: skip


def large(
    check: Check, sizes: Sizes, work: Path, tokenizer, metrics: bool, stream: bool = False
) -> None:
    """A random BERT-large-shaped encoder extracting N texts of a fixed token count; then the
    layer metrics of its states (streamed at N = 100,000; ``stream`` forces that route)."""
    from analysis.extract import extract_states
    from analysis.layers.table import cached_layer_metrics

    loaded = random_bert(
        f"random-bert-{sizes.large_layers}x{sizes.large_d}", tokenizer, sizes.large_layers,
        sizes.large_d, sizes.large_heads, check.device,
    )  # fmt: skip
    csv = long_texts_csv(work / "long.csv", sizes.large_n, sizes.large_tokens)
    for precision in ("float32", "bfloat16"):

        def run(precision: str = precision) -> dict[str, Any]:
            cfg = ExtractConfig(
                loaded.spec, DataSpec(str(csv)), SampleSpec(n=sizes.large_n),
                max_length=sizes.large_tokens, batch_size=sizes.large_batch, precision=precision,
            )  # fmt: skip
            cache = DiskCache(work / f"large-{precision}")
            start = time.perf_counter()
            states = extract_states(cfg, cache=cache, loaded=loaded)
            seconds = time.perf_counter() - start
            out = {
                "n": states.n, "layers": states.n_layers + 1, "d_model": states.d_model,
                "tokens": sizes.large_tokens, "extract_s": seconds,
                "forward_and_write_s": states.meta["seconds"], "texts_per_s": states.n / seconds,
                "states_gb": states.stored.shape[0] * states.n * states.d_model * 4 / 1e9,
            }  # fmt: skip
            if metrics:
                before = os.environ.get("TUNESCOPE_STREAM_METRICS_MB")
                if stream:
                    os.environ["TUNESCOPE_STREAM_METRICS_MB"] = "0"
                start = time.perf_counter()
                try:
                    df, _ = cached_layer_metrics(states, cache=cache)
                finally:
                    if stream and before is None:
                        del os.environ["TUNESCOPE_STREAM_METRICS_MB"]
                    elif stream:
                        os.environ["TUNESCOPE_STREAM_METRICS_MB"] = before
                out.update(metrics_s=time.perf_counter() - start, route=df.attrs.get("route"),
                           probe_n=df.attrs.get("probe_n"), timing=df.attrs.get("timing"))  # fmt: skip
            del states
            return out

        check.stage(f"large_{precision}", run)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="CPU, toy sizes: checks the script")
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument("--large-n", type=int, default=None, help="texts for stage 6")
    parser.add_argument("--skip-large", action="store_true")
    parser.add_argument("--skip-large-metrics", action="store_true")
    parser.add_argument("--workdir", default=None, help="for the caches (stage 6: 2 × 10 GB)")
    parser.add_argument("--json", default=None, help="write every stage's result here")
    args = parser.parse_args(argv)
    sizes = SMOKE if args.smoke else Sizes()
    if args.large_n:
        sizes = Sizes(**{**sizes.__dict__, "large_n": args.large_n})
    device = torch.device(
        args.device or ("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    )
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type != "cuda" and not args.smoke:
        print("note: no CUDA device; running on the CPU (use --smoke for toy sizes)")
    check = Check(device)
    with tempfile.TemporaryDirectory(prefix="tunescope-gpu-", dir=args.workdir) as tmp:
        work = Path(tmp)
        check.stage("environment", lambda: environment(device))
        on_device, on_cpu = small_model(work, device, args.smoke)
        extraction(check, on_device, on_cpu, work, sizes.extract_n)
        check.stage("heads", lambda: heads(on_device, on_cpu, sizes.heads_n))
        trajectory = finetune(check, on_device, sizes, work)
        if trajectory is not None:
            check.stage("trajectory_svd", lambda: trajectory_svd(trajectory, device))
        if not args.skip_large:  # MiniLM's WordPiece tokenizer (the smoke model's, in smoke mode)
            metrics = not args.skip_large_metrics
            large(check, sizes, work, on_device.tokenizer, metrics, stream=args.smoke)
    failed = [name for name, r in check.results.items() if not r["ok"]]
    if args.json:
        from analysis.io import atomic_write_json

        atomic_write_json(args.json, {"smoke": args.smoke, "sizes": sizes.__dict__,
                                      "stages": check.results})  # fmt: skip
    print(f"{len(check.results) - len(failed)} of {len(check.results)} stages passed"
          + (f"; failed: {', '.join(failed)}" if failed else ""))  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
