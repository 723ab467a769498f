"""Expert-parallel MoE kernels in numpy: route, dispatch layout, dispatch, expert compute, combine.

One layer on ``G`` simulated ranks, following DeepEP's internode kernels: one copy per distinct
destination GPU, one RDMA copy per (token, remote node) to the rail peer, then NVLink forwards;
combine is the reverse. Buffers are flat arrays with CSR-style offsets. See docs/core.md,
section "Kernels: the data path".
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import scipy.sparse as sp
from numpy.typing import ArrayLike, DTypeLike

from eplb.args import as_float_array, as_int_array
from eplb.dispatch import route
from eplb.errors import InputError
from eplb.executor.model import swiglu
from eplb.topology import Topology

__all__ = [
    "Buffer",
    "HOP_LOCAL",
    "HOP_NVLINK",
    "HOP_RDMA",
    "HOP_RDMA_NVLINK",
    "DispatchLayout",
    "combine",
    "dispatch",
    "dispatch_layout",
    "expert_compute",
    "route",
]

HOP_LOCAL = 0  # destination is the source GPU: no link
HOP_NVLINK = 1  # same node: one NVLink copy from the source
HOP_RDMA = 2  # remote node, destination is the rail peer: one RDMA copy
HOP_RDMA_NVLINK = 3  # remote node, other GPU: RDMA to the rail peer, then NVLink forward


def _ro(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


@dataclass(frozen=True, eq=False)
class DispatchLayout:
    """Where every token goes for one layer (all arrays read-only; ``N`` tokens, top-``K``).

    Input: ``topology``; ``slots: int64[N, K]`` the slot serving each pick; ``token_rank:
    int64[N]`` the source GPU of each token.

    Counts (as DeepEP's ``get_dispatch_layout``):

    - ``is_token_in_rank: bool[N, G]``, ``num_tokens_per_rank: int64[G]`` distinct tokens each
      GPU receives (its own included); ``is_token_in_node: bool[N, Nn]``,
      ``num_tokens_per_node: int64[Nn]``; ``num_picks_per_slot: int64[P]`` (token, k) picks.

    Receive buffers, one row per (token, destination GPU) pair, ``M`` rows sorted stably by
    destination (then token): ``recv_token, recv_gpu: int64[M]``, ``rank_offsets: int64[G + 1]``,
    ``recv_hop: int8[M]`` (``HOP_*``), ``recv_rdma_row: int64[M]`` (RDMA row the pair's copy
    came through, ``-1`` for ``LOCAL``/``NVLINK``).

    RDMA transfers, one per (token, remote node) (per-node dedup), ``R`` rows sorted stably by
    destination node: ``rdma_token, rdma_node, rdma_gpu (the rail peer): int64[R]``,
    ``node_offsets: int64[Nn + 1]``.

    Picks: ``pick_row: int64[N, K]`` receive row serving pick ``(n, k)``; ``pick_order: int64[N*K]``
    flat picks ``n * K + k`` sorted stably by slot; ``slot_offsets: int64[P + 1]`` the segment
    of each slot in ``pick_order`` (the grouped expert-compute order).
    """

    topology: Topology
    slots: np.ndarray
    token_rank: np.ndarray
    is_token_in_rank: np.ndarray
    is_token_in_node: np.ndarray
    num_tokens_per_rank: np.ndarray
    num_tokens_per_node: np.ndarray
    num_picks_per_slot: np.ndarray
    recv_token: np.ndarray
    recv_gpu: np.ndarray
    rank_offsets: np.ndarray
    recv_hop: np.ndarray
    recv_rdma_row: np.ndarray
    rdma_token: np.ndarray
    rdma_node: np.ndarray
    rdma_gpu: np.ndarray
    node_offsets: np.ndarray
    pick_row: np.ndarray
    pick_order: np.ndarray
    slot_offsets: np.ndarray

    @property
    def num_tokens(self) -> int:
        return self.slots.shape[0]

    @property
    def top_k(self) -> int:
        return self.slots.shape[1]

    @property
    def num_recv(self) -> int:
        """M, rows over all receive buffers."""
        return self.recv_token.shape[0]

    @property
    def num_rdma(self) -> int:
        """R, RDMA transfers per direction."""
        return self.rdma_token.shape[0]

    @cached_property
    def num_nvlink(self) -> int:
        """NVLink transfers per direction (direct same-node copies plus rail-peer forwards)."""
        hop = self.recv_hop
        return int(np.count_nonzero((hop == HOP_NVLINK) | (hop == HOP_RDMA_NVLINK)))

    @cached_property
    def nvlink_sender(self) -> np.ndarray:
        """int64[M]: GPU sending each receive row over NVLink in dispatch (``-1``: none)."""
        hop = self.recv_hop
        out = np.full(self.num_recv, -1, dtype=np.int64)
        direct = hop == HOP_NVLINK
        out[direct] = self.token_rank[self.recv_token[direct]]
        fwd = hop == HOP_RDMA_NVLINK
        out[fwd] = self.rdma_gpu[self.recv_rdma_row[fwd]]
        return _ro(out)

    @cached_property
    def source_row(self) -> np.ndarray:
        """int64[M]: row of ``concat(x, rdma_buffer)`` each receive row is copied from."""
        direct = self.recv_hop <= HOP_NVLINK
        out = np.where(direct, self.recv_token, self.num_tokens + self.recv_rdma_row)
        return _ro(out)

    # --------------------------------------------- combine reduction matrices
    @cached_property
    def _pick_to_recv(self) -> tuple[np.ndarray, np.ndarray, int]:
        """CSR pattern ``(indptr, indices, N*K)`` of [M, N*K]: receive row <- the expert-output
        rows (in ``pick_order``) of its picks."""
        Q = self.pick_order.shape[0]
        rows = self.pick_row.reshape(-1)[self.pick_order]
        order = np.argsort(rows, kind="stable")  # CSR: row-major, columns ascending
        indptr = np.zeros(self.num_recv + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=self.num_recv), out=indptr[1:])
        return indptr, order.astype(np.int64), Q

    @cached_property
    def _pick_weight_index(self) -> np.ndarray:
        """int64[N*K]: flat ``(n * K + k)`` weight index of each nonzero of `_pick_to_recv`."""
        return _ro(self.pick_order[self._pick_to_recv[1]])

    @cached_property
    def _recv_to_rdma(self) -> sp.csr_matrix:
        """0/1 [R, M]: RDMA row (at the rail peer) <- partial sums of the pairs it serves."""
        remote = np.flatnonzero(self.recv_hop >= HOP_RDMA)
        return _selector(self.recv_rdma_row[remote], remote, self.num_rdma, self.num_recv)

    @cached_property
    def _to_token(self) -> sp.csr_matrix:
        """0/1 [N, M + R]: source token <- partial sums of its local and same-node pairs
        (columns ``0..M-1``) and the RDMA rows coming back from remote nodes (columns
        ``M..M+R-1``): the last combine stage as one product over ``[partial | rdma]``."""
        M, R = self.num_recv, self.num_rdma
        near = np.flatnonzero(self.recv_hop <= HOP_NVLINK)
        rows = np.concatenate([self.recv_token[near], self.rdma_token])
        cols = np.concatenate([near, M + np.arange(R)])
        return _selector(rows, cols, self.num_tokens, M + R)

    @cached_property
    def combine_plan(self) -> tuple[_Plan, _Mixed, _Mixed, int]:
        """Combine plans ``(to_multi, to_rdma, to_token, Z)``.

        A receive row serving one pick (most of them) has the weighted expert output row as
        its partial sum: it is read where it lies in ``expert_out`` instead of being copied
        into a buffer first. Receive rows serving several picks get a partial-sum row in
        ``sums[:Z]`` (``to_multi``); ``to_rdma`` sums each RDMA row's remote partials into
        ``sums[Z:]``; ``to_token`` sums each token's local and same-node partials and its RDMA
        rows into the output.
        """
        indptr, indices, Q = self._pick_to_recv
        M, R = self.num_recv, self.num_rdma
        counts = np.diff(indptr)
        single = counts == 1
        multi = np.flatnonzero(~single)
        Z = multi.size
        zrow = np.full(M, -1, dtype=np.int64)
        zrow[multi] = np.arange(Z)
        # stage 1, multi-pick rows only: CSR of their picks (data positions kept)
        pos = np.flatnonzero(np.repeat(~single, counts))  # CSR nonzeros of those rows
        sub_indptr = np.zeros(Z + 1, dtype=np.int64)
        np.cumsum(counts[multi], out=sub_indptr[1:])
        to_multi = _Plan.of(sub_indptr, indices[pos].astype(np.int64), (Z, Q), pos)

        def entries(csr_rows, csr_cols, shape):
            """Entries of a reduction over receive rows (and RDMA rows, columns >= M)."""
            recv = csr_cols < M
            r = np.where(recv, csr_cols, 0)
            is_y = recv & single[r]
            src = np.where(is_y, 0, 1)
            col = np.where(is_y, indices[indptr[r]], np.where(recv, zrow[r], Z + csr_cols - M))
            wpos = np.where(is_y, indptr[r], -1)
            return _Mixed.of(csr_rows, src, col, wpos, shape[0])

        rd = self._recv_to_rdma
        to_rdma = entries(np.repeat(np.arange(R), np.diff(rd.indptr)), rd.indices.astype(np.int64),
                          rd.shape)
        tt = self._to_token
        to_token = entries(np.repeat(np.arange(self.num_tokens), np.diff(tt.indptr)),
                           tt.indices.astype(np.int64), tt.shape)
        return to_multi, to_rdma, to_token, Z



class Buffer:
    """Reusable receive and reduction buffers for the kernels (the role of DeepEP's ``Buffer``).

    Fresh arrays of hundreds of MB cost a page fault per 4 KiB page on first touch; a `Buffer`
    passed to `dispatch`, `expert_compute` and `combine` keeps one allocation per name and
    grows it only when a call needs more. Arrays the kernels return from a buffer are views
    into it: valid until the next call that uses the same buffer. Not thread-safe.
    """

    def __init__(self) -> None:
        self._store: dict[str, np.ndarray] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: DTypeLike) -> np.ndarray:
        """An uninitialised ``dtype[*shape]`` array backed by the allocation ``name``."""
        dtype = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64))
        a = self._store.get(name)
        if a is None or a.dtype != dtype or a.size < n:
            a = self._store[name] = np.empty(max(n, 1), dtype=dtype)
        return a[:n].reshape(shape)

    @property
    def nbytes(self) -> int:
        """Bytes held over all allocations."""
        return sum(a.nbytes for a in self._store.values())


def _empty(buffer: Buffer | None, name: str, shape: tuple[int, ...], dtype) -> np.ndarray:
    """A fresh array, or the ``buffer``'s allocation ``name`` when one is given."""
    return np.empty(shape, dtype=dtype) if buffer is None else buffer.get(name, shape, dtype)


def _selector(rows: np.ndarray, cols: np.ndarray, n_rows: int, n_cols: int) -> sp.csr_matrix:
    data = np.ones(rows.shape[0], dtype=np.float64)
    return sp.csr_matrix((data, (rows, cols)), shape=(n_rows, n_cols))


# scipy's C++ kernel behind ``csr @ dense``; called directly it accumulates into a reused
# buffer instead of a fresh ``np.zeros`` result. It is private API: it is used only after a
# self-check against the public ``@`` on a small product at import, and ``_csr_add`` falls
# back to ``@`` without it (tests run both paths every time).
def _load_csr_matvecs():
    try:
        # lazy: scipy is heavy; start-up avoids it
        from scipy.sparse._sparsetools import csr_matvecs
    except ImportError:  # pragma: no cover - depends on the scipy version
        return None
    a = sp.csr_matrix(np.array([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]]))
    x = np.arange(6, dtype=np.float64).reshape(3, 2)
    out = np.zeros((2, 2))
    try:
        csr_matvecs(2, 3, 2, a.indptr, a.indices, a.data, x.reshape(-1), out.reshape(-1))
    except Exception:  # pragma: no cover - a changed signature: use the public path
        return None
    return csr_matvecs if np.array_equal(out, a @ x) else None


_csr_matvecs = _load_csr_matvecs()


@dataclass(frozen=True)
class _Plan:
    """A CSR row reduction ``out = A @ x`` split for speed: each row's first nonzero is a
    gather (``np.take`` writes the row, no zero-fill pass), the remaining nonzeros are
    accumulated by the CSR kernel. Sums run in the same order as ``A @ x`` (bit-identical to
    it with scipy's kernel; the public fallback adds each row's tail as one rounded sum)."""

    shape: tuple[int, int]
    first_pos: np.ndarray  # int64[m']: position in the CSR data of each row's first nonzero
    first_col: np.ndarray  # int64[m']: its column
    dense: bool  # every row has a nonzero (else ``rows`` lists those that do)
    rows: np.ndarray
    rest_indptr: np.ndarray
    rest_indices: np.ndarray
    rest_pos: np.ndarray  # position in the CSR data of each remaining nonzero

    @classmethod
    def of(cls, indptr: np.ndarray, indices: np.ndarray, shape: tuple[int, int],
           data_pos: np.ndarray | None = None) -> _Plan:
        """Plan of the CSR pattern ``(indptr, indices)``; ``data_pos`` maps its nonzeros to
        positions in the ``data`` array `into` will be given (default: the same order)."""
        counts = np.diff(indptr)
        has = counts > 0
        first_pos = indptr[:-1][has]
        keep = np.ones(indices.shape[0], dtype=bool)
        keep[first_pos] = False
        rest_indptr = np.zeros(shape[0] + 1, dtype=indptr.dtype)
        np.cumsum(np.maximum(counts - 1, 0), out=rest_indptr[1:])
        dp = np.arange(indices.shape[0]) if data_pos is None else np.asarray(data_pos)
        return cls(shape, _ro(dp[first_pos].astype(np.int64)),
                   _ro(indices[first_pos].astype(np.int64)), bool(has.all()),
                   _ro(np.flatnonzero(has)), _ro(rest_indptr),
                   _ro(indices[keep].astype(indptr.dtype)), _ro(dp[keep].astype(np.int64)))

    def into(self, x: np.ndarray, out: np.ndarray, data: np.ndarray | None = None) -> np.ndarray:
        """``out[:] = A @ x`` with ``A``'s values ``data`` (``None``: all ones)."""
        if self.dense:
            np.take(x, self.first_col, axis=0, out=out, mode="clip")
            if data is not None:
                np.multiply(out, data[self.first_pos][:, None], out=out)
        else:
            out.fill(0)
            first = x[self.first_col]
            if data is not None:
                first *= data[self.first_pos][:, None]
            out[self.rows] = first
        if self.rest_pos.size:
            rest = (np.ones(self.rest_pos.size, dtype=x.dtype) if data is None
                    else data[self.rest_pos])
            _csr_add(self.rest_indptr, self.rest_indices, rest, self.shape, x, out)
        return out


@dataclass(frozen=True)
class _Mixed:
    """A row reduction over two sources: weighted rows of ``y`` (``src`` 0, weight
    ``data[wpos]``) and unit rows of ``s`` (``src`` 1). Each output row starts as a gather of
    its first ``y`` entry (zero when it has none), then the other entries are accumulated."""

    m: int
    first_col: np.ndarray  # int64[m]: first y entry's row of y (0 where the row has none)
    first_wpos: np.ndarray  # int64[m]: its weight position (0 where none)
    no_y: np.ndarray  # int64[k]: rows without a y entry
    y_rest: _Plan  # remaining y entries (CSR over y, data positions)
    s_all: _Plan  # every s entry (CSR over s, unit weights)

    @classmethod
    def of(cls, rows, src, col, wpos, m: int) -> _Mixed:
        rows, src, col, wpos = (np.asarray(a, dtype=np.int64) for a in (rows, src, col, wpos))
        ys = np.flatnonzero(src == 0)
        first_rows, first_at = np.unique(rows[ys], return_index=True)
        first = ys[first_at]
        first_col = np.zeros(m, dtype=np.int64)
        first_wpos = np.zeros(m, dtype=np.int64)
        first_col[first_rows] = col[first]
        first_wpos[first_rows] = wpos[first]
        has_y = np.zeros(m, dtype=bool)
        has_y[first_rows] = True
        rest = np.setdiff1d(ys, first, assume_unique=True)
        ss = np.flatnonzero(src == 1)

        def csr(sel):
            indptr = np.zeros(m + 1, dtype=np.int64)
            np.cumsum(np.bincount(rows[sel], minlength=m), out=indptr[1:])
            return indptr, col[sel]

        ri, rc = csr(rest)
        y_rest = _Plan(shape=(m, 0), first_pos=np.zeros(0, np.int64),
                       first_col=np.zeros(0, np.int64), dense=True, rows=np.zeros(0, np.int64),
                       rest_indptr=_ro(ri), rest_indices=_ro(rc), rest_pos=_ro(wpos[rest]))
        si, sc = csr(ss)
        s_all = _Plan(shape=(m, 0), first_pos=np.zeros(0, np.int64),
                      first_col=np.zeros(0, np.int64), dense=True, rows=np.zeros(0, np.int64),
                      rest_indptr=_ro(si), rest_indices=_ro(sc),
                      rest_pos=_ro(np.full(ss.size, -1, dtype=np.int64)))
        return cls(m, _ro(first_col), _ro(first_wpos), _ro(np.flatnonzero(~has_y)), y_rest,
                   s_all)

    def into(self, y: np.ndarray, s: np.ndarray, data: np.ndarray, out: np.ndarray) -> None:
        if self.m == 0:
            return
        if y.shape[0]:
            np.take(y, self.first_col, axis=0, out=out, mode="clip")
            np.multiply(out, data[self.first_wpos][:, None], out=out)
        if self.no_y.size:
            out[self.no_y] = 0
        p = self.y_rest
        if p.rest_pos.size:
            _csr_add(p.rest_indptr, p.rest_indices, data[p.rest_pos], (self.m, y.shape[0]), y, out)
        p = self.s_all
        if p.rest_indices.size:
            ones = np.ones(p.rest_indices.size, dtype=s.dtype)
            _csr_add(p.rest_indptr, p.rest_indices, ones, (self.m, s.shape[0]), s, out)


def _csr_add(indptr, indices, data, shape, x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out += A @ x`` for the CSR arrays of ``A: [m, n]``."""
    m, n = shape
    fast = (
        _csr_matvecs is not None
        and x.flags.c_contiguous and out.flags.c_contiguous
        and data.dtype == x.dtype == out.dtype
        and indptr.dtype == indices.dtype
    )
    if fast:
        _csr_matvecs(m, n, x.shape[1], indptr, indices, data, x.reshape(-1), out.reshape(-1))
    else:
        out += sp.csr_matrix((data, indices, indptr), shape=shape) @ x
    return out


def _segments(keys: np.ndarray, n: int) -> np.ndarray:
    """int64[n + 1] offsets of the runs of sorted ``keys`` (values in ``0..n-1``)."""
    out = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(keys, minlength=n), out=out[1:])
    return out


def _running_index(mask: np.ndarray) -> np.ndarray:
    """Same shape as ``mask``: index of each True entry among the True entries in C order."""
    dt = np.int32 if mask.size < 2**31 else np.int64
    return (np.cumsum(mask.reshape(-1), dtype=dt) - 1).reshape(mask.shape)


def dispatch_layout(slots: ArrayLike, token_rank: ArrayLike, topology: Topology) -> DispatchLayout:
    """Plan the dispatch of one layer.

    ``slots: int[N, K]`` the replica slot serving each pick (from `route`), ``token_rank: int[N]``
    the source GPU of each token. Returns a `DispatchLayout` (see its fields); pure index math,
    no activations touched.
    """
    if not isinstance(topology, Topology):
        raise InputError(f"topology must be a Topology, got {type(topology).__name__}")
    G, gpn, S = topology.num_gpus, topology.gpus_per_node, topology.slots_per_gpu
    Nn, P = topology.num_nodes, topology.num_slots
    slots = as_int_array("slots", slots, ndim=2)
    N, K = slots.shape
    if slots.size and (slots.min() < 0 or slots.max() >= P):
        raise InputError(f"slots must be slot ids in 0..{P - 1} of topology {topology}")
    rank = as_int_array("token_rank", token_rank)
    if rank.shape != (N,):
        raise InputError(f"token_rank must be int[{N}] (source GPU per token), got {rank.shape}")
    if rank.size and (rank.min() < 0 or rank.max() >= G):
        raise InputError(f"token_rank must be GPU ids in 0..{G - 1}")

    tok = np.arange(N, dtype=np.int64)
    pick_gpu = slots // S
    # destination-major membership [G, N]: np.nonzero walks it in send order (gpu, then token)
    in_rank_t = np.zeros((G, N), dtype=bool)
    in_rank_t[pick_gpu, tok[:, None]] = True
    in_node_t = in_rank_t.reshape(Nn, gpn, N).any(1)

    # receive rows: (token, gpu) pairs; row of pair (g, n) = running count of pairs before it
    recv_gpu, recv_token = (a.astype(np.int64) for a in np.nonzero(in_rank_t))
    recv_index = _running_index(in_rank_t)
    src = rank[recv_token]
    src_node, dst_node = src // gpn, recv_gpu // gpn
    rail = dst_node * gpn + src % gpn
    hop = np.where(
        recv_gpu == src,
        HOP_LOCAL,
        np.where(
            src_node == dst_node,
            HOP_NVLINK,
            np.where(recv_gpu == rail, HOP_RDMA, HOP_RDMA_NVLINK),
        ),
    ).astype(np.int8)

    # RDMA rows: (token, remote node) pairs, node-major; one per node however many GPUs there
    remote_t = in_node_t.copy()
    remote_t[rank // gpn, tok] = False
    rdma_node, rdma_token = (a.astype(np.int64) for a in np.nonzero(remote_t))
    rdma_gpu = rdma_node * gpn + rank[rdma_token] % gpn
    recv_rdma_row = np.full(recv_token.shape[0], -1, dtype=np.int64)
    far = hop >= HOP_RDMA
    recv_rdma_row[far] = _running_index(remote_t)[dst_node[far], recv_token[far]]

    pick_row = recv_index[pick_gpu, tok[:, None]].astype(np.int64)
    flat = slots.reshape(-1)
    # stable sort by slot (radix sort on 16-bit keys when the slot ids fit)
    pick_order = np.argsort(flat.astype(np.uint16) if P <= 2**16 else flat, kind="stable")
    per_slot = np.bincount(flat, minlength=P)
    slot_offsets = np.zeros(P + 1, dtype=np.int64)
    np.cumsum(per_slot, out=slot_offsets[1:])

    return DispatchLayout(
        topology=topology,
        slots=_ro(slots.copy()),
        token_rank=_ro(rank.copy()),
        is_token_in_rank=_ro(np.ascontiguousarray(in_rank_t.T)),
        is_token_in_node=_ro(np.ascontiguousarray(in_node_t.T)),
        num_tokens_per_rank=_ro(in_rank_t.sum(1, dtype=np.int64)),
        num_tokens_per_node=_ro(in_node_t.sum(1, dtype=np.int64)),
        num_picks_per_slot=_ro(per_slot.astype(np.int64)),
        recv_token=_ro(recv_token),
        recv_gpu=_ro(recv_gpu),
        rank_offsets=_ro(_segments(recv_gpu, G)),
        recv_hop=_ro(hop),
        recv_rdma_row=_ro(recv_rdma_row),
        rdma_token=_ro(rdma_token),
        rdma_node=_ro(rdma_node),
        rdma_gpu=_ro(rdma_gpu),
        node_offsets=_ro(_segments(rdma_node, Nn)),
        pick_row=_ro(pick_row),
        pick_order=_ro(pick_order.astype(np.int64)),
        slot_offsets=_ro(slot_offsets),
    )


def _check_rows(name: str, a: np.ndarray, rows: int) -> np.ndarray:
    try:
        a = np.asarray(a)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{name} must be float[{rows}, H]: {str(exc).splitlines()[0]}") from None
    if a.ndim != 2 or a.shape[0] != rows or not np.issubdtype(a.dtype, np.floating):
        raise InputError(f"{name} must be float[{rows}, H], got {a.dtype}{a.shape}")
    return a


def _check_layout(layout, buffer) -> None:
    if not isinstance(layout, DispatchLayout):
        raise InputError(f"layout must be a DispatchLayout (from dispatch_layout), got "
                         f"{type(layout).__name__}")
    if buffer is not None and not isinstance(buffer, Buffer):
        raise InputError(f"buffer must be a kernels.Buffer or None, got {type(buffer).__name__}")


def dispatch(
    x: ArrayLike, layout: DispatchLayout, *, buffer: Buffer | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Move activations ``x: float[N, H]`` into the receive buffers of ``layout``.

    Returns ``(recv: float[M, H], rdma: float[R, H])``: ``rdma`` holds the RDMA receive rows
    at the rail peers (one per token and remote node); ``recv`` rows of hop ``LOCAL``/``NVLINK``
    are copies of ``x`` on the source GPU, rows of hop ``RDMA``/``RDMA_NVLINK`` copies of the
    rail peer's RDMA row. An RDMA row is an exact copy of its token's row of ``x``, so every
    receive row is gathered from ``x`` directly (bit-identical, one pass: dispatch moves
    exactly its ``M + R`` rows). Rank ``g``'s buffer is
    ``recv[rank_offsets[g]:rank_offsets[g + 1]]``. With ``buffer`` both are views into it
    (see `Buffer`).
    """
    _check_layout(layout, buffer)
    x = _check_rows("x", x, layout.num_tokens)
    N, H = x.shape
    rdma = _empty(buffer, "dispatch_rdma", (layout.num_rdma, H), x.dtype)
    # indices come from the layout: mode="clip" never clips, it skips np.take's buffered path
    np.take(x, layout.rdma_token, axis=0, out=rdma, mode="clip")
    recv = _empty(buffer, "dispatch_recv", (layout.num_recv, H), x.dtype)
    np.take(x, layout.recv_token, axis=0, out=recv, mode="clip")
    return recv, rdma


def expert_compute(
    recv: ArrayLike,
    layout: DispatchLayout,
    w1: ArrayLike,
    w3: ArrayLike,
    w2: ArrayLike,
    *,
    buffer: Buffer | None = None,
) -> np.ndarray:
    """Run every rank's local experts on its received tokens (grouped GEMM per slot).

    ``recv: float[M, H]`` from `dispatch`; ``w1, w3: float[G, S, H, F]`` and
    ``w2: float[G, S, F, H]`` the weights each rank holds in its ``S`` slots. Returns
    ``out: float[N*K, H]`` in ``layout.pick_order`` (picks sorted by slot): rows
    ``slot_offsets[p]:slot_offsets[p + 1]`` are slot ``p``'s SwiGLU outputs for its picks
    (a view into ``buffer`` when given).
    """
    _check_layout(layout, buffer)
    topo = layout.topology
    P = topo.num_slots
    recv = _check_rows("recv", recv, layout.num_recv)
    w1, w3, w2 = (np.asarray(w) for w in (w1, w3, w2))
    H = recv.shape[1]
    G, S = topo.num_gpus, topo.slots_per_gpu
    if w1.ndim != 4 or w1.shape[:3] != (G, S, H) or w3.shape != w1.shape:
        raise InputError(f"w1, w3 must be [G={G}, S={S}, H={H}, F], got {w1.shape}, {w3.shape}")
    F = w1.shape[3]
    if w2.shape != (G, S, F, H):
        raise InputError(f"w2 must be [G={G}, S={S}, F={F}, H={H}], got {w2.shape}")
    w1, w3, w2 = w1.reshape(P, H, F), w3.reshape(P, H, F), w2.reshape(P, F, H)
    rows = layout.pick_row.reshape(-1)[layout.pick_order]
    out = _empty(buffer, "expert_out", (rows.shape[0], H), np.result_type(recv, w1))
    off = layout.slot_offsets
    for p in np.flatnonzero(layout.num_picks_per_slot):
        a, b = off[p], off[p + 1]
        out[a:b] = swiglu(recv[rows[a:b]], w1[p], w3[p], w2[p])
    return out


def combine(
    expert_out: ArrayLike,
    topk_weights: ArrayLike,
    layout: DispatchLayout,
    *,
    buffer: Buffer | None = None,
) -> np.ndarray:
    """Reduce expert outputs back to their source tokens along the reverse dispatch path.

    ``expert_out: float[N*K, H]`` in ``layout.pick_order`` (as `expert_compute` returns),
    ``topk_weights: float[N, K]``. Returns a new ``out: float[N, H]`` with
    ``out[n] = sum_k topk_weights[n, k] * expert_out[pick (n, k)]``, summed in three stages:
    per receiving rank (its picks of the token; when it received one pick, the weighted
    expert output row is that partial sum and is read where it lies), per rail peer (the
    node's partial sums, one RDMA row per token and node), at the source (local, same-node and
    RDMA contributions). ``buffer`` holds the intermediate partial sums.
    """
    _check_layout(layout, buffer)
    N, K = layout.num_tokens, layout.top_k
    y = _check_rows("expert_out", expert_out, N * K)
    w = as_float_array("topk_weights", topk_weights, y.dtype)
    if w.shape != (N, K):
        raise InputError(f"topk_weights must be float[{N}, {K}], got {w.shape}")
    dt, H = y.dtype, y.shape[1]
    R = layout.num_rdma
    to_multi, to_rdma, to_token, Z = layout.combine_plan
    data = np.take(w.reshape(-1).astype(dt, copy=False), layout._pick_weight_index)
    if N == 0 or H == 0:
        return np.zeros((N, H), dtype=dt)
    # [partial | rdma]: each rank's weighted sum per received token (rows serving several
    # picks; a one-pick row's partial sum is its weighted expert output row, read in place),
    # then one RDMA row per token and remote node at the rail peer
    sums = _empty(buffer, "combine_sums", (Z + R, H), dt)
    to_multi.into(y, sums[:Z], data)
    to_rdma.into(y, sums, data, sums[Z:])
    # at the source: local and same-node partial sums plus the RDMA rows coming back
    out = np.empty((N, H), dtype=dt)
    to_token.into(y, sums, data, out)
    return out
