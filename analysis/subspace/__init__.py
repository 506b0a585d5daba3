"""Intrinsic task subspaces of fine-tuning (docs/explanation/subspaces.md, "Subspaces"; paper 003).

Four stages, each usable on its own, one module each:

1. **Recording** (``trajectory``: `TrajectoryRecorder`, `open_trajectory`): during a fine-tuning run, every ``every`` optimiser steps,
   each encoder layer's parameters are flattened into one vector θ ∈ R^D (D = the layer's parameter
   count) and written to disk, one safetensors file per snapshot. Nothing is kept in memory across
   snapshots except θ_0.
2. **Spectrum** (``spectrum``: `trajectory_svd`, `load_layer_svd`, `spectrum_all_layers`): per layer, W = [θ_1 − θ_0; …; θ_t − θ_0]
   ∈ R^{t × D}, compact SVD through the t × t Gram matrix G = W Wᵀ in float64, V = Wᵀ U S⁻¹.
   Streamed in column blocks read straight from the snapshot files: W is never materialised.
3. **Outliers** (``outliers``: `find_outliers`, `recurring_dims`): coordinates of the learned update u whose
   deviation from the mean exceeds 3 standard deviations, with their parameter, row, column and the
   residual-stream (d_model) index they touch.
4. **Disable experiment** (``outliers``: `outlier_positions_file`, `random_positions_like`,
   `apply_zero_weights`): the JSON file of weights to zero before fine-tuning, for the outliers or
   for as many random weights.

``report`` puts them together for the CLI and the page (`analyse_trajectory`). Training inside a
subspace is a fine-tuning method (`analysis.finetune.methods.subspace`); the runs of the paper's
comparisons are planned and grouped in `analysis.runs.comparisons`. Nothing here imports the
fine-tuning engine or the runs database: this package only reads and writes trajectories.

Trajectory folder, format version 1::

    index.json                  what is where (see `TrajectoryRecorder`)
    snap-00000.safetensors      θ_0, float32, keys ``layer.<ℓ>`` (ℓ = 1..L), shape (D_ℓ,)
    snap-00001.safetensors      θ_1 − θ_0 in the chosen dtype, same keys
    …

Snapshots after the first store the *difference* from θ_0, not θ_j itself. Why: fine-tuning
moves a weight by about the learning rate per step (≈ 2e-5), while float16 spacing at a typical
weight magnitude of 0.05 is 3e-5 — a float16 θ_j would round most of the update away, whereas a
float16 θ_j − θ_0 keeps three significant digits of it. The SVD needs exactly these differences.

Within a layer the flattened order is fixed and documented: the layer's ``named_parameters()``
sorted by name, each tensor flattened row-major (``reshape(-1)``), concatenated. ``index.json``
lists every parameter with its name, shape and offset, so a coordinate maps back to an entry.
"""
