"""A process-wide memo for results computed with a progress bar.

Why not st.cache_resource / st.cache_data: elements drawn inside a cached function (our progress
bar) are replayed on every hit, and st.cache_data pickles what it returns (tensors of hidden
states, here). This is a small, thread-safe LRU shared by every session of the process; on a miss
it draws one st.progress bar, passes its callback to the computation, and removes the bar.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

import streamlit as st

from analysis.progress import Progress

T = TypeVar("T")


class ProgressMemo(Generic[T]):
    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._items: OrderedDict[Hashable, T] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, label: str, compute: Callable[[Progress], T]) -> T:
        """The value for ``key``, computing it as ``compute(progress)`` under a bar on a miss."""
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        bar = st.progress(0.0, text=label)
        try:
            value = compute(
                lambda f, m="": bar.progress(min(max(f, 0.0), 1.0), text=f"{label}: {m}")
            )
        finally:
            bar.empty()  # a failed computation leaves its error message, not a half-full bar
        with self._lock:
            self._items[key] = value
            while len(self._items) > self.max_entries:
                self._items.popitem(last=False)
        return value
