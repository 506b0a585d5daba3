"""CLI-only code shared by the subcommands: options, the glue from argparse to configs, progress
bars and JSON output. Help texts come from the configs' field metadata (`analysis.config.help_of`),
so the CLI and the page say the same thing. Nothing in the library imports this module.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analysis.config import (
    PARTS,
    POOLINGS,
    PRECISIONS,
    SAMPLE_SCHEMES,
    DataSpec,
    ExtractConfig,
    ModelSpec,
    SampleSpec,
    default_of,
    help_of,
    parse_ints,
)
from analysis.finetune.config import FinetuneConfig
from analysis.finetune.registry import default_lrs_text, method_spec, option_owners
from analysis.finetune.spec import DEFAULT_CLASSIFIER_LR, parse_layer_values
from analysis.io import atomic_write_text
from analysis.runs.executor import EXECUTORS, ExecutorChoice

if TYPE_CHECKING:
    from analysis.runs.db import RunsDB


# -- model, data and sample ----------------------------------------------------------------------


def add_model_data(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="minilm", help=help_of(ModelSpec, "name"))
    parser.add_argument(
        "--trust-remote-code", action="store_true", help=help_of(ModelSpec, "trust_remote_code")
    )
    parser.add_argument("--data", default="movie-snippets", help=help_of(DataSpec, "name"))
    parser.add_argument("--text-col", default=None, help=help_of(DataSpec, "text_col"))
    parser.add_argument("--text-pair-col", default=None, help=help_of(DataSpec, "text_pair_col"))
    parser.add_argument("--label-col", default=None, help=help_of(DataSpec, "label_col"))
    parser.add_argument("--split-seed", type=int, default=0, help=help_of(DataSpec, "split_seed"))
    add_cache(parser)


def add_cache(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cache", default=None, help="cache folder (default: ./cache)")


def add_common(
    parser: argparse.ArgumentParser, n_default: int = 1000, precision: bool = True
) -> None:
    """Model, data, sample and pooling options: everything an extraction needs (``precision``:
    whether to offer ``--precision``; a command that computes in float32 only leaves it off)."""
    add_model_data(parser)
    parser.add_argument("--n", type=int, default=n_default, help=help_of(SampleSpec, "n"))
    parser.add_argument("--seed", type=int, default=0, help=help_of(SampleSpec, "seed"))
    parser.add_argument("--part", default="train", choices=PARTS, help=help_of(SampleSpec, "part"))
    parser.add_argument(
        "--scheme", default="random", choices=SAMPLE_SCHEMES, help=help_of(SampleSpec, "scheme")
    )
    parser.add_argument("--share", type=float, default=None, help=help_of(SampleSpec, "share"))
    parser.add_argument(
        "--pooling", default="mean", choices=POOLINGS, help=help_of(ExtractConfig, "pooling")
    )
    parser.add_argument(
        "--max-length", type=int, default=128, help=help_of(ExtractConfig, "max_length")
    )
    parser.add_argument(
        "--batch-size", type=int, default=32, help=help_of(ExtractConfig, "batch_size")
    )
    if precision:
        parser.add_argument(
            "--precision",
            default="float32",
            choices=PRECISIONS,
            help=help_of(ExtractConfig, "precision"),
        )


def absolute_path(name: str) -> str:
    """A relative path (or ``~/…``) made absolute against this working folder; an absolute
    path as it is (so the cache keys of absolute paths do not change)."""
    text = name.strip()
    if not text or Path(text).is_absolute():
        return name
    return os.path.abspath(os.path.expanduser(text))


def _local(name: str) -> str:
    """``name`` made absolute when it names something that exists here relative to this working
    folder (or under ``~``), else as it is (a hub id, a missing file: its error names it as
    typed). A queued run is trained by a worker whose working folder is the project's, not the
    user's: a relative path would name another file there, or none."""
    path = Path(name.strip()).expanduser()
    return absolute_path(name) if path.exists() else name


def model_name(name: str) -> str:
    """``--model`` as a queued run must name it: a local folder made absolute (`_local`); the
    built-in models (``minilm``, ``mpnet``) and hub ids as they are."""
    from analysis.models import BUILTIN_MODELS

    return name if name.strip() in BUILTIN_MODELS else _local(name)


