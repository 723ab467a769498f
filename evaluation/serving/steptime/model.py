"""`StepModel`: seconds of one forward step of a prefill or decode unit, and why. It puts the
parts together: the rank side (`rank_side`), the routing of the step's expert load through the
placement by the unit's dispatch policy (`routing`, an `eplb.dispatch.Dispatch`), the GPU side
(`gpu_side`), the all-to-all (`comm`) and the overlap schedule with its breakdown
(`assemble`); docs/serving-calibration.md."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from eplb.errors import InputError
from eplb.evaluation.serving.config.dispatch import (
    DuplicateConfig,
    check_shared_expert,
    unit_dispatch,
)
from eplb.evaluation.serving.config.hardware import LP_OVERHEAD_S, Hardware, h800
from eplb.evaluation.serving.config.model import ModelSpec, deepseek_v3
from eplb.evaluation.serving.steptime.assemble import Assembly
from eplb.evaluation.serving.steptime.batch import RankBatch, check_phase
from eplb.evaluation.serving.steptime.breakdown import StepTime
from eplb.evaluation.serving.steptime.comm import Comm
from eplb.evaluation.serving.steptime.gpu_side import GpuSide
from eplb.evaluation.serving.steptime.rank_side import RankSide
from eplb.evaluation.serving.steptime.routing import (
    RoutedPlacement,
    StepRouting,
    check_step_load,
    normalise,
    per_gpu,
)
from eplb.placement import Placement
from eplb.topology import Topology


class StepModel:
    """The step-time model of one unit (phase, shape, model, hardware, dispatch policy, and
    ``shared_expert``: ``"local"``, each rank runs its own tokens' shared expert, or
    ``"waterfill"``, SGLang's waterline over the ranks, `eplb.dispatch.waterfill`;
    ``dispatch="duplicate"``: per-micro-batch expert copies inside each node on an even split,
    `eplb.dispatch.duplicate`, with the costs of ``duplicate``, a `DuplicateConfig`; ``lp``:
    ``lp_overhead_s`` per MoE layer and micro-batch on the critical path). ``policy`` is the
    unit's configured `eplb.dispatch.Dispatch` (`config.dispatch.unit_dispatch`), ``shared``
    its shared-expert policy; every policy-specific number comes from them.

    Build once per unit and call `time` per step (`time_routed` on a `prepare`d placement is
    the simulator's hot path); `step_time` is the one-call form. ``topology`` gives the unit's
    nodes, GPUs per node and slots per GPU (one DP rank per GPU). Its parts: ``rank``
    (`RankSide`), ``routing`` (`StepRouting`), ``gpu`` (`GpuSide`), ``comm`` (`Comm`),
    ``assembly`` (`Assembly`).
    """

    def __init__(
        self,
        phase: str,
        topology: Topology,
        *,
        model: ModelSpec = deepseek_v3,
        hardware: Hardware = h800,
        dispatch: str = "even",
        micro_batches: int = 2,
        lp_overhead_s: float = LP_OVERHEAD_S,
        shared_expert: str = "local",
        duplicate: DuplicateConfig | None = None,
    ) -> None:
        self.phase = check_phase(phase)
        if not isinstance(topology, Topology):
            raise InputError(f"topology must be a Topology, got {type(topology).__name__}")
        if not isinstance(model, ModelSpec):
            raise InputError(f"model must be a ModelSpec, got {type(model).__name__}")
        if not isinstance(hardware, Hardware):
            raise InputError(f"hardware must be a Hardware, got {type(hardware).__name__}")
        if micro_batches not in (1, 2):
            raise InputError(f"micro_batches must be 1 or 2, got {micro_batches!r}")
        if topology.num_slots < model.num_experts:
            raise InputError(
                f"{topology.num_slots} slots cannot hold the model's {model.num_experts} experts"
            )
        self.topology, self.model, self.hardware = topology, model, hardware
        self.policy = unit_dispatch(dispatch, topology, model, lp_overhead_s=lp_overhead_s,
                                    duplicate=duplicate)
        self.dispatch = self.policy.name
        self._copy_s: np.ndarray | None = None  # the last plan's copy seconds per layer
        self.shared = check_shared_expert(shared_expert, model)
        self.shared_expert = self.shared.name
        self.micro_batches = micro_batches
        self.rank = RankSide(phase, model, hardware, micro_batches)
        self.gpu = GpuSide(topology, model, hardware)
        self.routing = StepRouting(phase, topology, model, self.policy)
        self.comm = Comm(phase, topology, model, hardware)
        self.assembly = Assembly(phase, model, hardware, micro_batches, self.dispatch)

    # ------------------------------------------------------------------ GPU side + comm
    def _gpu_side(self, batch: RankBatch, placement: Placement | None, load):
        """GPU side and all-to-all of one micro-batch, as it is and with every rank's tokens
        at their mean: ``(moe, recv, links, moe_eq, links_eq)``, expert-GEMM seconds and
        routed picks (both micro-batches) per GPU ``float[L, G]`` and `Comm.links`."""
        m, topo, mb = self.model, self.topology, self.micro_batches
        L, G = m.moe_layers, topo.num_gpus
        src = batch.tokens / mb  # tokens each rank sends per micro-batch
        uniform = bool(np.all(src == src[0]))
        src_eq = src if uniform else np.full(G, src.mean())
        comm = self.comm
        if placement is None:
            if load is not None:
                raise InputError(
                    "load needs a placement to route through; give placement= "
                    "or leave load out for perfectly balanced routing"
                )
            moe, recv = self.gpu.balanced(src.sum())
            v, vn = comm.balanced_visits(L)
            links = comm.links(src, recv, v, vn)
            links_eq = links if uniform else comm.links(src_eq, recv, v, vn)
            return moe, recv * mb, links, moe, links_eq
        self.routing.check_placement(placement)
        slot, recv, v, vn, report = self.routing.routed(placement, load, src)
        if self.policy.copies:  # a step load float[L, E]: `routed` refuses per-source ones
            moe, recv = self._copied(slot, placement, False)
            links = comm.links(src, recv, v, vn)
            if uniform:
                return moe, recv * mb, links, moe, links
            return moe, recv * mb, links, moe, comm.links(src_eq, recv, v, vn)
        moe = self.gpu.seconds(slot)
        links = comm.links(src, recv, v, vn, report)
        if uniform:
            return moe, recv * mb, links, moe, links
        if report is None:
            return moe, recv * mb, links, moe, comm.links(src_eq, recv, v, vn)
        slot_eq, recv_eq, _, _, report_eq = self.routing.routed(placement, load, src_eq)
        moe_eq = self.gpu.seconds(slot_eq)
        return moe, recv * mb, links, moe_eq, comm.links(src_eq, recv_eq, v, vn, report_eq)

    def _gpu_side_routed(self, batch, routed, dist, tabulated: bool, picks: bool):
        """`_gpu_side` on a prepared placement with the step's ``dist: float[L, E]``
        (``picks``: absolute picks of the whole step instead)."""
        m, mb = self.model, self.micro_batches
        src = batch.tokens / mb
        uniform = bool(np.all(src == src[0]))
        scale = (1.0 / mb) if picks else m.top_k * np.add.reduce(src)
        slot = self.routing.slot_picks(routed, dist, scale)
        if self.policy.copies:
            moe, recv = self._copied(slot, routed.placement, tabulated)
        else:
            recv = per_gpu(slot, self.topology.slots_per_gpu)
            moe = self.gpu.seconds_fast(slot, tabulated)
        links = self.comm.links(src, recv, routed.v, routed.vn)
        if uniform:
            return moe, recv * mb, links, moe, links
        links_eq = self.comm.links(np.full(src.size, src.mean()), recv, routed.v, routed.vn)
        return moe, recv * mb, links, moe, links_eq

    def _decode_routed(self, batch, routed, dist, tabulated: bool, picks: bool) -> StepTime:
        """`time_routed` in decode: the rank side from the memoised tables, one strided pass
        over the slots, `Assembly.decode_step`."""
        m, mb = self.model, self.micro_batches
        rank = self.rank.decode_rows(batch)
        src = batch.tokens / mb
        scale = (1.0 / mb) if picks else m.top_k * np.add.reduce(src)
        slot = self.routing.slot_picks(routed, dist, scale)
        if self.policy.copies:
            moe, recv = self._copied(slot, routed.placement, tabulated)
        else:
            recv = per_gpu(slot, self.topology.slots_per_gpu)
            moe = self.gpu.seconds_fast(slot, tabulated)
        wf = None
        if self.shared.pooled:
            wf = self._pooled_shared(batch, recv)[:3]
        return self._charge(
            self.assembly.decode_step(batch, rank, src, recv, moe, self.comm.ll, wf)
        )

    def _copied(self, slot: np.ndarray, placement: Placement, tabulated: bool):
        """Expert-GEMM seconds and routed picks per GPU (``float64[L, G]`` each) of one
        micro-batch's ``slot: float[L, P]`` picks after the policy's per-micro-batch copies
        (`eplb.dispatch.Duplicate.plan_step`; each copy one more grouped-GEMM group on its
        GPU); keeps the copy seconds per layer (``_copy_s``: the busiest GPU's sent or received
        copies over NVLink) for `_charge`."""
        curve = self.gpu.expert_table if tabulated else self.gpu.expert
        p = self.policy.plan_step(slot, placement, curve.seconds)
        moe = self.gpu.seconds_fast(p.slot, tabulated)
        made = p.gpu >= 0
        L, G = moe.shape
        if made.any():
            flat = (np.arange(L)[:, None, None] * G + p.gpu)[made]
            moe += np.bincount(
                flat, weights=curve.seconds(p.picks[made]), minlength=L * G
            ).reshape(L, G)
        self._copy_s = self.policy.copy_seconds(p)
        return moe, p.recv

    def _pooled_shared(self, batch: RankBatch, recv: np.ndarray):
        """A pooled shared expert's (waterfill's) as-is shared work and extra copies for one
        micro-batch's routed picks ``recv: float[L, G]``: ``(sh_act, out, inn, rd_out,
        rd_in)``, shared-expert seconds per GPU (`SharedExpert.split`) and the shipped
        shared-expert tokens (`SharedExpert.shipped`), all ``float64[L, G]``. One shared pick
        per token and shared expert, at the local GEMM's speed."""
        n = self.model.shared_experts
        own = n * batch.tokens / self.micro_batches
        share = self.shared.split(recv, own)
        sh_act = n * self.rank.ffn.seconds(share / n)
        return (sh_act, *self.shared.shipped(share, own, self.topology.num_nodes))

    def _assemble(self, batch: RankBatch, a1, a2, sh, gpu, *, balanced: bool) -> StepTime:
        rank = self.rank
        dense_r = rank.dense(batch, a1, a2)
        head_r = rank.head(batch.logits)
        sh_act = None
        if self.shared.pooled:
            moe, recv, links, moe_eq, links_eq = gpu
            sh_act, *extra = self._pooled_shared(batch, recv / self.micro_batches)
            # decode: one class (every pick); prefill: NVLink, then RDMA
            pairs = [(extra[0], extra[1])] + [(extra[2], extra[3])] * (len(links) - 1)
            links = [
                (out + w_out, inn + w_in, sd, sc)
                for (out, inn, sd, sc), (w_out, w_in) in zip(links, pairs, strict=True)
            ]
            gpu = (moe, recv, links, moe_eq, links_eq)
        st = self.assembly.step(
            batch, a1, a2, sh, *gpu, dense_r, head_r, balanced=balanced, sh_act=sh_act
        )
        return st if balanced else self._charge(st)

    def _charge(self, st: StepTime) -> StepTime:
        """``st`` with what the dispatch policy adds on the critical path
        (`Dispatch.exposed`: ``lp``'s per-layer solve, ``meta["lp_s"]``; duplication's exposed
        planner and copy seconds, ``meta["duplicate_s"]``) in ``overhead``; unchanged when it
        adds nothing."""
        L = self.model.moe_layers
        cost = self.policy.exposed(L, self.micro_batches, st.layer_s, self._copy_s)
        if cost is None:
            return st
        extra, meta = cost
        return _with_overhead(st, extra, L, meta)

    # ------------------------------------------------------------------ public
    def time(self, batch: RankBatch, placement: Placement | None = None, load=None) -> StepTime:
        """Seconds of one step of ``batch`` (`RankBatch` with one entry per GPU) under
        ``placement`` (None: perfectly balanced routing) with the step's expert ``load``
        (``float[L, E]`` picks per expert, or ``float[L, G, E]`` per source rank; only its
        shape matters, it is scaled to ``top_k`` x the batch's tokens)."""
        if not isinstance(batch, RankBatch):
            raise InputError(f"batch must be a RankBatch, got {type(batch).__name__}")
        G = self.topology.num_gpus
        if batch.num_ranks != G:
            raise InputError(
                f"batch has {batch.num_ranks} ranks but the unit has {G} GPUs (one DP rank per GPU)"
            )
        a1, a2, sh = self.rank.stages(batch)
        gpu = self._gpu_side(batch, placement, load)
        return self._assemble(batch, a1, a2, sh, gpu, balanced=placement is None)

    def prepare(self, placement: Placement | None, load=None) -> RoutedPlacement:
        """``placement`` with an expected step load ``float[L, E]`` prepared for many steps
        (`time_routed`): the routing tables, each slot's share of a layer's picks and (prefill)
        the per-GPU / per-node visit probabilities, computed once. ``placement=None``:
        perfectly balanced routing (``load`` must be None). Not for ``local_first`` dispatch or
        per-source loads (use `time`)."""
        if placement is None:
            if load is not None:
                raise InputError(
                    "load needs a placement to route through; give placement= "
                    "or leave load out for perfectly balanced routing"
                )
            return RoutedPlacement(None, None, None, None, None, None)
        return self.routing.prepare(placement, load)

    def time_routed(
        self,
        batch: RankBatch,
        routed: RoutedPlacement,
        load=None,
        *,
        check: bool = True,
        tabulated: bool = False,
        picks: bool = False,
    ) -> StepTime:
        """`time` on a prepared placement (`prepare`): the simulator's hot path.

        ``load``: this step's expert load ``float[L, E]`` (only each row's shape matters; it is
        scaled to ``top_k`` x the batch's tokens); None uses the prepared one, and then the
        result equals ``time(batch, routed.placement, routed.load)``. Expert picks per slot come
        from the step's load; the all-to-all visit probabilities (prefill) from the prepared
        load (an expectation over tokens either way). ``check=False`` skips validating
        ``load`` (the caller guarantees finite counts >= 0 of the right shape).
        ``tabulated``: routed-expert GEMM seconds from `TabulatedCurve` (relative error <
        `TABLE_TOL`, ~4x faster). ``picks``: ``load`` holds the step's absolute expert picks
        (both micro-batches; e.g. drawn counts whose total is ``top_k`` x tokens up to
        sampling noise), used as they are instead of rescaled to ``top_k`` x tokens.
        """
        if check:
            if not isinstance(batch, RankBatch):
                raise InputError(f"batch must be a RankBatch, got {type(batch).__name__}")
            if batch.num_ranks != self.topology.num_gpus:
                raise InputError(
                    f"batch has {batch.num_ranks} ranks but the unit has "
                    f"{self.topology.num_gpus} GPUs (one DP rank per GPU)"
                )
            if not isinstance(routed, RoutedPlacement):
                raise InputError(f"routed must come from prepare(), got {type(routed).__name__}")
        if routed.placement is None:
            if load is not None:
                raise InputError("balanced routing (placement None) takes no load")
            a1, a2, sh = self.rank.stages(batch)
            gpu = self._gpu_side(batch, None, None)
        else:
            m = self.model
            if load is None:
                dist = routed.dist
            elif picks:
                if check:
                    load = check_step_load(
                        load, m.moe_layers, self.topology.num_gpus, m.num_experts
                    )
                dist = load
            else:
                if check:
                    load = check_step_load(
                        load, m.moe_layers, self.topology.num_gpus, m.num_experts
                    )
                    if load.ndim != 2:
                        raise InputError("time_routed takes a load float[L, E]; use time()")
                dist = normalise(load)
            if self.phase == "decode":
                return self._decode_routed(
                    batch, routed, dist, tabulated, picks and load is not None
                )
            a1, a2, sh = self.rank.stages(batch)
            gpu = self._gpu_side_routed(batch, routed, dist, tabulated, picks and load is not None)
        return self._assemble(batch, a1, a2, sh, gpu, balanced=routed.placement is None)


