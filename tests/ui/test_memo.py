import pytest

from ui.memo import ProgressMemo


def test_computes_once_per_key_and_evicts_the_least_recent():
    calls = []

    def compute(key):
        def run(progress):
            progress(0.5, "half")
            calls.append(key)
            return key * 10

        return run

    memo = ProgressMemo(max_entries=2)
    assert memo.get(1, "one", compute(1)) == 10
    assert memo.get(1, "one", compute(1)) == 10
    memo.get(2, "two", compute(2))
    memo.get(1, "one", compute(1))  # 1 is now the most recent
    memo.get(3, "three", compute(3))  # evicts 2
    memo.get(2, "two", compute(2))
    assert calls == [1, 2, 3, 2]


def test_a_failed_computation_is_not_remembered():
    memo = ProgressMemo(max_entries=2)

    def fail(progress):
        raise ValueError("bad input")

    for _ in range(2):
        with pytest.raises(ValueError):
            memo.get("k", "k", fail)
    assert memo.get("k", "k", lambda progress: 7) == 7
