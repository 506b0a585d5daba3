"""Attention heads: information richness, correlation, PageRank and selection (paper 002, HiFi;
docs/explanation/heads.md, "Heads").

The pipeline, one module a stage:

1. ``stats``: `HeadStatsAccumulator` streams batches of head outputs O_h(x) (B, S, H, d_head)
   and keeps only sums; `HeadStats` holds I_h and r per layer.
2. ``collect``: hooks that hand every layer's head outputs to the accumulator during one forward
   pass, and the disk-cached `head_stats` of a sample.
3. ``pagerank``: PageRank of the heads of one layer on the graph built from I_h and r.
4. ``select``: the top-k heads per layer (or an ablation selector), Kendall τ robustness, and the
   trainable-parameter cost of a selection.
5. ``selection_file``: `HeadSelection`, the one type of a selection, and its JSON file.

Import from the module that defines a name; this package file stays empty so that the CLI can
read the vocabulary of ``selection_file`` without loading torch.
"""
