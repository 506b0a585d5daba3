"""The training loop: one `FinetuneConfig` in, one `FinetuneResult` out (docs/explanation/strategies.md).

1. Every random draw comes from a stream of ``cfg.seed``, one per purpose (`analysis.seeding`):
   the train subset, the batch order, the classifier's initial weights, the method's draws and
   dropout (the global generators, seeded right before the first step). Same config, same numbers
   on the CPU; runs of two methods with one seed see the same examples in the same order and
   start from the same classifier and dropout state.
2. Copy the shared encoder (never trained), zero ``cfg.zero_weights``, cut it at the
   classifier's layer, add the fresh classifier (`EncoderClassifier`), let the method choose what
   trains (`prepare_method`).
3. AdamW (decay / no-decay groups), linear warm-up then linear decay, gradient clipping at 1.0,
   random batches padded to their own longest example, bf16 / fp16 autocast on CUDA only.
4. Score the dev part (at most ``n_eval`` examples) every ``eval_every`` steps and at the end; keep
   the trainable state of the best dev score and report the TEST score of that state. The test
   part is scored once, never used for selection.

Measurements:
- ``step_time_s``: mean wall-clock of a training step (forward, backward, optimizer), evaluations
  excluded, the first step (allocation warm-up) excluded when there are more.
- ``peak_mem_mb``: the memory this run adds at its peak on top of what the process held when it
  started (trainable copy, optimizer state, activations, batches). CUDA:
  ``torch.cuda.max_memory_allocated`` minus the allocated bytes at the start. CPU: peak resident
  set size (psutil, sampled every 2 ms by a thread and at every step) minus the RSS at the start,
  after handing freed heap back to the OS (glibc ``malloc_trim``) so that memory freed by an
  earlier run in the same process is not reused unseen. RSS is an upper-level view: allocator
  caching can still hide or add a few MiB.
- ``n_params``: the full model's parameters (the whole encoder, without its unused pooler, plus the
  classifier); ``n_trainable``: entries that train (masked tensors count their trained entries);
  ``share = n_trainable / n_params``.
- ``layers_forward``: layers run forward (ℓ_cls); ``layers_backward``: layers the gradient passes
  through (from the lowest trained layer up to ℓ_cls; all of them when the embeddings train).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import math
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from analysis.data import TaskData, load_data
from analysis.extract import Tokenized, pad_id_of, texts_of, tokenize
from analysis.finetune.config import FinetuneConfig
from analysis.finetune.model import EncoderClassifier, truncated_copy, use_fast_attention
from analysis.finetune.prepare import embeddings_train, prepare_method, trainable_layers
from analysis.finetune.prepared import MethodInputs, Prepared
from analysis.io import json_ready
from analysis.models import LoadedModel, load_model
from analysis.predictions import encode_predictions, fingerprint_of_part
from analysis.progress import Cancelled, Progress, no_progress, scaled
from analysis.scores import task_score
from analysis.seeding import Stream
from analysis.subspace.outliers import apply_zero_weights
from analysis.subspace.trajectory import Trajectory, TrajectoryRecorder, as_trajectory

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

EVAL_SUBSET_SEED = 0  # dev / test subsets are the same for every run, whatever its seed
StepCallback = Callable[[int, dict[str, float]], None]


@dataclass
class FinetuneResult:
    """What one run reports (module docstring for the measurements). ``to_dict`` is JSON-safe."""

    score: float | None  # test score of the best-dev state, with ``metric``; None if undefined
    metric: str
    dev_score: float | None  # best dev score (model selection); None without a dev part
    n_trainable: int
    n_params: int
    share: float
    layers_forward: int
    layers_backward: int
    wall_s: float
    step_time_s: float
    peak_mem_mb: float
    seed: int
    config: dict[str, Any]
    curves: dict[str, list[list[float]]] = field(default_factory=dict)  # name -> [[step, v]]
    trajectory_dir: str | None = None
    best_step: int = 0
    description: str = ""
    device: str = "cpu"
    n_train: int = 0
    n_dev: int = 0
    n_test: int = 0
    trajectory: dict[str, Any] | None = None  # what the recorder's close() returned
    # Per-example test predictions and gold labels, compact (`analysis.predictions.encode_predictions`):
    # what the paired bootstrap of a comparison needs. Absent from results of older runs.
    test_predictions: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return json_ready({k: getattr(self, k) for k in self.__dataclass_fields__})


# -- data ------------------------------------------------------------------------------------------


@dataclass
class EncodedPart:
    """One data part, tokenized once (truncated, unpadded), and its labels."""

    tokens: Tokenized
    labels: torch.Tensor  # (N,) int64 class ids or float32 targets

    def __len__(self) -> int:
        return len(self.tokens)

    def batch(self, rows: Sequence[int], pad_id: int, device: torch.device) -> dict:
        """Rows padded to their own longest: input_ids, attention_mask, special_tokens_mask
        [, token_type_ids], each (B, S), on ``device``."""
        padded = self.tokens.pad(rows, pad_id)
        return {k: v.to(device, non_blocking=True) for k, v in padded.items()}


def encode_part(
    tokenizer: PreTrainedTokenizerBase, rows: pd.DataFrame, max_length: int, regression: bool
) -> EncodedPart:
    tokens = tokenize(tokenizer, *texts_of(rows), max_length)
    dtype = np.float32 if regression else np.int64
    return EncodedPart(tokens=tokens, labels=torch.tensor(rows["label"].to_numpy(dtype=dtype)))


def _subset(
    rows: pd.DataFrame, n: int | None, random_state: int | np.random.Generator
) -> pd.DataFrame:
    if n is None or len(rows) <= n:
        return rows
    return rows.sample(n=n, random_state=random_state).sort_index()


def _batch_order(n: int, batch_size: int, rng: np.random.Generator):
    """Endless random batches: a fresh permutation each epoch; the last short batch is kept."""
    while True:
        perm = rng.permutation(n)
        for start in range(0, n, batch_size):
            yield perm[start : start + batch_size].tolist()


# -- measurement -----------------------------------------------------------------------------------


def release_free_memory() -> None:
    """Collect garbage and hand glibc's free heap back to the OS (no-op where there is no glibc)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class PeakMemory:
    """Peak memory this run adds (MiB); CUDA allocator stats, else sampled process RSS."""

    def __init__(self, device: torch.device, interval_s: float = 0.002) -> None:
        self.device = device
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.cuda = device.type == "cuda"
        if self.cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            self.base = torch.cuda.memory_allocated(device)
        else:
            import psutil

            release_free_memory()  # else memory freed by an earlier run is reused unseen
            self._process = psutil.Process()
            self.base = self._process.memory_info().rss
            self.peak = self.base
            self._thread = threading.Thread(target=self._watch, daemon=True)
            self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        if not self.cuda:
            self.peak = max(self.peak, self._process.memory_info().rss)

    def stop(self) -> float:
        if self.cuda:
            peak = torch.cuda.max_memory_allocated(self.device)
        else:
            self._stop.set()
            if self._thread is not None:
                self._thread.join()
            self.sample()
            peak = self.peak
        return max(peak - self.base, 0) / 2**20


