"""`Dispatch`: one dispatch policy, everything about it in one object; the registries of them
(`DISPATCH` for the routed experts, `SHARED_EXPERT` for the shared expert's, in `shared`) and
the checked entry points `get`, `check_policy`, `route`.

A dispatch policy knows
- its **token split**: `route`, the replica slot of each (token, k) pick, as a runtime would
  choose it from the placement tables (the executor and the traffic model's token mode);
- its **expected shares** in counts mode: `shares` (each slot's share of its expert's picks
  when every source routes alike), `routing` (those shares as the fast path's tables),
  `slot_picks` (expected picks per slot from picks per source) and `expected_visits` (per
  source: the traffic model's counts mode);
- its **critical-path cost**: `exposed`, the seconds it adds to a step (a per-batch solve,
  copies of expert weights);
- its **memory**: `reserved_bytes`, spare HBM per GPU it takes from the KV cache.

Policies with settings (``lp``'s solve seconds, ``duplicate``'s copies) are frozen dataclasses;
the registered entry carries the defaults and `configure` gives a copy with a unit's settings.
Rules: docs/core.md, "Dispatch policies".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from functools import lru_cache
from typing import Any, ClassVar

import numpy as np

from eplb.args import as_int_array, check_seed
from eplb.dispatch import expect
from eplb.dispatch.tables import layer_row
from eplb.errors import InputError
from eplb.placement import Placement
from eplb.registry import Registry

__all__ = ["DISPATCH", "Dispatch", "check_policy", "get", "route"]


@dataclass(frozen=True)
class Dispatch:
    """A dispatch policy: which replica slot serves each pick of a logical expert.

    Capabilities (class attributes): ``needs_rank`` (`route` needs the source GPU of every
    token), ``per_pick`` (a rule per pick that the executor and the traffic model run; False
    for ``duplicate``, which re-splits each micro-batch in the step-time model), ``alike``
    (every source splits an expert's picks in the same proportions, so `shares` exists; False
    for ``local_first``, a fixed table per source), ``per_batch`` (each batch is split anew:
    the shares depend on the load), ``copies`` (copies expert weights per micro-batch:
    `Duplicate.plan_step`), ``placement_split`` (picks split as the balance metrics assume,
    by the placement's ``share``: balance needs no re-scoring under it).
    """

    name: ClassVar[str] = ""
    needs_rank: ClassVar[bool] = False
    per_pick: ClassVar[bool] = True
    alike: ClassVar[bool] = True
    per_batch: ClassVar[bool] = False
    copies: ClassVar[bool] = False
    placement_split: ClassVar[bool] = False

    # ------------------------------------------------------------------ token split
    def route(self, ids: np.ndarray, placement: Placement, layer: int, rank: np.ndarray | None,
              seed: int) -> np.ndarray:
        """``int64[N, K]`` slots of the picks ``ids: int64[N, K]`` of placement row ``layer``;
        ``rank: int64[N]`` the source GPU of each token (None unless ``needs_rank``). Checked
        arguments (`route` checks them)."""
        raise NotImplementedError

    # -------------------------------------------------------------- expected shares
    def shares(self, placement: Placement, load: np.ndarray | None = None) -> np.ndarray:
        """``float64[L, P]``: the share of its expert's picks each slot receives when every
        source routes alike (``load: float[L, E]``, picks per expert, matters only for a
        ``per_batch`` policy)."""
        raise InputError(
            f"dispatch {self.name!r} routes per source rank: its split has no shares that "
            "every source follows; give per-source picks"
        )

    def batch_shares(self, placement: Placement) -> Callable[[np.ndarray], np.ndarray] | None:
        """For a ``per_batch`` policy, ``load: float[L, E] -> shares: float64[L, P]`` of
        ``placement`` (prepared once, called per step); None for a fixed split."""
        return None

    def routing(self, placement: Placement, num_groups: int, topk_groups: int,
                load: np.ndarray | None = None) -> expect.SlotRouting:
        """`shares` as the fast path's `expect.SlotRouting` tables (cached per placement for a
        fixed split), with ``num_groups`` expert groups of which a token selects
        ``topk_groups``."""
        return _routing(placement, self, num_groups, topk_groups)

    def slot_picks(self, placement: Placement, source_counts: np.ndarray, *, num_groups: int,
                   topk_groups: int) -> np.ndarray:
        """``float64[L, P]``: expected picks each slot serves, from picks per source GPU
        ``source_counts: float[L, G, E]`` (``G`` the placement's GPUs)."""
        total = source_counts.sum(1)  # [L, E]
        rt = self.routing(placement, num_groups, topk_groups)
        return np.take_along_axis(total, rt.expert, 1) * rt.share

    def expected_visits(self, placement: Placement, src: np.ndarray, r: np.ndarray,
                        q: np.ndarray, gid: np.ndarray, tick: Callable | None = None):
        """Counts mode per source (the traffic model's): ``gpu_tokens: float64[L, G]`` expected
        picks per GPU, and the log probabilities that a token from ``s`` leaves GPU ``g``
        (``float64[L, G, G]``) and node ``n`` (``float64[L, G, N]``) without a pick, from
        expected picks ``src: float[L, G, E]`` and the group model (`expect.group_probs`:
        ``r``, ``q``, ``gid``). ``tick(n)``, if given, is called as layers finish."""
        topo = placement.topology
        L, G, _ = src.shape
        N, S = topo.num_nodes, topo.slots_per_gpu
        phy2log = placement.phy2log
        base = expect.source_keys(L, G, q.shape[2])
        with np.errstate(divide="ignore"):
            share = self.shares(placement)  # [L, P]
            total = src.sum(1)  # [L, E]
            gpu_tokens = (np.take_along_axis(total, phy2log, 1) * share).reshape(L, G, S).sum(-1)
            r_slot = np.take_along_axis(r, np.broadcast_to(phy2log[:, None, :], (L, G, G * S)), 2)
            grp = base + gid[phy2log][:, None, :]  # [L, G, P]
            wg = expect.merged_share(phy2log, share, S)  # [L, P]
            wn = expect.merged_share(phy2log, share, S * topo.gpus_per_node)
            miss_g = expect.log_miss(np.log1p(-np.minimum(r_slot * wg[:, None, :], 1.0)),
                                     grp * G + topo.gpu_of_slot[None, None, :], q, G)
            miss_n = expect.log_miss(np.log1p(-np.minimum(r_slot * wn[:, None, :], 1.0)),
                                     grp * N + topo.node_of_slot[None, None, :], q, N)
        return gpu_tokens, miss_g, miss_n

    # ------------------------------------------------------------ critical-path cost
    def exposed(self, layers: int, micro_batches: int, layer_s: np.ndarray,
                copy_s: np.ndarray | None = None) -> tuple[float, dict[str, Any]] | None:
        """Seconds the policy adds on a step's critical path and their meta, or None (it adds
        nothing): ``layers`` MoE layers of ``micro_batches`` micro-batches whose layers took
        ``layer_s: float[L]``; ``copy_s: float[L]`` the last plan's copy seconds per layer
        (``copies`` policies)."""
        return None

    # ------------------------------------------------------------------------ memory
    def reserved_bytes(self) -> float:
        """Spare HBM per GPU (bytes) the policy reserves from the KV cache."""
        return 0.0

    # ---------------------------------------------------------------------- settings
    def configure(self, **settings: Any) -> Dispatch:
        """This policy with a unit's ``settings`` (each policy takes the ones it has: ``lp``
        ``solve_s``; ``duplicate`` ``experts``, ``cap``, ``planner_s``, ``copy_s``,
        ``prefetch``, ``hbm_gb``; the rest are ignored). Settings are taken as given: the
        serving config checks them. A name no policy has is an `InputError`."""
        known = {f.name for name in DISPATCH for f in fields(DISPATCH[name]) if f.init}
        bad = sorted(set(settings) - known)
        if bad:
            raise InputError(f"unknown dispatch setting(s) {', '.join(bad)}; the policies take "
                             f"{', '.join(sorted(known))}")
        own = {f.name for f in fields(self) if f.init}
        if not own:
            return self
        return replace(self, **{k: v for k, v in settings.items() if k in own})


@lru_cache(maxsize=32)
def _routing(placement: Placement, dispatch: Dispatch, num_groups: int,
             topk_groups: int) -> expect.SlotRouting:
    return expect.slot_routing(placement, dispatch.shares(placement), num_groups, topk_groups)


DISPATCH: Registry[Dispatch] = Registry("dispatch policy")


def get(name: str) -> Dispatch:
    """The registered `Dispatch` called ``name`` (its default settings), else `InputError`."""
    return DISPATCH.get(name)


def check_policy(policy: str) -> Dispatch:
    """The registered per-pick `Dispatch` called ``policy`` (one the executor and the traffic
    model run), else one `InputError` naming the ones they take."""
    names = sorted(n for n in DISPATCH if DISPATCH[n].per_pick)
    if not isinstance(policy, str) or policy not in DISPATCH:
        raise InputError(f"unknown dispatch policy {policy!r}; available: {', '.join(names)}")
    spec = DISPATCH[policy]
    if not spec.per_pick:
        raise InputError(
            f"dispatch policy {policy!r} splits each micro-batch in the step-time model, not "
            f"pick by pick; the executor and the traffic model take {', '.join(names)}"
        )
    return spec


def route(
    topk_ids: np.ndarray,
    placement: Placement,
    *,
    layer_index: int = 0,
    policy: str = "even",
    token_rank: np.ndarray | None = None,
    seed: int = 0,
) -> np.ndarray:
    """Map logical picks ``topk_ids: int[N, K]`` to replica slots ``int64[N, K]`` under the
    per-pick ``policy``. ``token_rank: int[N]`` (source GPU of each token) is required by
    ``local_first`` and ``lp``."""
    spec = check_policy(policy)
    layer = layer_row(placement, layer_index)
    seed = check_seed("seed", seed)
    ids = as_int_array("topk_ids", topk_ids, ndim=2)
    E = placement.num_experts
    if ids.size and (ids.min() < 0 or ids.max() >= E):
        raise InputError(f"topk_ids must be expert ids in 0..{E - 1}")
    ids = ids.astype(np.int64, copy=False)
    rank = None
    if spec.needs_rank and token_rank is None:
        raise InputError(f"the {policy} policy needs token_rank (source GPU of each token)")
    if token_rank is not None:  # checked also where the policy does not use it
        rank = as_int_array("token_rank", token_rank)
        G = placement.topology.num_gpus
        if rank.shape != (len(ids),):
            raise InputError(f"token_rank must be int[{len(ids)}], got shape {rank.shape}")
        if rank.size and (rank.min() < 0 or rank.max() >= G):
            raise InputError(f"token_rank must be GPU ids in 0..{G - 1}")
        rank = rank.astype(np.int64) if spec.needs_rank else None
    return spec.route(ids, placement, layer, rank, seed)
