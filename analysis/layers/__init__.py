"""Per-layer task-specialty (docs/explanation/layer-metrics.md, "Layer metrics"; paper 000).

- ``metrics``: ν, CCA, rank ϱ of one layer's states (N, d); ζ and ρ of curves over layers.
- ``probe``: the linear probe of one layer.
- ``table``: every metric for every layer of an extraction (L+1, N, d), ℓ* and its summary,
  disk-cached, and the JSON report of the CLI and the page.
- ``whatif``: the same curves for several samples (pooling, imbalance, scarcity, seeds).
- ``teaching``: synthetic classes for the teaching view.
- ``projection``: 2-D pictures (PCA, UMAP) of one layer.

Import from the module that defines a name (``from analysis.layers.metrics import nu``); this
package file stays empty so that importing one light module never loads torch.
"""