# -- the run ---------------------------------------------------------------------------------------


def _autocast(device: torch.device, enabled: bool):
    """(context factory, dtype or None): bf16 where supported, else fp16; CUDA only."""
    if not enabled or device.type != "cuda":
        return nullcontext, None
    dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return (lambda: torch.autocast("cuda", dtype=dtype)), dtype


def _lr_factor(steps: int, warmup_steps: int) -> Callable[[int], float]:
    """Linear warm-up to 1 over ``warmup_steps`` updates, then linear decay to 1/(steps − warmup)."""

    def factor(i: int) -> float:  # i = 0 for the first update
        k = i + 1
        decay = (steps - k + 1) / max(steps - warmup_steps, 1)
        return min(k / warmup_steps, decay) if warmup_steps else decay

    return factor


def predict(
    model: EncoderClassifier,
    part: EncodedPart,
    pad_id: int,
    device: torch.device,
    batch_size: int,
    autocast,
) -> np.ndarray:
    """Class ids (N,) or regression outputs (N,), batches sorted by length."""
    order = np.argsort(-part.tokens.lengths(), kind="stable")
    out = np.empty(len(part), dtype=np.float64)
    model.eval()
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size].tolist()
            with autocast():
                logits = model(**part.batch(rows, pad_id, device)).float()
            if model.n_outputs == 1:
                out[rows] = logits[:, 0].cpu().numpy()
            else:
                out[rows] = logits.argmax(dim=-1).cpu().numpy()
    model.train()
    return out


