"""The PD router (`Admission`) and its state (`RouterState`, every field documented): requests
onto prefill ranks (`prefill_routing`), decode KV reservations (`decode_reservation`), KV
transfers to decode (`kv_transfer`), the waiting queues' order (`queue_order`)."""

from eplb.evaluation.serving.simulator.router.admission import Admission
from eplb.evaluation.serving.simulator.router.state import RouterSettings, RouterState

__all__ = ["Admission", "RouterSettings", "RouterState"]
