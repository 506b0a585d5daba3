"""A plain transformers Trainer script that applies an exported tunescope recipe, trains with
`TunescopeCallback`, and so shows up in the dashboard (Runs, Fine-tune results, Subspaces).

1. Export a recommendation (here: the two best heads per layer of the Heads page, or any other)::

       python -m analysis export --strategy 1,3,3 --out my-recipe

2. Train it in your own loop (this script; MiniLM and the movie snippets by default)::

       python docs/examples/trainer_example.py --recipe my-recipe --steps 200

3. ``./tasks.sh app`` → Runs: the run is there, tagged ``imported``.

Everything model-side comes from the recipe folder's ``tunescope_recipe.py`` (torch and
transformers only); tunescope itself is used for the built-in data and for the callback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import transformers as tf

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # tunescope's package, for the data and the callback

from analysis.config import DataSpec  # noqa: E402
from analysis.data import load_data  # noqa: E402
from analysis.runs.callback import TunescopeCallback  # noqa: E402


def encode(tokenizer, frame, max_length: int) -> list[dict]:
    """One dict per example: what a tokenizer returns, plus the special-tokens mask (tunescope's
    mean pooling leaves special tokens out) and the label."""
    encoded = tokenizer(
        list(frame["text"]), truncation=True, max_length=max_length,
        return_special_tokens_mask=True,
    )  # fmt: skip
    return [
        {**{k: encoded[k][i] for k in encoded}, "labels": int(label)}
        for i, label in enumerate(frame["label"])
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", required=True, help="a folder written by `analysis export`")
    parser.add_argument("--data", default="movie-snippets")
    parser.add_argument("--steps", type=int, default=None, help="default: the recipe's")
    parser.add_argument("--n-train", type=int, default=None, help="train on a sample of this many")
    parser.add_argument("--n-test", type=int, default=None, help="score this many test examples")
    parser.add_argument("--out", default="trainer-output")
    parser.add_argument("--cache", default=None, help="tunescope's cache folder (runs database)")
    args = parser.parse_args(argv)

    sys.path.insert(0, str(Path(args.recipe).resolve()))
    from tunescope_recipe import TunescopeClassifier, load_recipe, make_optimizer

    recipe = load_recipe(args.recipe)
    training = recipe["training"]
    steps = args.steps or training["steps"]
    model = TunescopeClassifier.from_pretrained(recipe)
    optimizers = make_optimizer(model, recipe, steps=steps)
    tokenizer = tf.AutoTokenizer.from_pretrained(recipe["model"]["path"] or recipe["model"]["name"])

    data = load_data(DataSpec(args.data))
    train = data.parts["train"]
    if args.n_train:
        train = train.sample(n=min(args.n_train, len(train)), random_state=training["seed"])
    test = data.parts["test"]
    if args.n_test:
        test = test.sample(n=min(args.n_test, len(test)), random_state=0).sort_index()
    max_length = training["max_length"]
    test_rows = encode(tokenizer, test, max_length)

    callback = TunescopeCallback(
        recipe["model"]["name"], args.data, recipe=recipe, test_dataset=test_rows,
        test_texts=list(test["text"]), metric=data.metric, cache=args.cache,
    )  # fmt: skip
    trainer = tf.Trainer(
        model=model,
        args=tf.TrainingArguments(
            output_dir=args.out, max_steps=steps,
            per_device_train_batch_size=training["batch_size"], seed=training["seed"],
            max_grad_norm=recipe["optimizer"]["max_grad_norm"], logging_steps=1,
            save_strategy="no", report_to=[], disable_tqdm=True,
            use_cpu=not torch.cuda.is_available(),
        ),
        train_dataset=encode(tokenizer, train, max_length),
        data_collator=tf.DataCollatorWithPadding(tokenizer),
        processing_class=tokenizer,
        optimizers=optimizers,
        callbacks=[callback],
    )  # fmt: skip
    with callback:  # a crash leaves the run failed, with its steps
        trainer.train()
    result = callback.db.get_run(callback.run_id)["result"]
    print(
        f"run {callback.run_id}: {data.metric} {result['score']:.4f} on {len(test_rows)} test examples"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