def score_part(metric: str, part: EncodedPart, predictions: np.ndarray, regression: bool) -> float:
    truth = part.labels.numpy()
    pred = predictions if regression else predictions.astype(np.int64)
    return task_score(metric, truth, pred)


@dataclass
class Built:
    """A model ready to train and what it costs."""

    model: EncoderClassifier
    prepared: Prepared
    n_params: int  # the full model: whole encoder (no pooler) + classifier
    n_trainable: int
    layers_backward: int


def build_model(
    cfg: FinetuneConfig,
    loaded: LoadedModel,
    n_outputs: int,
    device: torch.device | str | None = None,
    inputs: MethodInputs | None = None,
) -> Built:
    """Copy the encoder up to the classifier's layer, zero ``cfg.zero_weights``, add the classifier (its weights
    from the seed's classifier stream) and let the method choose what trains (from the method
    stream, `prepare_method`). The shared ``loaded.model`` is never touched."""
    device = torch.device(device) if device is not None else loaded.device
    encoder = truncated_copy(loaded, cfg.classifier_layer).to(device)
    n_params_encoder = sum(
        p.numel() for name, p in loaded.model.named_parameters() if not name.startswith("pooler.")
    )
    if cfg.zero_weights:
        kept = {name for name, _ in encoder.named_parameters()}
        removed = {name for name, _ in loaded.model.named_parameters()} - kept
        apply_zero_weights(encoder, cfg.zero_weights, skip=removed)
    use_fast_attention(encoder)
    model = EncoderClassifier(
        encoder, loaded.model_family, n_outputs, cfg.classifier_layer, cfg.pooling, loaded.n_layers,
        generator=Stream(cfg.seed, "classifier").torch(),
    )  # fmt: skip
    prepared = prepare_method(model, cfg, inputs)
    prepared.classifier_params = tuple(p for p in model.classifier.parameters() if p.requires_grad)
    model.to(device)
    prepared.grad_masks = {p: m.to(p.device) for p, m in prepared.grad_masks.items()}
    kept = model.n_layers_kept
    trained = prepared.trained_layers
    if trained is None:
        trained = trainable_layers(model)
    lowest = 1 if embeddings_train(model) else min(trained, default=kept + 1)
    layers_backward = kept - lowest + 1
    return Built(
        model=model,
        prepared=prepared,
        n_params=n_params_encoder + sum(p.numel() for p in model.classifier.parameters()),
        n_trainable=prepared.n_trainable,
        layers_backward=layers_backward,
    )


def make_optimizer(prepared: Prepared, cfg: FinetuneConfig):
    """AdamW over the method's groups (the body at ``cfg.lr``, the fresh classifier at
    ``cfg.classifier_lr``) and the warm-up / decay schedule: (optimizer, scheduler)."""
    # torch's fused AdamW (one kernel per step, not a loop over tensors) where every parameter
    # allows it: 10-20% of a MiniLM step on the CPU, and what transformers' Trainer uses by default
    # (bench/bench_finetune.py measures both side by side).
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in prepared.params)
    groups = prepared.param_groups(cfg.weight_decay, lr=cfg.lr, classifier_lr=cfg.classifier_lr)
    optimizer = torch.optim.AdamW(groups, lr=cfg.lr, fused=True if fused else None)
    warmup_steps = round(cfg.warmup * cfg.steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_factor(cfg.steps, warmup_steps))
    return optimizer, scheduler


def train_step(
    model: EncoderClassifier,
    batch: dict[str, torch.Tensor],
    labels: torch.Tensor,  # (B,)
    loss_fn: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler,
    prepared: Prepared,
    scaler,
    autocast,
) -> float:
    """Forward, backward, masks, clipping, one AdamW step; returns the loss."""
    # The last step's gradients go before the forward, not after it: kept through the forward
    # they sat beside its activations, one gradient per trainable parameter more at the peak
    # (87 MiB for full fine-tuning of MiniLM; bench/bench_finetune.py).
    optimizer.zero_grad(set_to_none=True)
    with autocast():
        logits = model(**batch)  # (B, C)
    logits = logits.float()
    loss = loss_fn(logits[:, 0], labels) if model.n_outputs == 1 else loss_fn(logits, labels)
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
    else:
        loss.backward()
    prepared.apply_grad_masks()
    torch.nn.utils.clip_grad_norm_(prepared.params, max_norm=1.0)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    scheduler.step()
    if prepared.after_step is not None:
        prepared.after_step()
    return float(loss.detach())


