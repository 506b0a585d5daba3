import math

import numpy as np
import pytest

from analysis.scores import METRIC_LABELS, METRICS, task_score


def test_accuracy_by_hand():
    assert task_score("accuracy", [0, 1, 1, 0], [0, 1, 0, 0]) == pytest.approx(0.75)


@pytest.mark.parametrize(
    "true, pred",
    [
        (np.array([0, 2, 1, 1, 2, 0, 5]), np.array([0, 2, 2, 1, 0, 0, 5])),  # int64 class ids
        (np.array([0, 1, 1], dtype=np.int32), np.array([1, 1, 1], dtype=np.int8)),  # mixed ints
        (np.array([True, False, True]), np.array([True, True, True])),
        (np.array(["pos", "neg", "neg"]), np.array(["pos", "pos", "neg"])),
        (
            np.array([0, 1, 1, 0]),
            np.array([0.0, 1.0, 0.0, 0.0]),
        ),  # int vs float: scikit-learn's path
    ],
)
def test_accuracy_equals_scikit_learns_for_every_label_kind(true, pred):
    """The fast share of matches for labels of one kind is scikit-learn's accuracy_score to the
    last bit; other kinds go through scikit-learn itself."""
    from sklearn.metrics import accuracy_score

    assert task_score("accuracy", true, pred) == float(accuracy_score(true, pred))
    rng = np.random.default_rng(0)
    y, p = rng.integers(0, 3, 1001), rng.integers(0, 3, 1001)
    assert task_score("accuracy", y, p) == float(accuracy_score(y, p))


def test_accuracy_of_continuous_predictions_is_refused_as_scikit_learn_refuses_it():
    with pytest.raises(ValueError):
        task_score("accuracy", np.array([0, 1, 1]), np.array([0.2, 0.9, 0.4]))


def test_f1_binary_by_hand():
    # TP = 2, FP = 1, FN = 1: precision = recall = 2/3, so F1 = 2/3.
    assert task_score("f1", [1, 1, 0, 0, 1], [1, 0, 1, 0, 1]) == pytest.approx(2 / 3)


def test_f1_scores_the_positive_class_only():
    # Class 1 is positive: TP = 1, FP = 2, FN = 1, so P = 1/3, R = 1/2 and F1 = 0.4
    # (class 0 as positive would give 0.0).
    assert task_score("f1", [0, 0, 1, 1], [1, 1, 1, 0]) == pytest.approx(0.4)


def test_f1_without_positives_is_zero():
    assert task_score("f1", [0, 0, 1], [0, 0, 0]) == 0.0


def test_mcc_by_hand():
    # TP = 2, TN = 1, FP = 1, FN = 1: (2*1 - 1*1) / sqrt(3*3*2*2) = 1/6.
    assert task_score("mcc", [1, 1, 0, 0, 1], [1, 0, 1, 0, 1]) == pytest.approx(1 / 6)


def test_mcc_perfect_and_inverted():
    assert task_score("mcc", [0, 1, 0, 1], [0, 1, 0, 1]) == pytest.approx(1.0)
    assert task_score("mcc", [0, 1, 0, 1], [1, 0, 1, 0]) == pytest.approx(-1.0)


def test_spearman_by_hand():
    # No ties: rho = 1 - 6 * sum(d^2) / (n (n^2 - 1)) = 1 - 6 * 2 / 60 = 0.8.
    assert task_score("spearman", [1.0, 2.0, 3.0, 4.0], [0.1, 0.3, 0.2, 0.4]) == pytest.approx(0.8)


def test_spearman_is_rank_based():
    x = np.arange(10, dtype=float)
    assert task_score("spearman", x, np.exp(x)) == pytest.approx(1.0)


def test_spearman_of_constant_input_is_nan():
    assert math.isnan(task_score("spearman", [1.0, 2.0, 3.0], [5.0, 5.0, 5.0]))


def test_unknown_metric():
    with pytest.raises(ValueError, match="Unknown metric 'bleu'"):
        task_score("bleu", [0, 1], [0, 1])


def test_shape_mismatch_and_empty():
    with pytest.raises(ValueError, match="one length"):
        task_score("accuracy", [0, 1, 1], [0, 1])
    with pytest.raises(ValueError, match="empty"):
        task_score("accuracy", [], [])


def test_every_metric_has_a_label():
    assert set(METRIC_LABELS) == set(METRICS)
