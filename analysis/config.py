"""Frozen, self-validating configs: the same objects drive the UI, the CLI and the cache keys.

Each setting's help text is declared once, in its field's metadata (`setting`), and read back
with `help_of` by the CLI's ``--help`` and the page's widgets.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

POOLINGS = ("mean", "first")
# Extraction arithmetic: float32, or the model's forward under bf16 / fp16 autocast (pooling and
# the stored states stay float32). Anything but float32 is part of the states' cache key.
PRECISIONS = ("float32", "bfloat16", "float16")
SAMPLE_SCHEMES = ("random", "balanced", "share")
PARTS = ("train", "dev", "test")


def setting(
    default: Any = dataclasses.MISSING,
    *,
    help: str,
    flat: str | None = None,
    kind: str | None = None,
    **kwargs: Any,
) -> Any:
    """A dataclass field with its help text in the metadata (``help_of`` reads it back).

    A fine-tuning method's option also names its flat JSON key and its kind
    (`analysis.finetune.spec`)."""
    metadata = {"help": help} if flat is None else {"help": help, "flat": flat, "kind": kind}
    return dataclasses.field(default=default, metadata=metadata, **kwargs)


def help_of(config_class: type, name: str) -> str:
    """The help text of one setting of a config dataclass (KeyError if it has none)."""
    for f in dataclasses.fields(config_class):
        if f.name == name:
            return f.metadata["help"]
    raise KeyError(f"{config_class.__name__} has no setting {name!r}.")


def default_of(config_class: type, name: str) -> Any:
    """The default of one setting of a config dataclass: the CLI and the page show the same."""
    for f in dataclasses.fields(config_class):
        if f.name == name:
            return f.default
    raise KeyError(f"{config_class.__name__} has no setting {name!r}.")


class ModelError(ValueError):
    """A model that cannot be used, with a message a user can act on.

    It lives beside `ModelSpec` so that both the loader (`analysis.models`) and the packaged
    built-ins beneath it (`analysis.packaged`) raise it without importing each other."""


@dataclass(frozen=True)
class ModelSpec:
    """Which encoder: a registry name (``minilm``), a local folder, or a hub id.

    ``trust_remote_code`` stays off unless the user turns it on for this model explicitly.
    """

    name: str = setting("minilm", help="built-in name, local folder or hub id")
    trust_remote_code: bool = setting(
        False, help="allow the model's own Python code to run (only for models you trust)"
    )

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(
                "Model name is empty: give a built-in name, a local folder or a hub id."
            )


@dataclass(frozen=True)
class DataSpec:
    """Which labelled text data: a registry name (``movie-snippets``, ``trec6``, ``glue/sst2``)
    or a local CSV / TSV / JSONL / Parquet file with user-chosen columns.

    ``split_seed`` fixes the train / dev / test parts of data that has no splits of its own.
    """

    name: str = setting("movie-snippets", help="built-in name, glue/<task>, or a file path")
    text_col: str | None = setting(None, help="text column of a local file")
    text_pair_col: str | None = setting(None, help="second-text column of a local file (pairs)")
    label_col: str | None = setting(None, help="label column of a local file")
    split_seed: int = setting(0, help="seed of the train/dev/test split")

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError("Dataset name is empty: give a built-in name or a file path.")
        if self.text_pair_col is not None and self.text_pair_col == self.text_col:
            raise ValueError("The second-text column must differ from the text column.")


@dataclass(frozen=True)
class SampleSpec:
    """Which examples of one part: ``n`` of them, drawn with ``seed``.

    scheme: ``random`` (uniform), ``balanced`` (equal count per class, as far as the data allows)
    or ``share`` (a share ``share`` of the first class, the rest split evenly over the others).
    """

    n: int = setting(1000, help="number of sampled examples")
    seed: int = setting(0, help="sampling seed")
    part: str = setting("train", help="which part the examples come from")
    scheme: str = setting(
        "random", help="random (uniform), balanced (equal per class) or share (see share)"
    )
    share: float | None = setting(None, help="share p of the first class (scheme share)")

    def __post_init__(self) -> None:
        if not isinstance(self.n, int) or self.n < 2:
            raise ValueError(f"N must be a whole number of at least 2 examples (got {self.n!r}).")
        if self.part not in PARTS:
            raise ValueError(f"Unknown part {self.part!r}: choose one of {', '.join(PARTS)}.")
        if self.scheme not in SAMPLE_SCHEMES:
            raise ValueError(
                f"Unknown sampling scheme {self.scheme!r}: choose one of {', '.join(SAMPLE_SCHEMES)}."
            )
        if self.scheme == "share":
            if self.share is None or not (0.0 < self.share < 1.0) or math.isnan(self.share):
                raise ValueError(
                    f"The class share p must lie strictly between 0 and 1 (got {self.share!r})."
                )
        elif self.share is not None:
            raise ValueError("A class share is only used with scheme='share'.")


@dataclass(frozen=True)
class ExtractConfig:
    """One extraction: pooled hidden states of every layer for a sample of a dataset."""

    model: ModelSpec = ModelSpec()
    data: DataSpec = DataSpec()
    sample: SampleSpec = SampleSpec()
    pooling: str = setting(
        "mean", help="mean: average of the real (non-special) tokens; first: the CLS / <s> token"
    )
    max_length: int = setting(128, help="tokens kept per example (longer texts are truncated)")
    batch_size: int = setting(32, help="examples per forward pass (does not change the numbers)")
    precision: str = setting(
        "float32",
        help="float32, or bfloat16 / float16: the forward pass under autocast (faster on a GPU; "
        "the states differ slightly and are cached separately)",
    )

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(
                f"Unknown precision {self.precision!r}: choose one of {', '.join(PRECISIONS)}."
            )
        if self.pooling not in POOLINGS:
            raise ValueError(
                f"Unknown pooling {self.pooling!r}: choose one of {', '.join(POOLINGS)}."
            )
        if not isinstance(self.max_length, int) or not 8 <= self.max_length <= 4096:
            raise ValueError(
                f"Max length must be between 8 and 4096 tokens (got {self.max_length!r})."
            )
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(
                f"Batch size must be a positive whole number (got {self.batch_size!r})."
            )


def parse_ints(text: str | None, what: str) -> tuple[int, ...] | None:
    """``"1,3,3"`` → (1, 3, 3); None or "" → None; anything else is a clear ValueError naming
    ``what`` (the setting, as the user sees it)."""
    if text is None or not str(text).strip():
        return None
    try:
        return tuple(int(part) for part in str(text).replace(" ", "").split(",") if part)
    except ValueError:
        raise ValueError(
            f"{what} must be whole numbers separated by commas (got {text!r})."
        ) from None


def to_dict(config: Any) -> dict[str, Any]:
    """A plain, JSON-ready dict of a (nested) config dataclass."""
    return dataclasses.asdict(config)
