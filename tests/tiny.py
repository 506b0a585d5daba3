"""Tiny, randomly initialised encoders of every supported family, built in-process (no download).

`make_tiny_model_dir(family, root)` saves config, weights and a small WordPiece tokenizer into a
folder that `analysis.models.load_model(ModelSpec(str(folder)))` loads like any local checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import torch
import transformers as tf

WORDS = [
    "the",
    "a",
    "an",
    "and",
    "or",
    "but",
    "not",
    "no",
    "is",
    "are",
    "was",
    "were",
    "be",
    "been",
    "this",
    "that",
    "these",
    "those",
    "it",
    "its",
    "i",
    "you",
    "he",
    "she",
    "we",
    "they",
    "me",
    "him",
    "her",
    "us",
    "them",
    "my",
    "your",
    "our",
    "their",
    "what",
    "which",
    "who",
    "whom",
    "whose",
    "when",
    "where",
    "why",
    "how",
    "film",
    "movie",
    "story",
    "plot",
    "actor",
    "actors",
    "acting",
    "scene",
    "scenes",
    "good",
    "great",
    "bad",
    "awful",
    "best",
    "worst",
    "funny",
    "boring",
    "dull",
    "fun",
    "love",
    "loved",
    "hate",
    "hated",
    "fine",
    "nice",
    "beautiful",
    "ugly",
    "long",
    "short",
    "slow",
    "fast",
    "smart",
    "stupid",
    "script",
    "music",
    "ending",
    "characters",
    "character",
    "director",
    "performance",
    "performances",
    "of",
    "in",
    "on",
    "at",
    "to",
    "for",
    "with",
    "from",
    "by",
    "as",
    "about",
    "into",
    "than",
    "then",
    "so",
    "too",
    "very",
    "really",
    "just",
    "more",
    "most",
    "less",
    "much",
    "many",
    "few",
    "all",
    "some",
    "any",
    "one",
    "two",
    "three",
    "first",
    "last",
    "new",
    "old",
    "big",
    "small",
    "do",
    "does",
    "did",
    "have",
    "has",
    "had",
    "can",
    "could",
    "will",
    "would",
    "should",
    "may",
    "might",
    "must",
    "make",
    "makes",
    "made",
    "see",
    "seen",
    "watch",
    "watched",
    "time",
    "life",
    "world",
    "people",
    "man",
    "woman",
    "city",
    "country",
    "year",
    "day",
    "question",
    "answer",
    "name",
    "number",
    "place",
    "person",
    "thing",
    "kind",
    "mean",
    "many",
    "far",
    "long",
    "?",
]


def tiny_tokenizer(folder: Path) -> tf.BertTokenizerFast:
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + list("0123456789.,!'-")
    vocab = specials + sorted(set(WORDS)) + letters + [f"##{c}" for c in letters]
    folder.mkdir(parents=True, exist_ok=True)
    # transformers 5 ignores `vocab_file` here (the tokenizer would hold the 5 specials only);
    # a vocab mapping builds the real WordPiece vocabulary.
    ids = {token: i for i, token in enumerate(dict.fromkeys(vocab))}
    tokenizer = tf.BertTokenizerFast(vocab=ids, do_lower_case=True)
    assert len(tokenizer) == len(ids) and tokenizer.convert_tokens_to_ids("movie") > 4
    return tokenizer


def tiny_config(family: str, vocab_size: int, n_layers: int, n_heads: int, d_model: int):
    common = dict(vocab_size=vocab_size, pad_token_id=0)
    if family == "distilbert":
        return tf.DistilBertConfig(
            dim=d_model, n_layers=n_layers, n_heads=n_heads, hidden_dim=2 * d_model,
            max_position_embeddings=256, **common,
        )  # fmt: skip
    classes = {
        "bert": tf.BertConfig,
        "roberta": tf.RobertaConfig,
        "electra": tf.ElectraConfig,
        "mpnet": tf.MPNetConfig,
        "deberta-v2": tf.DebertaV2Config,
    }
    extra = {"embedding_size": d_model} if family == "electra" else {}
    return classes[family](
        hidden_size=d_model,
        num_hidden_layers=n_layers,
        num_attention_heads=n_heads,
        intermediate_size=2 * d_model,
        max_position_embeddings=256 + 2,
        **extra,
        **common,
    )


def make_tiny_model_dir(
    family: str,
    root: Path,
    n_layers: int = 2,
    n_heads: int = 4,
    d_model: int = 32,
    seed: int = 0,
) -> Path:
    """Save a tiny random encoder of `family` under root/<family>/ and return that folder."""
    folder = Path(root) / f"tiny-{family}-{n_layers}x{n_heads}x{d_model}"
    if (folder / "config.json").is_file():
        return folder
    tokenizer = tiny_tokenizer(folder)
    config = tiny_config(family, len(tokenizer), n_layers, n_heads, d_model)
    torch.manual_seed(seed)
    model = tf.AutoModel.from_config(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
