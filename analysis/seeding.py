"""A training seed's randomness, one stream per purpose, and the two seed designs of a comparison
(docs/explanation/statistics.md, "Seeds").

A run's seed s gives every purpose its own stream, ``np.random.SeedSequence((s, PURPOSES[p],
*keys))``: SeedSequence hashes all of its entropy, so the streams of one seed are independent of
one another and of every other seed's, and ``keys`` (a layer number) name independent
sub-streams. The purposes:

- ``train_subset``: which ``n_train`` examples of the train part the run trains on;
- ``batch_order``: the permutation of those examples in every epoch;
- ``classifier``: the fresh classifier's initial weights;
- ``method``: whatever the method draws — random layers or heads, a random subspace, random
  zeroed weights, LoRA's and the adapters' initial weights, EVA's batches. A method that draws
  itself takes a generator of this stream; for what draws from the global generators (PEFT's
  and ``nn.init``'s initialisers) the global generators are seeded from it before the
  method's preparation;
- ``dropout``: the global generators (torch's on every device) are seeded from it right before
  the first training step.

So two runs with one seed — whatever their methods, and whatever a method consumes — train on
the same examples in the same order, from the same classifier and the same dropout state:
**common random numbers**, the design under which a comparison pairs its arms seed by seed.
The other design, **independent seeds**, gives every arm but the reference seeds of its own
(`independent_seed`). `arm_seed` is the one place a design turns into seeds.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

# Fixed forever: a purpose's number is part of every stream of that purpose.
PURPOSES = {"train_subset": 1, "batch_order": 2, "classifier": 3, "method": 4, "dropout": 5}
DESIGNS = ("common", "independent")
GLOBALS_KEY = 2**32  # the sub-stream `Stream.seed_globals` seeds the global generators from
INDEPENDENT_BASE = 2**31  # independent seeds lie in [2^31, 2^32): never a reference's seed s


@dataclass(frozen=True)
class Stream:
    """The stream of ``purpose`` of training seed ``seed`` (module docstring); ``keys`` name a
    sub-stream (`child`)."""

    seed: int
    purpose: str
    keys: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.purpose not in PURPOSES:
            raise ValueError(
                f"Unknown purpose {self.purpose!r}: choose one of {', '.join(PURPOSES)}."
            )
        for value in (self.seed, *self.keys):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise ValueError(f"A seed and its keys are whole numbers ≥ 0 (got {value!r}).")

    def sequence(self) -> np.random.SeedSequence:
        return np.random.SeedSequence(
            (int(self.seed), PURPOSES[self.purpose], *map(int, self.keys))
        )

    def child(self, *keys: int) -> Stream:
        """The sub-stream ``keys`` (independent of this stream and of its other children)."""
        return Stream(self.seed, self.purpose, (*self.keys, *keys))

    def numpy(self) -> np.random.Generator:
        return np.random.default_rng(self.sequence())

    def torch_seed(self) -> int:
        """A 64-bit whole number of the stream: what ``torch.manual_seed`` takes."""
        return int(self.sequence().generate_state(1, np.uint64)[0])

    def torch(self, device: torch.device | str | None = None) -> torch.Generator:
        import torch

        return torch.Generator(device or "cpu").manual_seed(self.torch_seed())

    def seed_globals(self) -> None:
        """Seed python's, numpy's and torch's global generators (torch's on every device: CPU
        and CUDA) for code that draws from them, from a sub-stream of their own
        (``GLOBALS_KEY``), so that they never repeat `torch`'s or `numpy`'s draws."""
        import torch

        value = self.child(GLOBALS_KEY).torch_seed()
        random.seed(value)
        np.random.seed(value % 2**32)
        torch.manual_seed(value)


def independent_seed(arm: str, s: int) -> int:
    """Arm ``arm``'s s-th training seed under independent seeds: from the SHA-256 of its name
    and s (the same in every process), in [2^31, 2^32), so never one of the reference's seeds
    0, 1, …; the reference itself keeps s (`arm_seed`)."""
    if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 0:
        raise ValueError(f"A seed number is a whole number ≥ 0 (got {s!r}).")
    digest = hashlib.sha256(f"{arm}\x1f{int(s)}".encode()).digest()
    return INDEPENDENT_BASE + int.from_bytes(digest[:4], "big") % INDEPENDENT_BASE


def arm_seed(arm: str, s: int, design: str, reference: bool = False) -> int:
    """The training seed of arm ``arm``'s s-th run under ``design``: s under common random numbers
    (every arm's run s shares full fine-tuning's streams), and for the reference under either;
    `independent_seed` for every other arm under independent seeds."""
    if design not in DESIGNS:
        raise ValueError(f"Unknown seed design {design!r}: choose one of {', '.join(DESIGNS)}.")
    if design == "common" or reference:
        return int(s)
    return independent_seed(arm, s)
