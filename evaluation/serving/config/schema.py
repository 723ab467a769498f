"""The blocks of a cluster config: `UnitConfig`, `EplbConfig`, `KVConfig`, `SLOConfig`,
`RoutingConfig`, each validated on construction (one `InputError` naming the field); the typed
choices an `EplbConfig` resolves its strings to once (`EplbMode`, `InitialPlacement`)."""

from __future__ import annotations

import enum
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from functools import cached_property

from eplb import solvers
from eplb.errors import InputError
from eplb.evaluation.serving.config.dispatch import DuplicateConfig
from eplb.evaluation.serving.config.hardware import Hardware
from eplb.evaluation.serving.config.model import ModelSpec
from eplb.topology import RDMA_GBPS, Topology

PHASES = ("prefill", "decode")
MIGRATION_MODES = ("stall", "overlap")
ROUTING_SOURCES = ("calibrated", "uniform", "trace")


class EplbMode(enum.Enum):
    """What ``eplb.solver`` names (`EplbConfig.mode`): a registered solver that places from
    the load the units record (``SOLVER``), or a pseudo-solver placing with ``eplb.base_solver``:
    ``STATIC`` keeps the initial placement, ``ORACLE`` places on the coming interval's
    expected load, ``BALANCED`` routes perfectly balanced (no placement, SGLang's "simulated
    perfect EPLB")."""

    SOLVER = "solver"
    STATIC = "static"
    ORACLE = "oracle"
    BALANCED = "balanced"

    @property
    def rebalances(self) -> bool:
        """Whether a unit places again every ``eplb.rebalance_interval_s``."""
        return self in (EplbMode.SOLVER, EplbMode.ORACLE)

    @property
    def records_load(self) -> bool:
        """Whether it places from the load the units record (a `simulator.recorder.Recorder`)."""
        return self is EplbMode.SOLVER


class InitialPlacement(enum.Enum):
    """What ``eplb.initial`` names (`EplbConfig.initial_kind`): ``TRIVIAL`` (slot ``p`` holds
    expert ``p mod E``), ``HISTORY`` (solved on the expected load before the start) or
    ``FILE`` (the path of a placement file)."""

    TRIVIAL = "trivial"
    HISTORY = "history"
    FILE = "file"


EXTRA_SOLVERS = tuple(m.value for m in EplbMode if m is not EplbMode.SOLVER)
INITIAL_PLACEMENTS = (InitialPlacement.TRIVIAL.value, InitialPlacement.HISTORY.value)
EMERGENCY_MODES = ("patch", "repair", "resolve")
DECODE_RESERVATION = ("before_prefill", "after_prefill")
SCHEDULE_POLICIES = ("fcfs", "lpm", "first_fit")
PREFILL_ADMISSION = ("rank_queues", "global_queue")  # simulator.router.prefill_routing
MTP_SAMPLING = ("per_step", "mean")
PREFILL_CHUNKING = ("attention", "tokens", "context_parallel")  # steptime.chunking
DEFAULT_TOKEN_BUDGET = 16384  # prefill tokens per rank per step (DeepSeek's profile)