def data_name(name: str) -> str:
    """``--data`` as a queued run must name it: a local file made absolute (`_local`); the
    built-in data sets and ``glue/…`` as they are."""
    from analysis.data.builtin import BUILTIN_DATA

    key = name.strip().lower()
    return name if key in BUILTIN_DATA or key.startswith("glue/") else _local(name)


def model_spec_from_args(args: argparse.Namespace) -> ModelSpec:
    if args.trust_remote_code:
        print(
            f"warning: trust_remote_code is on for {args.model}: its own code will run.",
            file=sys.stderr,
        )
    return ModelSpec(model_name(args.model), trust_remote_code=args.trust_remote_code)


def data_spec_from_args(args: argparse.Namespace) -> DataSpec:
    return DataSpec(
        data_name(args.data),
        text_col=args.text_col,
        text_pair_col=args.text_pair_col,
        label_col=args.label_col,
        split_seed=args.split_seed,
    )


def extract_config_from_args(args: argparse.Namespace) -> ExtractConfig:
    return ExtractConfig(
        model=model_spec_from_args(args),
        data=data_spec_from_args(args),
        sample=SampleSpec(
            n=args.n, seed=args.seed, part=args.part, scheme=args.scheme, share=args.share
        ),
        pooling=args.pooling,
        max_length=args.max_length,
        batch_size=args.batch_size,
        precision=getattr(args, "precision", "float32"),
    )


# -- fine-tuning runs ------------------------------------------------------------------------------


def add_training_options(parser: argparse.ArgumentParser) -> None:
    """What every run needs besides its method (budget, optimiser, data sizes, device), and each
    method's own options."""

    def add(flag: str, cls: type, name: str, **kwargs: Any) -> None:
        parser.add_argument(flag, help=help_of(cls, name), **kwargs)

    for name in ("steps", "batch_size", "max_length", "n_train", "n_eval", "eval_every"):
        add_setting_flag(parser, name, type=int)
    add_learning_rates(parser)
    add_setting_flag(parser, "pooling", choices=POOLINGS)
    add_setting_flag(parser, "device")
    parser.add_argument(
        "--no-mixed-precision", action="store_true", help="keep float32 on the GPU too"
    )
    add("--trajectory-every", FinetuneConfig, "trajectory_every", type=trajectory_every,
        default=None, metavar="K|auto")  # fmt: skip
    add("--zero-weights", FinetuneConfig, "zero_weights", default=None)
    add_method_options(parser)
    add_executor_options(parser)


def add_setting_flag(
    parser: argparse.ArgumentParser, name: str, config_class: type = FinetuneConfig,
    flag: str | None = None, **kwargs: Any,
) -> None:  # fmt: skip
    """``--<name>`` (or ``flag``) for a field of ``config_class`` (a `FinetuneConfig` unless
    said), with the field's default and help text: the command line and the pages say the
    same."""
    flag = flag or "--" + name.replace("_", "-")
    text = help_of(config_class, name).replace("%", "%%")  # argparse formats help with %
    parser.add_argument(flag, help=text, default=default_of(config_class, name), **kwargs)


def add_seeds_flag(parser: argparse.ArgumentParser, config_class: type) -> None:
    """``--seeds``: a count (3 → 0, 1, 2) or a list, by default ``config_class``'s seeds."""
    seeds = tuple(default_of(config_class, "seeds"))
    default = str(len(seeds)) if seeds == tuple(range(len(seeds))) else ",".join(map(str, seeds))
    parser.add_argument(
        "--seeds", default=default,
        help=help_of(config_class, "seeds") + ": a count (3 → 0,1,2) or a list",
    )  # fmt: skip


def seeds_of(text: str) -> tuple[int, ...]:
    """``"3"`` → (0, 1, 2); ``"0,4"`` → (0, 4)."""
    values = parse_ints(text, "--seeds") or ()
    if len(values) == 1 and "," not in text:
        if values[0] < 1:
            raise ValueError(f"--seeds needs at least one seed (got {text!r}).")
        return tuple(range(values[0]))
    return values


