"""`ClusterConfig`: the serving cluster the step-time model and the simulator run, as a
dataclass and a TOML file.

A cluster has prefill units and decode units (`UnitConfig`: nodes x GPUs, expert slots, batch
limits, DP balancer), a model and a hardware preset by name, a dispatch policy, an EPLB block
(`EplbConfig`), a KV store (`KVConfig`), SLOs (`SLOConfig`), an expert-routing source
(`RoutingConfig`) and faults (filled by the simulator). Everything is validated on
construction: a bad value raises one `InputError` naming the field, e.g.
``decode.slots_per_layer 287 is not a multiple of 144 GPUs; use 288``.

TOML (``ClusterConfig.from_toml(path)``, ``config.to_toml()``): top-level keys ``model``,
``hardware``, ``dispatch``, ``name``; tables ``[prefill]``, ``[decode]``, ``[eplb]``, ``[kv]``,
``[slo]``, ``[routing]`` with the dataclasses' field names; ``[[faults]]`` entries. Missing
keys take their defaults; unknown keys are an error. ``from_toml(to_toml(c)) == c``.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from eplb.atomic import atomic_write_text
from eplb.errors import InputError
from eplb.evaluation.serving.config.faults import as_fault
from eplb.evaluation.serving.config.hardware import Hardware, get_hardware
from eplb.evaluation.serving.config.model import ModelSpec, get_model
from eplb.executor.routing import POLICIES
from eplb.topology import Topology

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

PHASES = ("prefill", "decode")
MIGRATION_MODES = ("stall", "overlap")
ROUTING_SOURCES = ("calibrated", "uniform", "trace")
EXTRA_SOLVERS = ("static", "oracle", "balanced")
INITIAL_PLACEMENTS = ("trivial", "history")
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
    DeepSeek's overlap, 1 for none.
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


@dataclass(frozen=True)
class EplbConfig:
    """Expert-placement policy of every unit: ``solver`` (a registered solver, ``static`` =
    keep the initial placement, ``oracle`` = place on the future load, ``balanced`` =
    perfectly balanced routing, SGLang's "simulated perfect EPLB") with ``options``,
    rebalanced every ``rebalance_interval_s`` from the last ``history_s`` of load; moving
    weights at ``migration_gbps`` (GB/s per GPU) either stalls the unit (``stall``) or runs
    beside serving (``overlap``). ``initial``: the placement at the start, ``trivial`` (slot
    ``p`` holds expert ``p mod E``, a runtime's default) or ``history`` (solved on the
    ``history_s`` of expected load before the start, as from a recorded distribution).
    ``base_solver``: the registered solver ``static`` (for a ``history`` start) and
    ``oracle`` place with."""

    solver: str = "deepseek"
    rebalance_interval_s: float = 600.0
    history_s: float = 600.0
    migration: str = "overlap"
    migration_gbps: float = 50.0
    options: dict = field(default_factory=dict)
    initial: str = "trivial"
    base_solver: str = "deepseek"

    def check(self) -> None:
        from eplb import solvers
        names = (*solvers.available(), *EXTRA_SOLVERS)
        if self.solver not in names:
            raise InputError(
                f"eplb.solver {self.solver!r} is unknown; use one of {', '.join(names)}"
            )
        if self.base_solver not in solvers.available():
            raise InputError(
                f"eplb.base_solver {self.base_solver!r} is unknown; use one of "
                f"{', '.join(solvers.available())}"
            )
        _choice("eplb.initial", self.initial, INITIAL_PLACEMENTS)
        _num("eplb.rebalance_interval_s", self.rebalance_interval_s)
        _num("eplb.history_s", self.history_s)
        _choice("eplb.migration", self.migration, MIGRATION_MODES)
        _num("eplb.migration_gbps", self.migration_gbps)
        _options("eplb.options", self.options)


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
    transfer_gbps: float = 50.0

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


_BLOCKS = {"eplb": EplbConfig, "kv": KVConfig, "slo": SLOConfig, "routing": RoutingConfig}


# ----------------------------------------------------------------------------- cluster
@dataclass(frozen=True)
class ClusterConfig:
    """A PD-disaggregated cluster: ``model`` and ``hardware`` preset names, ``prefill`` and
    ``decode`` units, the ``dispatch`` policy (`eplb.executor.routing`), ``eplb``, ``kv``,
    ``slo``, ``routing`` blocks and ``faults`` (simulator fault objects or their tables).
    Seed-independent: the simulator takes the seed."""

    model: str = "deepseek_v3"
    hardware: str = "h800"
    prefill: UnitConfig = field(
        default_factory=lambda: UnitConfig(token_budget=DEFAULT_TOKEN_BUDGET)
    )
    decode: UnitConfig = field(
        default_factory=lambda: UnitConfig(nodes=18, max_running_requests=128)
    )
    dispatch: str = "even"
    eplb: EplbConfig = field(default_factory=EplbConfig)
    kv: KVConfig = field(default_factory=KVConfig)
    slo: SLOConfig = field(default_factory=SLOConfig)
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    faults: tuple[Any, ...] = ()
    name: str = "custom"

    def __post_init__(self) -> None:
        if isinstance(self.faults, list):
            object.__setattr__(self, "faults", tuple(self.faults))
        self.validate()

    # ---------------------------------------------------------------- access
    @property
    def model_spec(self) -> ModelSpec:
        return get_model(self.model)

    @property
    def hardware_spec(self) -> Hardware:
        return get_hardware(self.hardware)

    def unit(self, phase: str) -> UnitConfig:
        """The prefill or decode `UnitConfig`."""
        return getattr(self, _choice("phase", phase, PHASES))

    def topology(self, phase: str) -> Topology:
        """The phase's unit as a `Topology` with the hardware's effective bandwidths."""
        return self.unit(phase).topology(self.hardware_spec)

    def validate(self) -> ClusterConfig:
        """Check every field; raise one `InputError` naming the first bad one."""
        try:
            model = get_model(self.model)
        except InputError as exc:
            raise InputError(f"model: {exc}") from None
        try:
            get_hardware(self.hardware)
        except InputError as exc:
            raise InputError(f"hardware: {exc}") from None
        for phase in PHASES:
            unit = getattr(self, phase)
            if not isinstance(unit, UnitConfig):
                raise InputError(f"{phase} must be a UnitConfig, got {type(unit).__name__}")
            unit.check(phase, model, phase)
        for name, cls in _BLOCKS.items():
            block = getattr(self, name)
            if not isinstance(block, cls):
                raise InputError(f"{name} must be a {cls.__name__}, got {type(block).__name__}")
            block.check()
        _choice("dispatch", self.dispatch, tuple(p for p in POLICIES if p != "lp"))
        _str("name", self.name)
        if not isinstance(self.faults, tuple):
            raise InputError(f"faults must be a list, got {type(self.faults).__name__}")
        faults = tuple(as_fault(f) for f in self.faults)
        for i, fault in enumerate(faults):
            phase, index = fault.unit
            unit = getattr(self, phase)
            if index >= unit.count:
                raise InputError(
                    f"faults[{i}]: unit ({phase!r}, {index}) does not exist; the cluster has "
                    f"{unit.count} {phase} unit(s), indices 0..{unit.count - 1}"
                )
            if fault.gpu >= unit.num_gpus:
                raise InputError(
                    f"faults[{i}]: GPU {fault.gpu} does not exist; a {phase} unit has "
                    f"{unit.num_gpus} GPUs, indices 0..{unit.num_gpus - 1}"
                )
        object.__setattr__(self, "faults", faults)
        return self

    # --------------------------------------------------------------- files
    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (``None`` fields dropped) for TOML/JSON."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "faults":
                out["faults"] = [_fault_dict(x) for x in value]
            elif hasattr(value, "__dataclass_fields__"):
                out[f.name] = {
                    k.name: _plain(getattr(value, k.name))
                    for k in fields(value)
                    if getattr(value, k.name) is not None
                }
            else:
                out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ClusterConfig:
        """Build from a nested mapping (TOML/JSON shape); unknown keys are an error."""
        if not isinstance(data, Mapping):
            raise InputError(f"a cluster config must be a table, got {type(data).__name__}")
        known = {f.name: f for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key not in known:
                raise InputError(f"unknown key {key!r}; known keys: {', '.join(known)}")
            if key in PHASES:
                kwargs[key] = _block(UnitConfig, key, value)
            elif key in _BLOCKS:
                kwargs[key] = _block(_BLOCKS[key], key, value)
            elif key == "faults":
                if not isinstance(value, (list, tuple)):
                    raise InputError(f"faults must be a list of tables, got {value!r}")
                kwargs[key] = tuple(value)
            else:
                kwargs[key] = value
        return cls(**kwargs)

    def to_toml(self) -> str:
        """The config as TOML text (`from_toml` reads it back to an equal config)."""
        return _toml(self.to_dict())

    @classmethod
    def from_toml(cls, path: str | os.PathLike) -> ClusterConfig:
        """Read a TOML file (see the module docstring for its layout)."""
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise InputError(f"cannot read cluster config {p}: {exc.strerror or exc}") from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise InputError(f"{p} is not valid TOML: {exc}") from None
        try:
            return cls.from_dict(data)
        except InputError as exc:
            raise InputError(f"{p}: {exc}") from None

    def write_toml(self, path: str | os.PathLike) -> Path:
        """Write `to_toml` atomically to ``path``."""
        p = Path(path)
        atomic_write_text(p, self.to_toml())
        return p

    # ------------------------------------------------------------- presets
    @classmethod
    def deepseek_day6(cls) -> ClusterConfig:
        """DeepSeek-V3/R1 serving as published on Day 6 (open-infra-index, 2025-03-01), H800.

        Prefill units of 4 nodes (EP32, DP32) and decode units of 18 nodes (EP144, DP144),
        both with 32 redundant experts (288 slots); DBO in prefill (16,384 tokens per rank,
        as in DeepSeek's profile), 5-stage pipeline in decode (128 requests per rank as in the
        profile). One unit of each: Day-6's fleet averaged 226.75 nodes, about 24 prefill
        and 7 decode units of these sizes [derived in serving-facts.md]; set ``count``.
        Assumptions (not published): ``even`` dispatch, one MTP draft token accepted with
        0.85 (DeepSeek-V3 report: 85-90%), rebalancing every 10 minutes from the last 10
        (starting from a placement solved on the 10 minutes before, as a running service has),
        an unbounded on-disk store read at 40 GiB/s per node (3FS README), SLOs of 2 s TTFT
        and 50 ms TPOT (Day-6's 20-22 tok/s per user).
        """
        hw = get_hardware("h800")
        model = get_model("deepseek_v3")
        return cls(
            model="deepseek_v3",
            hardware="h800",
            prefill=UnitConfig(
                nodes=4,
                slots_per_layer=288,
                token_budget=DEFAULT_TOKEN_BUDGET,
                balancer="deepseek_prefill",
            ),
            decode=UnitConfig(
                nodes=18,
                slots_per_layer=288,
                max_running_requests=128,
                kv_capacity_tokens=kv_capacity_tokens(model, hw, 2),
                mtp_draft_tokens=1,
                mtp_acceptance=0.85,
                balancer="deepseek_decode",
            ),
            dispatch="even",
            eplb=EplbConfig(
                solver="deepseek",
                rebalance_interval_s=600.0,
                history_s=600.0,
                initial="history",
            ),
            kv=KVConfig(store_capacity_blocks=None, store_load_gbps=42.9),
            slo=SLOConfig(ttft_s=2.0, tpot_s=0.05),
            routing=RoutingConfig(source="calibrated"),
            name="deepseek_day6",
        )

    @classmethod
    def sglang_96xh100(cls) -> ClusterConfig:
        """SGLang's large-scale EP deployment of DeepSeek-V3 on H100 (LMSYS blog, 2025-05-05;
        commands in sgl-project/sglang#6017).

        Prefill: 4 nodes, EP32, 16,384 tokens per rank, two-batch overlap; decode: 9 nodes,
        EP72, up to 256 running requests per rank (``--cuda-graph-bs 256``); both with
        ``--ep-num-redundant-experts 32`` (288 slots: 9 per GPU in prefill, 4 in decode; the
        decode command of #6017 and a user's copy of its prefill command), DeepSeek's EPLB
        algorithm, round-robin DP routing, KV capacity from ``--mem-fraction-static 0.846``
        (#6017 decode command). Dispatch ``random`` as in that prefill command (the blog does
        not say; ``even`` and ``random`` have the same counts-mode expectation). The blog's 12
        nodes ran the phases separately; one unit of each is 13 nodes.
        """
        hw = get_hardware("h100")
        model = get_model("deepseek_v3")
        return cls(
            model="deepseek_v3",
            hardware="h100",
            prefill=UnitConfig(
                nodes=4,
                slots_per_layer=288,
                token_budget=DEFAULT_TOKEN_BUDGET,
                balancer="round_robin",
            ),
            decode=UnitConfig(
                nodes=9,
                slots_per_layer=288,
                max_running_requests=256,
                kv_capacity_tokens=kv_capacity_tokens(model, hw, 4, memory_fraction=0.846),
                balancer="round_robin",
            ),
            dispatch="random",
            eplb=EplbConfig(solver="deepseek"),
            kv=KVConfig(store_capacity_blocks=0, gpu_cache_blocks=0),
            slo=SLOConfig(ttft_s=5.0, tpot_s=0.1),
            routing=RoutingConfig(source="calibrated"),
            name="sglang_96xh100",
        )

    def replace(self, **changes: Any) -> ClusterConfig:
        """A validated copy with top-level fields changed (`dataclasses.replace`)."""
        return replace(self, **changes)


def kv_capacity_tokens(
    model: ModelSpec, hardware: Hardware, slots_per_gpu: int, *, memory_fraction: float = 0.85
) -> int:
    """Tokens of KV cache one rank holds: ``memory_fraction`` of HBM minus the weights it
    keeps (`ModelSpec.weight_bytes_per_gpu`), over the KV bytes of a token in every layer."""
    free = hardware.hbm_gb * 1e9 * memory_fraction - model.weight_bytes_per_gpu(slots_per_gpu)
    if free <= 0:
        raise InputError(
            f"{model.name}'s weights do not fit {hardware.name} with "
            f"{slots_per_gpu} experts per GPU"
        )
    return int(free // (model.kv_bytes_per_token * model.num_layers))


def _block(cls, name: str, value):
    """A block from its table; missing keys take the dataclass defaults (a missing *table*
    takes `ClusterConfig`'s default block instead)."""
    if not isinstance(value, Mapping):
        raise InputError(f"{name} must be a table, got {type(value).__name__}")
    known = {f.name for f in fields(cls)}
    bad = [k for k in value if k not in known]
    if bad:
        raise InputError(f"unknown key {name}.{bad[0]}; known keys: {', '.join(sorted(known))}")
    return cls(**value)


def _plain(value):
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _fault_dict(fault) -> dict:
    if isinstance(fault, Mapping):
        return _plain(fault)
    if hasattr(fault, "to_dict"):
        return _plain(fault.to_dict())
    if hasattr(fault, "__dataclass_fields__"):
        return {
            f.name: _plain(getattr(fault, f.name))
            for f in fields(fault)
            if getattr(fault, f.name) is not None
        }
    raise InputError(f"faults hold tables or fault objects, got {type(fault).__name__}")


# --------------------------------------------------------------------- TOML emitter
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):  # TOML basic string: JSON escapes minus \uD800 pairs, plus DEL
        return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007F")
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return (
            "{" + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items() if x is not None) + "}"
        )
    raise InputError(f"cannot write {type(v).__name__} to TOML")


def _key(k: str) -> str:
    return k if _BARE_KEY.fullmatch(k) else _value(str(k))


def _toml(data: Mapping, prefix: str = "") -> str:
    lines, tables = [], []
    for k, v in data.items():
        if v is None:
            continue
        if isinstance(v, Mapping):
            tables.append((k, v))
        elif isinstance(v, (list, tuple)) and v and all(isinstance(x, Mapping) for x in v):
            tables.append((k, list(v)))
        else:
            lines.append(f"{_key(k)} = {_value(v)}")
    out = "\n".join(lines)
    for k, v in tables:
        name = f"{prefix}{_key(k)}"
        if isinstance(v, list):
            for item in v:
                body = _toml(item, f"{name}.")
                out += f"\n\n[[{name}]]\n{body}".rstrip() if body else f"\n\n[[{name}]]"
        else:
            body = _toml(v, f"{name}.")
            out += f"\n\n[{name}]\n{body}".rstrip()
    return out.strip() + "\n" if not prefix else out.strip()
