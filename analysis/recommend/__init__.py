"""The recommendation: candidates from the analyses, their budget, the comparison at equal budget
and the sentence (docs/explanation/recommendation.md). This file stays empty."""