def _with_overhead(st: StepTime, extra: float, layers: int, meta: dict) -> StepTime:
    """``st`` with ``extra`` seconds in ``overhead`` (spread evenly over ``layers``)."""
    breakdown = dict(st.breakdown)
    breakdown["overhead"] += extra
    return StepTime(
        st.phase, st.total_s + extra, breakdown, st.layer_s + extra / layers,
        st.gpu_load_max, st.gpu_load_mean, st.tokens, meta={**st.meta, **meta},
    )


@lru_cache(maxsize=64)
def _model_for(
    phase, topology, model, hardware, dispatch, micro_batches, lp_overhead_s, shared_expert,
    duplicate=None,
):
    return StepModel(
        phase,
        topology,
        model=model,
        hardware=hardware,
        dispatch=dispatch,
        micro_batches=micro_batches,
        lp_overhead_s=lp_overhead_s,
        shared_expert=shared_expert,
        duplicate=duplicate,
    )


def step_time(
    phase: str,
    batch: RankBatch,
    placement: Placement | None = None,
    load=None,
    *,
    config=None,
    topology: Topology | None = None,
    model: ModelSpec | None = None,
    hardware: Hardware | None = None,
    dispatch: str | None = None,
    micro_batches: int | None = None,
    lp_overhead_s: float | None = None,
    shared_expert: str | None = None,
    duplicate: DuplicateConfig | None = None,
) -> StepTime:
    """Seconds of one forward step of a unit, with a breakdown that sums to it.

    ``batch``: `RankBatch` (one entry per DP rank = GPU). ``placement``: the unit's expert
    placement, or None for perfectly balanced routing. ``load``: the step's expert load
    ``float[L, E]`` (or ``float[L, G, E]`` per source rank) routed through ``placement``;
    its shape is used, its total is set by the batch. The unit comes from ``config`` (a
    `ClusterConfig`: model, hardware, the phase's unit, dispatch policy), else from
    ``topology`` (or the placement's) and the keyword presets (DeepSeek-V3 on H800, ``even``
    dispatch, two micro-batches). `StepModel` is the reusable form for many steps.
    """
    check_phase(phase)
    if config is not None:
        unit = config.unit(phase)
        topology = topology or unit.topology()
        model = model or config.model_spec
        hardware = hardware or config.hardware_spec
        dispatch = dispatch or config.dispatch
        micro_batches = micro_batches or unit.micro_batches
        if lp_overhead_s is None:
            lp_overhead_s = config.lp_overhead_s
        shared_expert = shared_expert or config.shared_expert
        duplicate = duplicate or config.duplicate
    if topology is None:
        if placement is None:
            raise InputError(
                "give config=, topology= or a placement: the unit's shape is "
                "needed for balanced routing"
            )
        topology = placement.topology
    return _model_for(
        phase,
        topology,
        model or deepseek_v3,
        hardware or h800,
        dispatch or "even",
        micro_batches or 2,
        LP_OVERHEAD_S if lp_overhead_s is None else lp_overhead_s,
        shared_expert or "local",
        duplicate,
    ).time(batch, placement, load)
