import threading
import time

import pytest

from ui.memo import SLOTS_ENV, ComputeQueue, ProgressMemo, default_slots, waiting_text


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


def _threads(targets):
    threads = [threading.Thread(target=t) for t in targets]
    for thread in threads:
        thread.start()
        time.sleep(0.05)  # start in this order: the queue is first come, first served
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive()


def test_the_queue_runs_at_most_its_slots_in_the_order_asked():
    queue = ComputeQueue(slots=2)
    running, peak, order = [0], [0], []
    lock = threading.Lock()

    def job(name):
        def run():
            with queue.turn():
                with lock:
                    running[0] += 1
                    peak[0] = max(peak[0], running[0])
                    order.append(name)
                time.sleep(0.2)
                with lock:
                    running[0] -= 1

        return run

    _threads([job(k) for k in range(6)])
    assert peak[0] == 2
    assert order == list(range(6))
    assert queue.busy == (0, 0)


def test_a_waiting_computation_is_told_how_many_are_ahead_and_can_leave():
    queue = ComputeQueue(slots=1)
    release = threading.Event()
    seen = {1: [], 2: []}

    def first():
        with queue.turn():
            release.wait(5)

    def waiter(name, stop_after=None):
        def on_wait(ahead):
            seen[name].append(ahead)
            if stop_after is not None and len(seen[name]) >= stop_after:
                raise RuntimeError("the session closed its tab")

        def run():
            try:
                with queue.turn(on_wait):
                    pass
            except RuntimeError:
                pass

        return run

    threads = [threading.Thread(target=t) for t in (first, waiter(1, stop_after=2), waiter(2))]
    for thread in threads:
        thread.start()
        time.sleep(0.1)
    time.sleep(1.6)  # waiter 1 leaves at its second redraw, about a second after it asked
    release.set()
    for thread in threads:
        thread.join(10)
    assert seen[1] == [1, 1]  # one computation ahead; then it left the queue
    assert seen[2][0] == 2 and seen[2][-1] == 1  # two ahead, then one once the first waiter left
    assert queue.busy == (0, 0)


def test_a_nested_computation_does_not_wait_for_its_own_turn():
    queue = ComputeQueue(slots=1)
    with queue.turn(), queue.turn():
        assert queue.busy == (1, 0)
    assert queue.busy == (0, 0)


def test_sessions_asking_for_the_same_value_at_once_share_one_computation():
    memo = ProgressMemo(max_entries=4, queue=ComputeQueue(slots=1))
    calls, results = [], []

    def compute(progress):
        calls.append(1)
        time.sleep(0.3)
        return 42

    _threads([lambda: results.append(memo.get("k", "k", compute)) for _ in range(4)])
    assert results == [42] * 4 and len(calls) == 1


def test_when_the_shared_computation_fails_a_waiting_session_computes_it_itself():
    memo = ProgressMemo(max_entries=4, queue=ComputeQueue(slots=2))
    outcomes = []

    def fail(progress):
        time.sleep(0.3)
        raise ValueError("bad input")

    def first():
        try:
            memo.get("k", "k", fail)
        except ValueError:
            outcomes.append("failed")

    def second():
        outcomes.append(memo.get("k", "k", lambda progress: 7))

    _threads([first, second])
    assert sorted(outcomes, key=str) == [7, "failed"]


def test_slots_follow_the_compute_processes_and_the_earlier_setting_still_counts(monkeypatch):
    """One slot per compute worker (TUNESCOPE_PROCESSES), at least two; the earlier
    TUNESCOPE_COMPUTE_SLOTS is read, with a note."""
    monkeypatch.delenv(SLOTS_ENV, raising=False)
    monkeypatch.setenv("TUNESCOPE_PROCESSES", "3")
    assert default_slots() == 3
    monkeypatch.setenv("TUNESCOPE_PROCESSES", "1")  # computing in the server's threads
    assert default_slots() == 2
    monkeypatch.setenv(SLOTS_ENV, "5")
    with pytest.warns(FutureWarning, match="TUNESCOPE_COMPUTE_SLOTS is deprecated"):
        assert default_slots() == 5
    monkeypatch.setenv(SLOTS_ENV, "none")
    with pytest.raises(ValueError, match="whole number"), pytest.warns(FutureWarning):
        default_slots()
    assert "2 computations are ahead of yours" in waiting_text("Layer metrics", 2)


