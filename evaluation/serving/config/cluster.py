"""`ClusterConfig`: the serving cluster the step-time model and the simulator run, as one
validated dataclass that reads and writes TOML (layout in docs/serving.md, "Cluster config");
``from_toml(to_toml(c)) == c``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Any, get_args

from eplb.atomic import atomic_write_text
from eplb.errors import InputError
from eplb.evaluation.serving.config import limits, presets, toml
from eplb.evaluation.serving.config.dispatch import (
    DuplicateConfig,
    check_dispatch,
    check_shared_expert,
    dispatch_names,
)
from eplb.evaluation.serving.config.faults import as_fault
from eplb.evaluation.serving.config.hardware import LP_OVERHEAD_S, Hardware, get_hardware
from eplb.evaluation.serving.config.model import ModelSpec, get_model
from eplb.evaluation.serving.config.schema import (
    BLOCKS,
    DEFAULT_TOKEN_BUDGET,
    PHASES,
    EplbConfig,
    EplbMode,
    KVConfig,
    RoutingConfig,
    SchedulerConfig,
    SLOConfig,
    UnitConfig,
    _choice,
    _str,
)
from eplb.solvers.primitives.replica_graph import Graph, graph_misfit
from eplb.topology import Topology


class Table(dict):
    """A read-only TOML table (a ``[hardware]`` table in a config): equal to the dict it was
    built from, hashable, picklable; nested tables are `Table` too."""

    def __init__(self, data: Mapping = ()) -> None:
        super().__init__({str(k): Table(v) if isinstance(v, Mapping) else v
                          for k, v in dict(data).items()})

    def _refuse(self, *args, **kwargs):
        raise TypeError("a config table is read-only; build a new config (config.replace)")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _refuse

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted((k, v if not isinstance(v, list) else tuple(v))
                                 for k, v in self.items())))

    def __reduce__(self):
        return (Table, (dict(self),))

    def plain(self) -> dict:
        """A plain (mutable) dict copy, nested tables included."""
        return {k: v.plain() if isinstance(v, Table) else v for k, v in self.items()}


@dataclass(frozen=True)
class ClusterConfig:
    """A PD-disaggregated cluster: ``model`` (a preset name or the path of a Hugging Face
    ``config.json``, `model.get_model`), ``hardware`` (a preset name, the path of a TOML file
    of datasheet figures, or such a ``[hardware]`` table, `hardware.get_hardware`), ``prefill`` and
    ``decode`` units, the ``dispatch`` policy (`eplb.dispatch`; ``lp_overhead_s``:
    seconds per MoE layer and micro-batch the ``lp`` split adds; ``shared_expert``: ``"local"``
    or ``"waterfill"``, `eplb.dispatch.SHARED_EXPERT`; ``duplicate``: the settings and costs of
    ``dispatch="duplicate"``, `config.dispatch.DuplicateConfig`), ``eplb``, ``kv``,
    ``slo``, ``routing``, ``scheduler`` blocks and ``faults`` (simulator fault objects or
    their tables). Seed-independent: the simulator takes the seed."""

    model: str = "deepseek_v3"
    hardware: str | Mapping = "h800"
    prefill: UnitConfig = field(
        default_factory=lambda: UnitConfig(token_budget=DEFAULT_TOKEN_BUDGET)
    )
    decode: UnitConfig = field(
        default_factory=lambda: UnitConfig(nodes=18, max_running_requests=128)
    )
    dispatch: str = "even"
    lp_overhead_s: float = LP_OVERHEAD_S
    shared_expert: str = "local"
    duplicate: DuplicateConfig = field(default_factory=DuplicateConfig)
    eplb: EplbConfig = field(default_factory=EplbConfig)
    kv: KVConfig = field(default_factory=KVConfig)
    slo: SLOConfig = field(default_factory=SLOConfig)
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    faults: tuple[Any, ...] = ()
    name: str = "custom"

    def __post_init__(self) -> None:
        if isinstance(self.faults, list):
            object.__setattr__(self, "faults", tuple(self.faults))
        for name in ("model", "hardware"):  # a file: its absolute path (a Path: its text)
            value = getattr(self, name)
            if isinstance(value, os.PathLike):
                value = os.fspath(value)
            if isinstance(value, str) and not Path(value).is_absolute() and _is_file(value):
                value = str(Path(value).resolve())
            object.__setattr__(self, name, value)
        if isinstance(self.hardware, Mapping) and not isinstance(self.hardware, Table):
            object.__setattr__(self, "hardware", Table(self.hardware))
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

    @cached_property
    def _phase_eplb(self) -> dict[str, EplbConfig]:
        return {ph: self.eplb.override(getattr(self, ph).eplb) for ph in PHASES}

    def eplb_for(self, phase: str) -> EplbConfig:
        """The placement policy of the ``phase`` units: ``[eplb]`` with the phase's own table
        (``[prefill.eplb]`` / ``[decode.eplb]``, `UnitConfig.eplb`) laid over it field by
        field (`EplbConfig.override`), resolved once."""
        return self._phase_eplb[_choice("phase", phase, PHASES)]

    def eplb_path(self, phase: str, key: str) -> str:
        """Where ``key`` of the ``phase`` policy is set: ``{phase}.eplb.{key}`` when the phase's
        table sets it, else ``eplb.{key}`` (error messages name the table to fix)."""
        return f"{phase}.eplb.{key}" if key in self.unit(phase).eplb else f"eplb.{key}"

    def with_eplb(self, eplb: EplbConfig) -> ClusterConfig:
        """A validated copy placing every unit by ``eplb`` (the phases' own tables dropped)."""
        return replace(self, eplb=eplb, prefill=replace(self.prefill, eplb={}),
                       decode=replace(self.decode, eplb={}))

    def validate(self) -> ClusterConfig:
        """Check every field; raise one `InputError` naming the first bad one."""
        if not isinstance(self.model, str):
            raise InputError(f"model must be a preset name or the path of a config.json, got "
                             f"{type(self.model).__name__}")
        if not isinstance(self.hardware, (str, Mapping)):
            raise InputError(f"hardware must be a preset name, a TOML file or a [hardware] "
                             f"table, got {type(self.hardware).__name__}")
        try:
            model = get_model(self.model)
        except InputError as exc:
            raise InputError(f"model: {exc}") from None
        try:
            hardware = get_hardware(self.hardware)
        except InputError as exc:
            raise InputError(f"hardware: {exc}") from None
        for phase in PHASES:
            unit = getattr(self, phase)
            if not isinstance(unit, UnitConfig):
                raise InputError(f"{phase} must be a UnitConfig, got {type(unit).__name__}")
            unit.check(phase, model, phase)
            hardware.check_node(unit.gpus_per_node, f"{phase}.gpus_per_node")
        for name, cls in BLOCKS.items():
            block = getattr(self, name)
            if not isinstance(block, cls):
                raise InputError(f"{name} must be a {cls.__name__}, got {type(block).__name__}")
            block.check()
        for phase in PHASES:  # each phase's policy: [eplb] with its own table over it
            if getattr(self, phase).eplb:
                self.eplb_for(phase).check(f"{phase}.eplb")
        _choice("dispatch", self.dispatch, dispatch_names())
        if check_dispatch(self.dispatch).copies:
            for phase in PHASES:
                try:
                    self.duplicate.check_usable(
                        getattr(self, phase).gpus_per_node, float(model.expert_bytes)
                    )
                except InputError as exc:
                    raise InputError(f"{phase}: {exc}") from None
        self._check_lplb(model)
        v = self.lp_overhead_s
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < float("inf"):
            raise InputError(
                f"lp_overhead_s must be seconds >= 0 (per MoE layer and micro-batch), got {v!r}"
            )
        check_shared_expert(self.shared_expert, model)
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
        limits.check_config(self)  # single operations of bounded simulated time
        return self

    def _check_lplb(self, model: ModelSpec) -> None:
        """LPLB's replica graph (``"lplb"``) only where it fits each phase's unit, as the
        phase's ``eplb.solver`` (with its ``eplb.options.graph``) and as its
        ``eplb.base_solver`` where ``static`` or ``oracle`` places with it (no options reach
        it: the default graph); else one `InputError` naming the field, the phase, the unit
        and the fix, before any run."""
        graphs = get_args(Graph)
        for phase in PHASES:
            cfg = self.eplb_for(phase)
            if cfg.solver == "lplb":
                graph = cfg.options.get("graph", "hypercube")
                where = self.eplb_path(phase, "options")
                if graph not in graphs:
                    raise InputError(
                        f"{where}.graph {graph!r} is unknown; use one of {', '.join(graphs)}"
                    )
                self._check_graph(model, phase, self.eplb_path(phase, "solver"), graph,
                                  f"set {where}.graph or another eplb.solver")
            if cfg.base_solver == "lplb" and cfg.mode in (EplbMode.STATIC, EplbMode.ORACLE):
                self._check_graph(model, phase, self.eplb_path(phase, "base_solver"),
                                  "hypercube",
                                  f"set another eplb.base_solver (eplb.solver {cfg.solver!r} "
                                  "places with it and gives it no eplb.options, so its graph "
                                  "is 'hypercube')")

    def _check_graph(self, model: ModelSpec, phase: str, path: str, graph: str,
                     fix: str) -> None:
        """Raise one `InputError` when ``graph`` does not fit the ``phase`` unit: ``{phase}:
        {path} 'lplb' does not fit ...: {why}; else {fix}``."""
        unit = getattr(self, phase)
        why = graph_misfit(model.num_experts, unit.topology(), graph)
        if why:
            raise InputError(
                f"{phase}: {path} 'lplb' does not fit the {unit.nodes} x "
                f"{unit.gpus_per_node} GPU unit with {unit.slots_per_layer} slots: {why}; "
                f"else {fix}"
            )

    # --------------------------------------------------------------- files
    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (``None`` fields dropped) for TOML/JSON."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "faults":
                out["faults"] = [_fault_dict(x) for x in value]
            elif isinstance(value, Table):
                out[f.name] = value.plain()
            elif hasattr(value, "__dataclass_fields__"):
                out[f.name] = {
                    k.name: _plain(getattr(value, k.name))
                    for k in fields(value)
                    if getattr(value, k.name) is not None
                }
                if f.name in PHASES and not value.eplb:
                    del out[f.name]["eplb"]  # no [prefill.eplb] table: the phase takes [eplb]
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
            elif key in BLOCKS:
                kwargs[key] = _block(BLOCKS[key], key, value)
            elif key == "faults":
                if not isinstance(value, (list, tuple)):
                    raise InputError(f"faults must be a list of tables, got {value!r}")
                kwargs[key] = tuple(value)
            else:
                kwargs[key] = value
        return cls(**kwargs)

    def to_toml(self) -> str:
        """The config as TOML text (`from_toml` reads it back to an equal config)."""
        return toml.dumps(self.to_dict())

    @classmethod
    def load(cls, text: str | os.PathLike) -> ClusterConfig:
        """A TOML file, or a preset by name (`presets.PRESETS`) when no such file exists."""
        if isinstance(text, bool) or not isinstance(text, (str, os.PathLike)):
            raise InputError(f"cluster config must be a TOML file name or a preset name "
                             f"({', '.join(presets.PRESETS)}), got {type(text).__name__}")
        path = Path(text)
        try:
            exists = path.exists()
        except (OSError, ValueError) as exc:  # a name too long, a NUL byte
            raise InputError(f"cluster config {str(text)[:60]!r}: cannot read it "
                             f"({getattr(exc, 'strerror', None) or exc}); give a TOML file or "
                             f"a preset ({', '.join(presets.PRESETS)})") from None
        if not exists and str(text) in presets.PRESETS:
            return getattr(cls, str(text))()
        if not exists:
            raise InputError(
                f"cluster config {str(text)!r} does not exist; give a TOML file or a preset "
                f"({', '.join(presets.PRESETS)})"
            )
        return cls.from_toml(path)

    @classmethod
    def from_toml(cls, path: str | os.PathLike) -> ClusterConfig:
        """Read a TOML file (layout in docs/serving.md, "Cluster config")."""
        data = toml.read(path)
        if not data:  # an empty (truncated?) file would silently be the default cluster
            raise InputError(f"{Path(path)}: the cluster config holds no settings (empty, or "
                             "comments only); write its tables (docs/serving.md, \"Cluster "
                             f"config\") or name a preset ({', '.join(presets.PRESETS)})")
        for key in ("model", "hardware"):  # a relative file name: beside the TOML file
            value = data.get(key)
            if isinstance(value, str) and not Path(value).is_absolute():
                beside = Path(path).parent / value
                try:
                    if not Path(value).exists() and beside.is_file():
                        data[key] = str(beside)
                except (OSError, ValueError):  # a name too long, a NUL byte: refused below
                    pass
        try:
            return cls.from_dict(data)
        except InputError as exc:
            raise InputError(f"{Path(path)}: {exc}") from None

    def write_toml(self, path: str | os.PathLike) -> Path:
        """Write `to_toml` atomically to ``path``."""
        p = Path(path)
        atomic_write_text(p, self.to_toml())
        return p

    # ------------------------------------------------------------- presets
    @classmethod
    def deepseek_day6(cls) -> ClusterConfig:
        """DeepSeek-V3/R1 serving as published on Day 6, H800 (`presets.deepseek_day6`)."""
        return cls(**presets.deepseek_day6())

    @classmethod
    def sglang_96xh100(cls) -> ClusterConfig:
        """SGLang's large-scale EP deployment on H100 (`presets.sglang_96xh100`)."""
        return cls(**presets.sglang_96xh100())

    def replace(self, **changes: Any) -> ClusterConfig:
        """A validated copy with top-level fields changed (`dataclasses.replace`)."""
        return replace(self, **changes)


def _is_file(text: str) -> bool:
    """``text`` names a regular file (a preset name, a name too long or with a NUL: no)."""
    try:
        return Path(text).is_file()
    except (OSError, ValueError):
        return False


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
