"""The simulator's events: kinds, an `Event` (what a handler returns to be scheduled) and the
time-ordered queue the loop owns (a heap; ties in insertion order)."""

from __future__ import annotations

import heapq

# event kinds (the loop dispatches on them)
ARRIVE, P_END, D_END, P_WAKE, D_WAKE, REBAL, LIVE, FAULT, END = range(9)
# events before which the requests that arrived by then are routed (only prefill events
# change what the router reads)
PREFILL_EVENTS = (ARRIVE, P_END, P_WAKE, FAULT, END)

Event = tuple[float, int, object]
"""``(time_s, kind, arg)``: an event a handler schedules (the loop pushes it)."""


class EventQueue:
    """``(time_s, seq, kind, arg)`` entries in a heap: pops in time order, ties first in first
    out (``seq`` counts pushes)."""

    __slots__ = ("_seq", "heap")

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, int, object]] = []
        self._seq = 0

    def push(self, t: float, kind: int, arg=None) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (t, self._seq, kind, arg))

    def __len__(self) -> int:
        return len(self.heap)