# ------------------------------------------------------------------------- validation
def _int(path: str, value, *, minimum: int = 1, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{path} must be an integer, got {value!r}")
    if value < minimum:
        what = "positive" if minimum == 1 else f">= {minimum}"
        raise InputError(f"{path} must be {what}, got {value}")
    return value


def _num(
    path: str,
    value,
    *,
    minimum: float = 0.0,
    strict: bool = True,
    maximum: float | None = None,
    optional: bool = False,
) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{path} must be a number, got {value!r}")
    value = float(value)
    if math.isnan(value) or (strict and value <= minimum) or (not strict and value < minimum):
        raise InputError(f"{path} must be {'>' if strict else '>='} {minimum:g}, got {value:g}")
    if maximum is not None and value > maximum:
        raise InputError(f"{path} must be <= {maximum:g}, got {value:g}")
    return value


def _choice(path: str, value, choices) -> str:
    if value not in choices:
        raise InputError(f"{path} must be one of {', '.join(choices)}; got {value!r}")
    return value


def _str(path: str, value) -> str:
    if not isinstance(value, str) or not value:
        raise InputError(f"{path} must be a non-empty string, got {value!r}")
    return value


def _options(path: str, value) -> dict:
    if not isinstance(value, Mapping):
        raise InputError(f"{path} must be a table of options, got {type(value).__name__}")
    return dict(value)


# ----------------------------------------------------------------------------- blocks
@dataclass(frozen=True)
class UnitConfig:
    """One kind of unit (all prefill units alike, all decode units alike).

    ``count`` units of ``nodes`` x ``gpus_per_node`` GPUs; each unit is one EP group of
    ``ep_size = nodes * gpus_per_node`` GPUs, one DP attention rank per GPU, holding
    ``slots_per_layer`` expert slots per MoE layer. Prefill: ``token_budget`` new tokens per
    rank per step (chunked prefill). Decode: ``max_running_requests`` and
    ``kv_capacity_tokens`` per rank; ``mtp_draft_tokens`` speculative tokens per request per
    step accepted with probability ``mtp_acceptance`` each. ``balancer`` names the DP balancer
    (`evaluation.serving.balancers`) with ``balancer_options``; ``micro_batches`` is 2 for
    DeepSeek's overlap, 1 for none. ``eplb``: this phase's ``[prefill.eplb]`` /
    ``[decode.eplb]`` table, overriding the cluster's ``[eplb]`` field by field
    (`EplbConfig.override`; `ClusterConfig.eplb_for` gives the result): its own solver and
    options, initial placement file, interval, history, ``min_gain``, migration mode.
    """

    count: int = 1
    nodes: int = 4
    gpus_per_node: int = 8
    slots_per_layer: int = 288
    ep_size: int | None = None
    token_budget: int | None = None
    max_running_requests: int | None = None
    kv_capacity_tokens: int | None = None
    micro_batches: int = 2
    mtp_draft_tokens: int = 0
    mtp_acceptance: float = 0.0
    balancer: str = "round_robin"
    balancer_options: dict = field(default_factory=dict)
    eplb: dict = field(default_factory=dict)

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def slots_per_gpu(self) -> int:
        return self.slots_per_layer // self.num_gpus

    def topology(self, hardware: Hardware | None = None) -> Topology:
        """The unit as a `Topology` (with ``hardware``'s effective link bandwidths if given)."""
        if hardware is not None:
            return hardware.topology(self.nodes, self.gpus_per_node, self.slots_per_gpu)
        return Topology(self.nodes, self.gpus_per_node, self.slots_per_gpu)

    def check(self, path: str, model: ModelSpec, phase: str) -> None:
        _int(f"{path}.count", self.count)
        _int(f"{path}.nodes", self.nodes)
        _int(f"{path}.gpus_per_node", self.gpus_per_node)
        _int(f"{path}.slots_per_layer", self.slots_per_layer)
        g = self.num_gpus
        if self.ep_size is not None:
            _int(f"{path}.ep_size", self.ep_size)
            if self.ep_size != g:
                nodes = -(-self.ep_size // self.gpus_per_node)
                raise InputError(
                    f"{path}.ep_size {self.ep_size} needs {nodes} nodes of "
                    f"{self.gpus_per_node} GPUs but the unit has {self.nodes} "
                    f"({g} GPUs); a unit is exactly one EP group: set nodes = {nodes}"
                    + (
                        ""
                        if self.ep_size % self.gpus_per_node == 0
                        else f" and an EP size that is a multiple of {self.gpus_per_node}"
                    )
                )
        if self.slots_per_layer < model.num_experts:
            raise InputError(
                f"{path}.slots_per_layer {self.slots_per_layer} cannot hold the "
                f"{model.num_experts} experts of {model.name}; use >= "
                f"{-(-model.num_experts // g) * g}"
            )
        if self.slots_per_layer % g:
            up = -(-self.slots_per_layer // g) * g
            raise InputError(
                f"{path}.slots_per_layer {self.slots_per_layer} is not a multiple "
                f"of {g} GPUs; use {up}"
            )
        _int(f"{path}.token_budget", self.token_budget, optional=True)
        _int(f"{path}.max_running_requests", self.max_running_requests, optional=True)
        _int(f"{path}.kv_capacity_tokens", self.kv_capacity_tokens, optional=True)
        if self.micro_batches not in (1, 2) or isinstance(self.micro_batches, bool):
            raise InputError(f"{path}.micro_batches must be 1 or 2, got {self.micro_batches!r}")
        _int(f"{path}.mtp_draft_tokens", self.mtp_draft_tokens, minimum=0)
        _num(f"{path}.mtp_acceptance", self.mtp_acceptance, strict=False, maximum=1.0)
        if phase == "prefill" and self.mtp_draft_tokens:
            raise InputError(f"{path}.mtp_draft_tokens applies to decode units only; set 0")
        _str(f"{path}.balancer", self.balancer)
        _options(f"{path}.balancer_options", self.balancer_options)
        _options(f"{path}.eplb", self.eplb)
        known = [f.name for f in fields(EplbConfig)]
        bad = [k for k in self.eplb if k not in known]
        if bad:
            raise InputError(f"unknown key {path}.eplb.{bad[0]}; a phase's eplb table takes the "
                             f"keys of [eplb]: {', '.join(known)}")


@dataclass(frozen=True)
class EplbConfig:
    """Expert-placement policy of every unit: ``solver`` (a registered solver, ``static`` =
    keep the initial placement, ``oracle`` = place on the future load, ``balanced`` =
    perfectly balanced routing, SGLang's "simulated perfect EPLB") with ``options``,
    rebalanced every ``rebalance_interval_s`` from the last ``history_s`` of load; moving
    weights at ``migration_gbps`` (GB/s per GPU) either stalls the unit (``stall``) or runs
    beside serving (``overlap``). ``initial``: the placement at the start, ``trivial`` (slot
    ``p`` holds expert ``p mod E``, a runtime's default) or ``history`` (solved on the
    ``history_s`` of expected load before the start, as from a recorded distribution) or the
    path of a placement file in any format eplb writes (`eplb.io.read_placement`: the exact
    file an operator deploys; SGLang/TensorRT-LLM/vLLM files take the unit's topology).
    ``base_solver``: the registered solver ``static`` (for a ``history`` start) and
    ``oracle`` place with. ``emergency``: after a GPU failure orphans experts, ``patch``
    (re-home only the orphaned experts, the fewest moves; the next scheduled rebalance
    re-balances fully), ``repair`` (the patch, then the ``repair`` solver until within
    ``emergency_tolerance`` of a fresh greedy solve) or ``resolve`` (place afresh at once with
    the unit's solver). ``min_gain``: a scheduled
    rebalance is skipped when its predicted gain, ``1 - after / before`` of the mean max/mean
    GPU load on the load it was placed from, is below it (0: skip only what would not help;
    a negative value never skips). A phase's ``UnitConfig.eplb`` table overrides these
    field by field (`override`)."""

    solver: str = "deepseek"
    rebalance_interval_s: float = 600.0
    history_s: float = 600.0
    migration: str = "overlap"
    migration_gbps: float = RDMA_GBPS  # weights move over the RDMA NICs
    options: dict = field(default_factory=dict)
    initial: str = "trivial"
    base_solver: str = "deepseek"
    emergency: str = "patch"
    emergency_tolerance: float = 0.02
    min_gain: float = 0.0

    @cached_property
    def mode(self) -> EplbMode:
        """``solver`` resolved: a pseudo-solver or a registered one (`EplbMode`)."""
        return EplbMode(self.solver) if self.solver in EXTRA_SOLVERS else EplbMode.SOLVER

    @cached_property
    def initial_kind(self) -> InitialPlacement:
        """``initial`` resolved: ``trivial``, ``history`` or a placement file."""
        if self.initial in INITIAL_PLACEMENTS:
            return InitialPlacement(self.initial)
        return InitialPlacement.FILE

    @property
    def placing_solver(self) -> str:
        """The registered solver that places: ``solver``, or ``base_solver`` for a
        pseudo-solver."""
        return self.solver if self.mode is EplbMode.SOLVER else self.base_solver

    def override(self, table: Mapping) -> EplbConfig:
        """This config with the fields ``table`` sets (a phase's ``[prefill.eplb]`` /
        ``[decode.eplb]``; `UnitConfig.eplb`) replaced, the others kept. ``options`` belong to
        a solver: a table naming another ``solver`` without ``options`` starts from none."""
        if not table:
            return self
        changes = dict(table)
        if changes.get("solver", self.solver) != self.solver and "options" not in changes:
            changes["options"] = {}
        return replace(self, **changes)

    def to_dict(self) -> dict:
        """Every field as a plain dict (``options`` copied)."""
        return {f.name: dict(v) if isinstance(v := getattr(self, f.name), Mapping) else v
                for f in fields(self)}

    def check(self, path: str = "eplb") -> None:
        """Raise one `InputError` naming the first bad field as ``{path}.{field}``."""
        names = (*solvers.available(), *EXTRA_SOLVERS)
        if not isinstance(self.solver, str) or self.solver not in names:
            raise InputError(
                f"{path}.solver {self.solver!r} is unknown; use one of {', '.join(names)}"
            )
        if self.base_solver not in solvers.available():
            raise InputError(
                f"{path}.base_solver {self.base_solver!r} is unknown; use one of "
                f"{', '.join(solvers.available())}"
            )
        _str(f"{path}.initial", self.initial)
        if self.initial_kind is InitialPlacement.FILE and not os.path.isfile(self.initial):
            raise InputError(
                f"{path}.initial must be one of {', '.join(INITIAL_PLACEMENTS)} or a placement "
                f"file; {self.initial!r} is not a file"
            )
        _num(f"{path}.rebalance_interval_s", self.rebalance_interval_s)
        _num(f"{path}.history_s", self.history_s)
        _choice(f"{path}.migration", self.migration, MIGRATION_MODES)
        _num(f"{path}.migration_gbps", self.migration_gbps)
        _options(f"{path}.options", self.options)
        _choice(f"{path}.emergency", self.emergency, EMERGENCY_MODES)
        _num(f"{path}.emergency_tolerance", self.emergency_tolerance, strict=False)
        g = self.min_gain
        if isinstance(g, bool) or not isinstance(g, (int, float)) or not -1.0 <= g < 1.0:
            raise InputError(
                f"{path}.min_gain must be a number in [-1, 1) (a relative gain; 0.02 = skip "
                f"rebalances predicted to gain under 2%), got {g!r}"
            )


@dataclass(frozen=True)
class KVConfig:
    """KV caching and transfer: the external prefix store holds ``store_capacity_blocks``
    blocks of ``block_size`` tokens (None = unbounded) and loads at ``store_load_gbps`` GB/s
    per node; each prefill rank keeps ``gpu_cache_blocks`` blocks of GPU-local prefix cache;
    finished prompts move to decode at ``transfer_gbps`` GB/s per GPU."""

    store_capacity_blocks: int | None = None
    block_size: int = 512
    store_load_gbps: float = 42.9
    gpu_cache_blocks: int = 0
    transfer_gbps: float = RDMA_GBPS  # prefill -> decode KV over RDMA

    def check(self) -> None:
        _int("kv.store_capacity_blocks", self.store_capacity_blocks, minimum=0, optional=True)
        _int("kv.block_size", self.block_size)
        _num("kv.store_load_gbps", self.store_load_gbps)
        _int("kv.gpu_cache_blocks", self.gpu_cache_blocks, minimum=0)
        _num("kv.transfer_gbps", self.transfer_gbps)


@dataclass(frozen=True)
class SLOConfig:
    """Service-level objectives: time to first token and time per output token, seconds."""

    ttft_s: float = 2.0
    tpot_s: float = 0.05

    def check(self) -> None:
        _num("slo.ttft_s", self.ttft_s)
        _num("slo.tpot_s", self.tpot_s)


@dataclass(frozen=True)
class RoutingConfig:
    """Where each step's expert routing comes from: ``calibrated`` (DeepSeek-V3 per-layer
    distributions, `traces.synth.calibrated`), ``uniform``, or ``trace`` (replay the
    token-level or count trace at ``path``); ``drift`` and ``burst`` set the generators'
    popularity drift and burst strength (0 = stationary) with further ``options``."""

    source: str = "calibrated"
    path: str | None = None
    drift: float = 0.0
    burst: float = 0.0
    options: dict = field(default_factory=dict)

    def check(self) -> None:
        _choice("routing.source", self.source, ROUTING_SOURCES)
        if self.source == "trace" and not self.path:
            raise InputError("routing.path is required when routing.source is 'trace'")
        if self.path is not None:
            _str("routing.path", self.path)
        _num("routing.drift", self.drift, strict=False)
        _num("routing.burst", self.burst, strict=False)
        _options("routing.options", self.options)


@dataclass(frozen=True)
class SchedulerConfig:
    """How the PD scheduler admits requests (docs/serving.md, "What is simulated").

    ``decode_reservation``: ``before_prefill`` (SGLang's PD decode server pre-allocates a
    request's KV before its prefill may start: a full decode tier holds prompts in the queue)
    or ``after_prefill`` (the KV is reserved once the prefill is done; the prompt waits on the
    prefill side). ``policy``: the router's waiting queues' order (the decode reservation and
    decode queues; under ``global_queue`` the prefill queue too), ``fcfs`` (first come first
    served: the head blocks the queue until it fits), ``lpm`` (SGLang's longest-prefix-match:
    the waiting requests with the most cached prefix first, then FCFS) or ``first_fit`` (each
    waiting request in arrival order takes a rank if one fits, newer ones may overtake: the
    old behaviour). ``reserved_decode_tokens``: output tokens of KV reserved per request beyond its
    prompt (SGLang's ``DEFAULT_RESERVED_DECODE_TOKENS``, 512); a decode rank whose KV then runs
    out retracts its newest requests (they prefill again); None reserves the whole output (no
    retraction can happen). ``mtp_sampling``: ``per_step`` draws each request's accepted MTP
    drafts per step (seeded), ``mean`` emits the mean acceptance every step.
    ``prefill_chunking``: ``attention`` caps a rank's step work (linear tokens plus core
    attention in token equivalents) at what ``token_budget`` costs at 4,096-token prompts, so
    a chunk deep in a long context is shorter; ``tokens`` caps the tokens only;
    ``context_parallel`` is ``attention`` plus pass-KV context parallelism: ranks with spare
    work take pieces of the prompts their own rank cannot finish in the step
    (`steptime.chunking`, arXiv:2411.01783).
    ``prefill_admission``: ``rank_queues`` (SGLang's PD prefill server: every arrival is
    dispatched at once to one DP rank by the prefill balancer, into that rank's unbounded
    first-come-first-served queue; a request still waiting for its decode reservation is
    skipped there, not blocking) or ``global_queue`` (the simulator's former rule, not
    SGLang's: a router-held queue in ``policy`` order, each rank taking at most
    ``token_budget`` queued tokens; docs/serving.md, "What is simulated")."""

    decode_reservation: str = "before_prefill"
    policy: str = "fcfs"
    reserved_decode_tokens: int | None = 512
    mtp_sampling: str = "per_step"
    prefill_chunking: str = "attention"
    prefill_admission: str = "rank_queues"

    def describe(self, prefill_balancer: str, decode_balancer: str) -> dict[str, str]:
        """The run's admission as its results state it (`admission_text` prints it)."""
        return {
            "prefill_admission": self.prefill_admission,
            "prefill_balancer": prefill_balancer,
            "decode_reservation": self.decode_reservation,
            "decode_balancer": decode_balancer,
            "order": self.policy,
            "prefill_chunking": self.prefill_chunking,
        }

    def check(self) -> None:
        _choice("scheduler.decode_reservation", self.decode_reservation, DECODE_RESERVATION)
        _choice("scheduler.policy", self.policy, SCHEDULE_POLICIES)
        _choice("scheduler.prefill_admission", self.prefill_admission, PREFILL_ADMISSION)
        _int("scheduler.reserved_decode_tokens", self.reserved_decode_tokens, optional=True)
        _choice("scheduler.mtp_sampling", self.mtp_sampling, MTP_SAMPLING)
        _choice("scheduler.prefill_chunking", self.prefill_chunking, PREFILL_CHUNKING)


_ADMISSION_TEXT = {
    "rank_queues": "rank_queues (SGLang PD: each arrival dispatched at once to a DP rank's "
    "unbounded FCFS queue)",
    "global_queue": "global_queue (a router-held queue, ranks capped at token_budget queued "
    "tokens; not SGLang's rule)",
}


def admission_text(adm: Mapping[str, str]) -> str:
    """One line naming a run's admission (`SchedulerConfig.describe`'s dict)."""
    rule = _ADMISSION_TEXT.get(adm["prefill_admission"], adm["prefill_admission"])
    when = "before" if adm["decode_reservation"] == "before_prefill" else "after"
    return (
        f"admission: prefill {rule}, prefill balancer {adm['prefill_balancer']}, "
        f"{adm['prefill_chunking']} chunks; decode KV reserved {when} prefill "
        f"({adm['order']} order), decode balancer {adm['decode_balancer']}"
    )


BLOCKS = {
    "eplb": EplbConfig,
    "kv": KVConfig,
    "slo": SLOConfig,
    "routing": RoutingConfig,
    "scheduler": SchedulerConfig,
    "duplicate": DuplicateConfig,
}
