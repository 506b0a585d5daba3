"""The fine-tuning engine (docs/explanation/strategies.md, heads.md and subspaces.md).

    from analysis.finetune.config import FinetuneConfig
    from analysis.finetune.engine import run_finetune
    result = run_finetune(FinetuneConfig(method="layers", layers=(1, 3, 3)))
    result.score, result.n_trainable, result.step_time_s

One module a part:

- ``spec``: what a method declares (`MethodSpec`, the option kinds, what an export returns);
  ``registry``: the methods found under ``methods/``; free of torch.
- ``config``: what a run is (`FinetuneConfig`); ``stored``: its stored form (options nested;
  the older flat form read); free of torch.
- ``methods/<name>.py``: one method a module: its options, preparer, export and recogniser, and
  what it adds to a model (``adapter``: Houlsby adapters; ``subspace``: training inside a
  subspace) (docs/reference/methods.md). ``prepare``: running a preparer, the freezing helpers.
- ``model``: the encoder cut at the classifier's layer ℓ_cls plus a fresh classifier
  (`EncoderClassifier`).
- ``engine``: the training loop (`run_finetune`) and what a run measures.

Import from the module that defines a name; this package file stays empty so that the CLI can
read the config's settings without loading torch.
"""