@dataclass
class TaskParts:
    """The encoded parts of one task, as a run uses them."""

    train: EncodedPart
    dev: EncodedPart | None  # None when the data has no dev part (then no model selection)
    test: EncodedPart
    metric: str
    regression: bool
    n_outputs: int  # C, or 1 for regression
    test_fingerprint: str = ""  # the test part's texts and labels (`analysis.compare`)


def encode_task(
    cfg: FinetuneConfig, tokenizer: PreTrainedTokenizerBase, data: TaskData
) -> TaskParts:
    """Check the labels, take the train subset (``n_train``, seeded by the run) and the dev / test
    subsets (``n_eval``, the same for every run), and tokenize each part once."""
    regression = data.task_type == "regression"
    n_outputs = 1 if regression else data.n_classes
    if not regression and n_outputs < 2:
        raise ValueError(f"A classification task needs at least two classes (got {n_outputs}).")
    for name, rows in data.parts.items():
        if not regression and len(rows) and not rows["label"].between(0, n_outputs - 1).all():
            raise ValueError(
                f"The {name} part has labels outside the class ids 0..{n_outputs - 1}."
            )
    train_rows = _subset(data.parts["train"], cfg.n_train, Stream(cfg.seed, "train_subset").numpy())
    if len(train_rows) == 0:
        raise ValueError("The train part is empty: nothing to fine-tune on.")
    dev_rows = _subset(data.parts.get("dev", train_rows.iloc[:0]), cfg.n_eval, EVAL_SUBSET_SEED)
    test_rows = _subset(data.parts["test"], cfg.n_eval, EVAL_SUBSET_SEED)
    if len(test_rows) == 0:
        raise ValueError("The test part is empty: a run reports its held-out test score.")

    def encode(rows: pd.DataFrame) -> EncodedPart:
        return encode_part(tokenizer, rows, cfg.max_length, regression)

    texts, pairs = texts_of(test_rows)
    fingerprint_texts = (
        texts if pairs is None else [f"{a}\x1f{b}" for a, b in zip(texts, pairs, strict=True)]
    )
    return TaskParts(
        train=encode(train_rows),
        dev=encode(dev_rows) if len(dev_rows) else None,
        test=encode(test_rows),
        metric=data.metric,
        regression=regression,
        n_outputs=n_outputs,
        test_fingerprint=fingerprint_of_part(fingerprint_texts, test_rows["label"].to_numpy()),
    )


class BestState:
    """The trainable state (on the CPU) of the best dev score so far; the first best on ties."""

    def __init__(self) -> None:
        self.score = -math.inf
        self.step = 0
        self.state: dict[str, torch.Tensor] | None = None

    def offer(self, step: int, score: float, model: nn.Module) -> None:
        comparable = score if math.isfinite(score) else -math.inf
        if self.state is None or comparable > self.score:
            self.score, self.step = comparable, step
            self.state = {
                name: p.detach().to("cpu", copy=True)
                for name, p in model.named_parameters()
                if p.requires_grad
            }

    def restore(self, model: nn.Module, current_step: int) -> bool:
        """Load the best state into ``model`` unless it is the current one; True if loaded."""
        if self.state is None or self.step == current_step:
            return False
        params = dict(model.named_parameters())
        with torch.no_grad():
            for name, value in self.state.items():
                params[name].copy_(value.to(params[name].device))
        return True