def add_learning_rates(parser: argparse.ArgumentParser) -> None:
    """``--lr`` (default: the method's) and ``--classifier-lr`` (``--head-lr`` accepted)."""
    parser.add_argument(
        "--lr", type=float, default=None,
        help=help_of(FinetuneConfig, "lr") + f"; the defaults: {default_lrs_text()}",
    )  # fmt: skip
    parser.add_argument(
        "--classifier-lr", "--head-lr", dest="classifier_lr", type=float,
        default=DEFAULT_CLASSIFIER_LR, help=help_of(FinetuneConfig, "classifier_lr"),
    )  # fmt: skip


def add_method_options(parser: argparse.ArgumentParser) -> None:
    """Every method's own options as flags (``--lora-r``, ``--adapter-size``…), derived from the
    method specs (`analysis.finetune.registry`). Their defaults are None, so a flag the user gave
    is one that is not None (the method's default applies otherwise)."""
    owned = option_owners()
    group = parser.add_argument_group(
        "method options (each for its own method only)",
        "; ".join(f"{f.flag}: --method {' / '.join(o)}" + ("" if f.default is None else
                  f", default {f.default}") for f, o in owned.values()),
    )  # fmt: skip
    kinds = {"int": int, "float": float}
    for key, (field, _) in owned.items():
        group.add_argument(
            field.flag, dest=key, default=None, type=kinds.get(field.kind, str), help=field.help
        )


# -- where queued runs train ---------------------------------------------------------------------


def add_executor_options(parser: argparse.ArgumentParser) -> None:
    """``--executor local|ray``, ``--ray-address``, ``--ray-cpus-per-run`` (every command that
    launches runs gets them through `add_training_options`)."""
    group = parser.add_argument_group("where queued runs train")
    group.add_argument(
        "--executor",
        default="local",
        choices=EXECUTORS,
        help=help_of(ExecutorChoice, "executor"),
    )
    group.add_argument("--ray-address", default=None, help=help_of(ExecutorChoice, "ray_address"))
    group.add_argument(
        "--ray-cpus-per-run", type=int, default=1, help=help_of(ExecutorChoice, "cpus_per_run")
    )
    group.add_argument(
        "--cpu-workers", type=int, default=None, help=help_of(ExecutorChoice, "cpu_workers")
    )


def executor_from_args(args: argparse.Namespace) -> ExecutorChoice:
    if args.executor != "ray" and (args.ray_address or args.ray_cpus_per_run != 1):
        raise ValueError("--ray-address and --ray-cpus-per-run go with --executor ray.")
    if args.executor == "ray" and getattr(args, "cpu_workers", None) is not None:
        raise ValueError(
            "--cpu-workers goes with --executor local (Ray packs by --ray-cpus-per-run)."
        )
    return ExecutorChoice(
        executor=args.executor,
        ray_address=args.ray_address,
        cpus_per_run=args.ray_cpus_per_run,
        device=getattr(args, "device", None),
        cpu_workers=getattr(args, "cpu_workers", None),
    )


def launch(
    args: argparse.Namespace,
    db: RunsDB,
    runs: Sequence[tuple[FinetuneConfig, str | None]],
    sweep_id: str | None = None,
) -> tuple[list[str], str]:
    """Queue ``runs`` ((config, family) pairs) and start the workers ``args`` choose, through
    `analysis.runs.launch.launch` (the executor checked first: ``error: …``, exit 2, with nothing
    queued). Returns the run ids and a line naming the workers."""
    from analysis.runs.launch import launch as launch_runs

    launched = launch_runs(db, runs, executor_from_args(args), sweep_id)
    return launched.ids, launched.workers