def test_a_page_views_later_computations_go_before_views_opened_after_it():
    """Priority = when the page view started: view A's second computation does not queue behind
    view B's first, though B asked for it earlier (A gets FOLLOW_ON_S to ask again)."""
    queue = ComputeQueue(slots=1)
    view_a, view_b = queue.next_priority(), queue.next_priority()
    order, hold = [], threading.Event()

    def a():
        with queue.turn(priority=view_a):
            order.append("a1")
            hold.wait(5)
        time.sleep(0.05)  # the page draws its first result, then asks for the next one
        with queue.turn(priority=view_a):
            order.append("a2")

    def b():
        with queue.turn(priority=view_b):
            order.append("b1")

    _threads([a, b, lambda: (time.sleep(0.1), hold.set())])
    assert order == ["a1", "a2", "b1"]


def test_a_view_that_asks_for_nothing_more_frees_the_slot_after_the_follow_on_time():
    queue = ComputeQueue(slots=1)
    view_a, view_b = queue.next_priority(), queue.next_priority()
    with queue.turn(priority=view_a):
        pass
    clock = time.monotonic()
    with queue.turn(priority=view_b):
        waited = time.monotonic() - clock
    assert 0.3 < waited < 0.5 + 1.0


@pytest.mark.parametrize("later", [True, False])
def test_a_refinement_asked_for_later_waits_behind_views_opened_before_it(monkeypatch, later):
    """``later=True`` (the layer repeats): view A's refinement queues by when it is asked for, so
    view B, opened after A but before A asked, gets its first figure first. Without it, A's
    computations keep their view's place."""
    import ui.memo

    queue = ComputeQueue(slots=1)
    memo = ProgressMemo(max_entries=4, queue=queue)
    view_a, view_b = queue.next_priority(), queue.next_priority()
    order, hold = [], threading.Event()
    views = threading.local()  # each thread's page view, as the session state would hold it
    monkeypatch.setattr(ui.memo, "run_priority", lambda: getattr(views, "priority", None))

    def a():
        views.priority = view_a
        with queue.turn(priority=view_a):
            order.append("a: figure")
            hold.wait(5)
        memo.get("repeats", "repeats", lambda progress: order.append("a: repeats"), later=later)

    def b():
        with queue.turn(priority=view_b):
            order.append("b: figure")

    _threads([a, b, lambda: (time.sleep(0.1), hold.set())])
    first = ["a: figure", "b: figure", "a: repeats"]
    assert order == (first if later else ["a: figure", "a: repeats", "b: figure"])


def test_the_compute_log_says_what_was_asked_computed_and_served(tmp_path, monkeypatch):
    from ui.memo import LOG_ENV

    log = tmp_path / "compute.log"
    monkeypatch.setenv(LOG_ENV, str(log))
    memo = ProgressMemo(max_entries=2, queue=ComputeQueue(1))
    before = time.time()
    memo.get("k", "Layer metrics", lambda progress: time.sleep(0.2) or 1)
    memo.get("k", "Layer metrics", lambda progress: 2)
    lines = [line.split("\t") for line in log.read_text().splitlines()]
    assert [fields[0] for fields in lines] == ["asked", "computed", "hit"]
    assert all(len(fields) == 5 and fields[3] == "Layer metrics" for fields in lines)
    assert all(fields[4] == "-" for fields in lines)  # no Streamlit session here
    asked, computed = float(lines[0][2]), float(lines[1][2])
    assert before - 0.01 <= asked <= computed and float(lines[1][1]) >= 0.2
    assert computed - asked >= 0.19  # (both rounded to the millisecond)

    def fail(progress):
        raise ValueError("one class only")

    with pytest.raises(ValueError):
        memo.get("bad", "Layer metrics", fail)
    assert log.read_text().splitlines()[-1].split("\t")[0] == "failed"