class TrainingLoop:
    """What lives across the steps of one run: the model, its optimiser and schedule, mixed
    precision, the curves, the best dev state and the step timings.

    ``train`` runs the steps (with cancel, callbacks, dev evaluation and trajectory snapshots);
    ``finish`` restores the best dev state and scores the test part once.
    """

    def __init__(
        self, cfg: FinetuneConfig, built: Built, parts: TaskParts, pad_id: int, device: torch.device
    ) -> None:
        self.cfg, self.built, self.parts = cfg, built, parts
        self.model, self.prepared = built.model, built.prepared
        self.pad_id, self.device = pad_id, device
        self.optimizer, self.scheduler = make_optimizer(self.prepared, cfg)
        self.autocast, amp_dtype = _autocast(device, cfg.mixed_precision)
        self.scaler = torch.amp.GradScaler("cuda") if amp_dtype == torch.float16 else None
        self.loss_fn = nn.MSELoss() if parts.regression else nn.CrossEntropyLoss()
        self.eval_batch = max(cfg.batch_size, 32)
        self.curves: dict[str, list[list[float]]] = {"train_loss": [], "dev": []}
        self.best = BestState()
        self.step_times: list[float] = []
        self._window: list[float] = []  # train losses since the last evaluation

    def score(self, part: EncodedPart) -> float:
        return score_part(self.parts.metric, part, self.predict(part), self.parts.regression)

    def predict(self, part: EncodedPart) -> np.ndarray:
        return predict(self.model, part, self.pad_id, self.device, self.eval_batch, self.autocast)

    def train(
        self,
        should_stop: Callable[[], bool] | None,
        on_step: StepCallback | None,
        on_eval: StepCallback | None,
        recorder: TrajectoryRecorder | None,
        memory: PeakMemory,
        progress: Progress,
    ) -> None:
        cfg, train = self.cfg, self.parts.train
        batches = _batch_order(len(train), cfg.batch_size, Stream(cfg.seed, "batch_order").numpy())
        if recorder is not None:
            recorder.maybe_record(0)
        self.model.train()
        Stream(cfg.seed, "dropout").seed_globals()  # whatever the method's preparation drew
        start = time.perf_counter()
        for step in range(1, cfg.steps + 1):
            if should_stop is not None and should_stop():
                raise Cancelled(f"Fine-tuning cancelled at step {step - 1} of {cfg.steps}.")
            t0 = time.perf_counter()
            rows = next(batches)
            loss = train_step(
                self.model,
                train.batch(rows, self.pad_id, self.device),
                train.labels[rows].to(self.device),
                self.loss_fn,
                self.optimizer,
                self.scheduler,
                self.prepared,
                self.scaler,
                self.autocast,
            )  # fmt: skip  (a Python float: the device has finished, so the time below is real)
            self.step_times.append(time.perf_counter() - t0)
            memory.sample()
            if recorder is not None:
                recorder.maybe_record(step)
            self.curves["train_loss"].append([step, loss])
            self._window.append(loss)
            if on_step is not None:
                elapsed = time.perf_counter() - start
                on_step(
                    step,
                    {"loss": loss, "lr": self.scheduler.get_last_lr()[0], "elapsed_s": elapsed,
                     "eta_s": elapsed / step * (cfg.steps - step)},
                )  # fmt: skip
            progress(step / cfg.steps, f"Step {step}/{cfg.steps}, loss {loss:.4f}")
            if self.parts.dev is not None and (step % cfg.eval_every == 0 or step == cfg.steps):
                self._evaluate(step, on_eval)

    def _evaluate(self, step: int, on_eval: StepCallback | None) -> None:
        dev_score = self.score(self.parts.dev)
        self.curves["dev"].append([step, dev_score])
        self.best.offer(step, dev_score, self.model)
        if on_eval is not None:
            on_eval(step, {"dev": dev_score, "train_loss": float(np.mean(self._window))})
        self._window.clear()

    def finish(self) -> tuple[float, dict[str, Any]]:
        """Restore the best dev state (if it is not the last one) and score the test part:
        (test score, its per-example predictions as `analysis.predictions.encode_predictions`)."""
        if self.best.restore(self.model, self.cfg.steps) and self.prepared.after_step is not None:
            self.prepared.after_step()
        test = self.parts.test
        predictions = self.predict(test)
        score = score_part(self.parts.metric, test, predictions, self.parts.regression)
        record = encode_predictions(
            predictions, test.labels.numpy(), self.parts.test_fingerprint, self.parts.regression
        )
        return score, record