def trajectory_every(text: str) -> int | str:
    """``--trajectory-every``: a whole number of steps, or ``auto`` (FinetuneConfig resolves it
    with `analysis.subspace.budget.auto_every`)."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"give a whole number of steps or 'auto' (got {text!r})"
        ) from None


def refuse_foreign_flags(
    args: argparse.Namespace, methods: Iterable[str], runs: str | None = None
) -> None:
    """A ValueError for a method's own flag given when no run is of that method (`method_options`
    would drop it without a word). ``runs`` says what the runs are (default: ``--method …``)."""
    methods = set(methods)
    for key, (field, owners) in option_owners().items():
        if getattr(args, key, None) is not None and not methods & set(owners):
            owner = " or ".join(f"--method {m}" for m in owners)
            runs = runs or " / ".join(f"--method {m}" for m in sorted(methods))
            raise ValueError(
                f"{field.flag} is an option of {owner}; it does nothing for {runs}: drop it."
            )


def method_options(args: argparse.Namespace, method: str) -> Any:
    """The options of ``method`` from the parsed flags (None: the method has none, or lacks a
    choice it needs, which `FinetuneConfig` names)."""
    spec = method_spec(method)
    if spec.options is None:
        return None
    given: dict[str, Any] = {}
    for field in spec.fields:
        value = getattr(args, field.flat, None)
        if value is None:
            if field.required:
                return None
            continue
        if field.kind == "layers":
            value = parse_ints(value, field.flag)
        elif field.kind == "per_layer":
            value = parse_layer_values(value, field.flag)
        elif field.kind == "heads":
            from analysis.heads.selection_file import load_selection

            value = load_selection(value)
        given[field.name] = value
    return spec.options(**given)


def finetune_config(
    args: argparse.Namespace,
    *,
    method: str,
    layers: tuple[int, ...] | None,
    seed: int,
) -> FinetuneConfig:
    """A FinetuneConfig from parsed options plus one method / layers / seed. The evaluation,
    trajectory, weight-zeroing, device and precision flags are optional: a command whose parser
    does not declare them (``export``: a recipe trains elsewhere) keeps FinetuneConfig's
    defaults."""
    optional: dict[str, Any] = {
        name: getattr(args, name)
        for name in ("n_eval", "eval_every", "trajectory_every", "device")
        if hasattr(args, name)
    }
    if getattr(args, "zero_weights", None) is not None:
        optional["zero_weights"] = absolute_path(args.zero_weights)
    if hasattr(args, "no_mixed_precision"):
        optional["mixed_precision"] = not args.no_mixed_precision
    return FinetuneConfig(
        model=model_spec_from_args(args),
        data=data_spec_from_args(args),
        method=method,
        layers=layers,
        options=method_options(args, method),
        steps=args.steps,
        lr=args.lr,
        classifier_lr=args.classifier_lr,
        batch_size=args.batch_size,
        max_length=args.max_length,
        seed=seed,
        n_train=args.n_train,
        pooling=args.pooling,
        **optional,
    )


# -- output ---------------------------------------------------------------------------------------


class TqdmProgress:
    """A progress callback that drives one tqdm bar on stderr."""

    def __init__(self, description: str) -> None:
        self.description = description
        self.bar = None  # created on the first report, so an early error prints alone

    def __call__(self, fraction: float, message: str = "") -> None:
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=1000, desc=self.description, file=sys.stderr, leave=False)
        self.bar.n = int(1000 * min(max(fraction, 0.0), 1.0))
        if message:
            self.bar.set_postfix_str(message, refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class StepBar:
    """A tqdm bar over a run's steps, showing the loss; also shows progress messages."""

    def __init__(self, total: int, description: str) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=total, desc=description, file=sys.stderr, unit="step")

    def step(self, step: int, metrics: dict[str, float]) -> None:
        self.bar.n = step
        loss = metrics.get("loss")
        if loss is not None:
            self.bar.set_postfix_str(f"loss {loss:.4f}", refresh=False)
        self.bar.refresh()

    def message(self, fraction: float, message: str = "") -> None:
        if message and self.bar.n == 0:
            self.bar.set_postfix_str(message, refresh=True)

    def close(self) -> None:
        self.bar.close()


def write_json(path: str | None, payload: dict[str, Any]) -> None:
    """Write JSON atomically; '-' means stdout; None or "" writes nothing."""
    if not path:
        return
    text = json.dumps(payload, indent=2, default=float)
    if path == "-":
        print(text)
        return
    atomic_write_text(path, text)
