"""The PD cluster's event handlers (`Cluster`): units step, the router (`Admission`) routes,
and each handler returns the events it schedules (the loop owns the queue, as in Vidur).

The order of work within one event is the system's: a prefill step that starts leaves room in
the router's view, so the waiting head is offered again and the units it reached start in
turn (depth first, in unit order); a prefill that ends sends its prompts' KV to decode, then the
decode queue, then the prefill queue are offered; a decode step that ends frees room, then the
unit retracts requests its KV cannot hold. Units and the router never call each other's
handlers: the router returns the units it gave work to, and `Cluster` starts them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from eplb.evaluation.serving.simulator.decode import DecodeUnit
from eplb.evaluation.serving.simulator.events import Event
from eplb.evaluation.serving.simulator.prefill import PrefillUnit
from eplb.evaluation.serving.simulator.router import Admission
from eplb.evaluation.serving.simulator.units import Unit

__all__ = ["Cluster"]


class Cluster:
    """The handlers of the ``prefill`` and ``decode`` units' events and of arrivals, over the
    router ``router``. ``on_*(arg, t)`` handle one event and return what they schedule;
    `flush` routes the requests that arrived by ``t``; `resume` and `after_fault` serve EPLB and
    faults."""

    def __init__(self, prefill: Sequence[PrefillUnit], decode: Sequence[DecodeUnit],
                 router: Admission):
        self.prefill, self.decode, self.router = prefill, decode, router

    # ------------------------------------------------------------------ events
    def flush(self, t: float) -> list[Event]:
        """Route every request that arrived by ``t`` (before a prefill event)."""
        out: list[Event] = []
        self._start_prefills(self.router.flush(t), t, out)
        return out

    def on_arrive(self, arg, t: float) -> list[Event]:
        """An arrival (its requests were routed by `flush` before it)."""
        self.router.arrived()
        return []

    def on_prefill_end(self, u: int, t: float) -> list[Event]:
        """Prefill unit ``u``'s step ends: the finished prompts go on to decode, the decode and
        prefill queues are offered again, the unit's next step starts."""
        unit, router, out = self.prefill[u], self.router, []
        done = unit.end(t)
        router.step_ended(unit, done)
        if done:
            self._kv_sent(router.prefilled([i for _r, i in done], t), t, out)
            self._route_decode(t, out, fresh=True)
        self._route_prefill(t, out)
        self._start_prefill(unit, t, out)
        return out

    def on_decode_end(self, v: int, t: float) -> list[Event]:
        """Decode unit ``v``'s step ends: finished requests free room (the decode queue is
        offered), a rank out of KV retracts its newest requests, the next step starts."""
        unit, router, out = self.decode[v], self.router, []
        done = unit.end(t)
        if done is not None:
            router.finished(unit, *done, t)
            self._route_decode(t, out)
        over = router.kv_over(unit)
        if over is not None:
            gone = unit.retract(over, t)
            if gone:
                router.retracted(unit, gone, t)
                self._start_prefills(router.reroute(t), t, out)
        self._start_decode(unit, t, out)
        return out

    def on_prefill_wake(self, u: int, t: float) -> list[Event]:
        """Prefill unit ``u``'s wake-up (a queued prompt's prefix has loaded)."""
        out: list[Event] = []
        unit = self.prefill[u]
        if unit.woken(t):
            self._start_prefill(unit, t, out)
        return out

    def on_decode_wake(self, v: int, t: float) -> list[Event]:
        """Decode unit ``v``'s wake-up (a request's KV has arrived)."""
        out: list[Event] = []
        unit = self.decode[v]
        if unit.woken(t):
            self._start_decode(unit, t, out)
        return out

    # ------------------------------------------------------------------ for EPLB and faults
    def resume(self, unit: Unit, t: float) -> list[Event]:
        """``unit`` came back from a stall: (prefill) the waiting head is offered, it steps."""
        out: list[Event] = []
        if isinstance(unit, PrefillUnit):
            self._route_prefill(t, out)
            self._start_prefill(unit, t, out)
        else:
            self._start_decode(unit, t, out)
        return out

    def after_fault(self, t: float) -> list[Event]:
        """After a failure: the prefill and decode queues are offered again and every free
        prefill unit steps."""
        out: list[Event] = []
        self._route_prefill(t, out)
        self._route_decode(t, out, fresh=True)
        for unit in self.prefill:
            self._start_prefill(unit, t, out)
        return out

    # ------------------------------------------------------------------ the work of an event
    def _start_prefill(self, unit: PrefillUnit, t: float, out: list[Event]) -> None:
        """Start ``unit``'s next step if it is free (a pending stalling migration first);
        the chunks it takes leave room in the router's view, so the waiting head is offered."""
        if unit.busy or unit.dead:
            return
        if unit.pending_stall is not None:
            out.append(unit.stall(t))
            return
        self.router.step_due(unit, t)
        ev = unit.start(t)
        if ev is not None:
            out.append(ev)
            if unit.busy:  # a step started (else a wake-up)
                self.router.step_started(unit)
                self._route_prefill(t, out)

    def _start_decode(self, unit: DecodeUnit, t: float, out: list[Event]) -> None:
        """Admit the requests whose KV has arrived and start ``unit``'s next step if it is
        free (a pending stalling migration first)."""
        if unit.busy or unit.dead:
            return
        if unit.pending_stall is not None:
            out.append(unit.stall(t))
            return
        joined = unit.admit(t)
        if joined is not None:
            self.router.admitted(unit, *joined)
        ev = unit.start(t)
        if ev is not None:
            out.append(ev)

    def _start_prefills(self, units: Iterable[int], t: float, out: list[Event]) -> None:
        for u in units:
            self._start_prefill(self.prefill[u], t, out)

    def _route_prefill(self, t: float, out: list[Event]) -> None:
        self._start_prefills(self.router.route_prefill(t), t, out)

    def _route_decode(self, t: float, out: list[Event], fresh: bool = False) -> None:
        """Offer the reservation queue (``before_prefill``, when decode room changed) and then
        the decode queue."""
        self._start_prefills(self.router.route_reservations(t), t, out)
        self._kv_sent(self.router.route_decode(t, fresh), t, out)

    def _kv_sent(self, units: Iterable[int], t: float, out: list[Event]) -> None:
        """KV is on its way to the decode ``units``: a free one starts if some has arrived,
        else wakes up when it arrives."""
        for v in units:
            unit = self.decode[v]
            if unit.busy or unit.dead:
                continue
            if unit.next_ready() <= t:
                self._start_decode(unit, t, out)
            else:
                ev = unit.kv_wake()
                if ev is not None:
                    out.append(ev)