def run_finetune(
    cfg: FinetuneConfig,
    *,
    progress: Progress | None = None,
    should_stop: Callable[[], bool] | None = None,
    on_step: StepCallback | None = None,
    on_eval: StepCallback | None = None,
    run_dir: str | Path | None = None,
    loaded: LoadedModel | None = None,
    data: TaskData | None = None,
    trajectory: Trajectory | Path | str | None = None,
) -> FinetuneResult:
    """Fine-tune as ``cfg`` says and report (module docstring).

    on_step(step, {loss, lr, elapsed_s, eta_s}) after every optimizer step; on_eval(step, {dev,
    train_loss}) after every dev evaluation (train_loss: mean since the previous one);
    should_stop() is polled before every step and raises `analysis.progress.Cancelled`;
    run_dir: where the trajectory goes (``run_dir/trajectory``); needed with trajectory_every.
    loaded / data: an already loaded model / `analysis.data.TaskData` (else loaded from cfg).
    trajectory: the subspace methods' source trajectory (a folder or an opened one); default:
    ``cfg.option("run")`` when that names a trajectory folder. A run id is resolved by the runs
    layer (`analysis.runs.execute`), which knows where each run keeps its files.
    """
    progress = progress or no_progress
    start_wall = time.perf_counter()
    if cfg.trajectory_every and run_dir is None:
        raise ValueError("Recording a trajectory needs a run folder (run_dir).")
    progress(0.0, "Loading model and data")
    if loaded is None:
        loaded = load_model(cfg.model, device=cfg.device)
    cfg.check_model(loaded.n_layers, loaded.n_heads)
    parts = encode_task(cfg, loaded.tokenizer, data if data is not None else load_data(cfg.data))
    inputs = MethodInputs(trajectory=_source_trajectory(cfg, trajectory))
    device = torch.device(cfg.device) if cfg.device else loaded.device
    trajectory_dir = Path(run_dir) / "trajectory" if cfg.trajectory_every else None

    recorder: TrajectoryRecorder | None = None
    memory = PeakMemory(device)
    try:
        built = build_model(cfg, loaded, parts.n_outputs, device, inputs)
        loop = TrainingLoop(cfg, built, parts, pad_id_of(loaded.tokenizer), device)
        if cfg.trajectory_every:
            recorder = TrajectoryRecorder(
                trajectory_dir, list(built.model.layers), cfg.trajectory_every,
                cfg.trajectory_dtype, family=built.model.model_family,
            )  # fmt: skip
        loop.train(should_stop, on_step, on_eval, recorder, memory, scaled(progress, 0.05, 0.95))
        progress(0.95, "Scoring the test part")
        test_score, test_predictions = loop.finish()
    finally:
        peak_mb = memory.stop()
        trajectory_meta = recorder.close() if recorder is not None else None
    progress(1.0, "Done")

    timed = loop.step_times[1:] if len(loop.step_times) > 1 else loop.step_times
    has_dev = parts.dev is not None
    return FinetuneResult(
        score=test_score if math.isfinite(test_score) else None,
        metric=parts.metric,
        dev_score=loop.best.score if has_dev and math.isfinite(loop.best.score) else None,
        n_trainable=built.n_trainable,
        n_params=built.n_params,
        share=built.n_trainable / built.n_params,
        layers_forward=built.model.n_layers_kept,
        layers_backward=built.layers_backward,
        wall_s=time.perf_counter() - start_wall,
        step_time_s=float(np.mean(timed)),
        peak_mem_mb=peak_mb,
        seed=cfg.seed,
        config=cfg.to_dict(),
        curves=loop.curves,
        trajectory_dir=str(trajectory_dir) if trajectory_dir is not None else None,
        best_step=loop.best.step if has_dev else cfg.steps,
        description=built.prepared.description,
        device=str(device),
        n_train=len(parts.train),
        n_dev=len(parts.dev) if has_dev else 0,
        n_test=len(parts.test),
        trajectory=trajectory_meta,
        test_predictions=test_predictions,
    )


def _source_trajectory(
    cfg: FinetuneConfig, given: Trajectory | Path | str | None
) -> Trajectory | None:
    """The subspace methods' trajectory: the one given, else ``cfg.option("run")`` when it is a
    trajectory folder (a run id needs the runs database: `analysis.runs.execute` resolves it)."""
    if given is not None:
        return as_trajectory(given)
    source = cfg.option("run")
    if source and (Path(source).expanduser() / "index.json").is_file():
        return as_trajectory(Path(source).expanduser())
    return None
