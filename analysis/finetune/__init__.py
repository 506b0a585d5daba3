"""The fine-tuning engine (SPEC.md, "Strategies", "Heads" and "Subspaces").

    from analysis.finetune.config import FinetuneConfig
    from analysis.finetune.engine import run_finetune
    result = run_finetune(FinetuneConfig(method="layers", layers=(1, 3, 3)))
    result.score, result.n_trainable, result.step_time_s

One module a part:

- ``config``: what a run is (`FinetuneConfig` and the per-method options); free of torch.
- ``model``: the encoder cut at ℓ_head plus a fresh classifier (`EncoderClassifier`).
- ``methods``: what trains, per method (`prepare_method`).
- ``adapters``: Houlsby adapters. ``subspace``: training inside a (trajectory or random)
  subspace.
- ``engine``: the training loop (`run_finetune`) and what a run measures.

Import from the module that defines a name; this package file stays empty so that the CLI can
read the config's settings without loading torch.
"""
