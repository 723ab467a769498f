"""Junk thrown at every public function of the eplb core, traces and evaluation (solvers have
their own): each call gets valid arguments except one, replaced by junk. A value of the wrong
kind for its argument (`KINDS`: a string for a count, a float for an integer, ``None`` where
``None`` means nothing, NaN for a number...) must be refused with an `EplbError`: a call that
accepts it fails the test. A value of the right kind may still be refused (``seed=-1``, a
shape that does not fit); any refusal is an `EplbError`, never a TypeError, IndexError,
OverflowError, AttributeError or a numpy warning turned error.
"""

from __future__ import annotations

import inspect
import math
import os
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eplb import EplbError, Placement, Topology, traces
from eplb import dispatch as routing
from eplb import io as pio
from eplb.evaluation import align, compare, metrics, pareto, plots, replay, tables, traffic
from eplb.executor import MoELayer, ReferenceExecutor, even_token_rank, kernels
from eplb.loads import check_load
from eplb.traces import summary, synth

TOPO = Topology(1, 2, 6)  # 12 slots
E, L = 8, 2
RNG = np.random.default_rng(0)
LOAD = RNG.integers(1, 50, size=(L, E)).astype(float)
PHY = np.array([np.r_[np.arange(E), [0, 1, 2, 3]], np.r_[np.arange(E), [4, 5, 6, 7]]])
PLACEMENT = Placement(PHY, E, TOPO, layer_ids=[3, 4]).validate()
TRACE = traces.Trace(
    RNG.integers(0, 30, size=(3, L, E)).astype(float), [3, 4], meta={"top_k": 2, "num_groups": 2}
)
TOKENS = synth.token_level(
    traces.Trace(TRACE.counts[:1], [3, 4]),
    num_tokens=16,
    num_groups=2,
    topk_groups=2,
    top_k=2,
    iterations=2,
)
LAYER = MoELayer(E, 4, 3, 2, seed=0)
IDS = np.array([[0, 1], [2, 3], [4, 5], [6, 7]])
W = np.full((4, 2), 0.5)
X = np.ones((4, 4), dtype=np.float32)
RANK = np.array([0, 0, 1, 1])
SLOTS = routing.route(IDS, PLACEMENT, token_rank=RANK)
LAYOUT = kernels.dispatch_layout(SLOTS, RANK, TOPO)


def _frame():
    return metrics.score(PLACEMENT, TRACE.load(), bound=False)


JUNK = [
    None,
    True,
    False,
    -1,
    0,
    10**30,
    -(10**30),
    2**63,
    1e308,
    float("nan"),
    float("inf"),
    -0.5,
    "abc",
    "",
    "0",
    1 + 2j,
    [],
    [[]],
    [[1, 2], [3]],
    [[1 + 1j, 2]],
    {"a": 1},
    (1, 2),
    object(),
    b"\x00",
    np.array(["x"]),
    np.zeros((2, 2, 2, 2, 2)),
    np.array([[True, False]]),
    np.array([[np.nan]]),
    np.full((2, 8), -1.0),
    np.full((2, 8), 1e300),
    lambda: 1,
]


def _cases(tmp):
    """``name -> (function, {argument: valid value})``."""
    path = str(tmp / "p.json")
    return {
        # ------------------------------------------------------------------ eplb core
        "Topology": (
            Topology,
            dict(num_nodes=1, gpus_per_node=2, slots_per_gpu=6, nvlink_gbps=160.0, rdma_gbps=50.0),
        ),
        "Topology.parse": (
            Topology.parse,
            dict(text="1x2", slots=12, nvlink_gbps=1.0, rdma_gbps=1.0, min_slots=8),
        ),
        "Topology.from_dict": (Topology.from_dict, dict(data=TOPO.to_dict())),
        "Placement": (
            lambda **kw: Placement(**kw).validate(),
            dict(
                phy2log=PHY,
                num_experts=E,
                topology=TOPO,
                replica_share=None,
                meta={},
                layer_ids=[3, 4],
            ),
        ),
        "Placement.gpu_load": (PLACEMENT.gpu_load, dict(load=LOAD)),
        "Placement.node_load": (PLACEMENT.node_load, dict(load=LOAD)),
        "check_load": (check_load, dict(load=LOAD, name="load", ndim=2)),
        "io.format_for": (pio.format_for, dict(path=path, format="native")),
        "io.write_placement": (
            pio.write_placement,
            dict(
                placement=PLACEMENT,
                path=path,
                format="native",
                num_model_layers=None,
                layer_ids_are_model_ids=False,
            ),
        ),
        "io.read_placement": (
            pio.read_placement,
            dict(path=str(tmp / "ok.json"), format=None, topology=TOPO, num_experts=None),
        ),
        "io.sglang_map": (pio.sglang_map, dict(p=PLACEMENT, num_model_layers=8)),
        "MoELayer": (
            MoELayer,
            dict(
                num_experts=E,
                hidden=4,
                ffn=3,
                top_k=2,
                num_groups=2,
                topk_groups=1,
                seed=0,
                dtype=np.float32,
                scoring="softmax",
            ),
        ),
        "MoELayer.route": (LAYER.route, dict(x=X)),
        "ReferenceExecutor": (
            ReferenceExecutor,
            dict(
                layer=LAYER,
                placement=PLACEMENT,
                policy="even",
                seed=0,
                dispatch_bytes=1,
                combine_bytes=2,
            ),
        ),
        "ReferenceExecutor.forward": (
            lambda **kw: ReferenceExecutor(LAYER, PLACEMENT).forward(**kw),
            dict(x=X, topk_ids=IDS, topk_weights=W, token_rank=RANK, layer_index=0),
        ),
        "even_token_rank": (even_token_rank, dict(num_tokens=4, num_gpus=2)),
        "routing.route": (
            routing.route,
            dict(
                topk_ids=IDS,
                placement=PLACEMENT,
                layer_index=0,
                policy="even",
                token_rank=RANK,
                seed=0,
            ),
        ),
        "routing.dispatch_table": (
            routing.dispatch_table,
            dict(placement=PLACEMENT, layer_index=1),
        ),
        "kernels.dispatch_layout": (
            kernels.dispatch_layout,
            dict(slots=SLOTS, token_rank=RANK, topology=TOPO),
        ),
        "kernels.dispatch": (kernels.dispatch, dict(x=X, layout=LAYOUT)),
        "kernels.combine": (
            kernels.combine,
            dict(expert_out=np.ones((8, 4)), topk_weights=W, layout=LAYOUT),
        ),
        # ------------------------------------------------------------------ traces
        "traces.read": (traces.read, dict(path=str(tmp / "t.npz"), format=None)),
        "traces.write": (traces.write, dict(trace=TRACE, path=str(tmp / "w.npz"), format=None)),
        "Trace": (
            traces.Trace,
            dict(
                counts=TRACE.counts,
                layer_ids=[3, 4],
                source_counts=None,
                topk_ids=None,
                token_rank=None,
                meta={},
            ),
        ),
        "Trace.load": (TRACE.load, dict(windows=[0, 1], ema=0.5)),
        "Trace.select": (TRACE.select, dict(windows=[0], layers=[4])),
        "Trace.to_frame": (TRACE.to_frame, dict(by_rank=False, nonzero=True)),
        "Trace.summary": (TRACE.summary, dict(windows=None, ema=None)),
        "from_frame": (traces.from_frame, dict(df=TRACE.to_frame(), path="f", meta={})),
        "synth.zipf": (
            synth.zipf,
            dict(
                num_layers=2,
                num_experts=8,
                windows=2,
                tokens=16,
                top_k=2,
                skew=(0.5, 1.0),
                seed=0,
                layer_ids=None,
            ),
        ),
        "synth.drift": (
            synth.drift,
            dict(num_layers=2, num_experts=8, windows=2, tokens=16, top_k=2, rate=0.2, seed=0),
        ),
        "synth.bursty": (
            synth.bursty,
            dict(num_layers=2, num_experts=8, windows=2, tokens=16, top_k=2, seed=0),
        ),
        "synth.uniform": (
            synth.uniform,
            dict(num_layers=2, num_experts=8, windows=2, tokens=16, top_k=2, seed=0),
        ),
        "synth.lognormal": (
            synth.lognormal,
            dict(num_layers=2, num_experts=8, windows=2, tokens=16, top_k=2, seed=0),
        ),
        "synth.calibrated": (synth.calibrated, dict(windows=1, tokens=16, seed=0)),
        "synth.cap_shares": (synth.cap_shares, dict(p=np.full((2, 8), 1 / 8), top_k=2)),
        "summary.skew_table": (summary.skew_table, dict(load=LOAD, layer_ids=[3, 4])),
        "summary.top_share": (summary.top_share, dict(load=LOAD, frac=0.1)),
        "summary.group_cv": (summary.group_cv, dict(load=LOAD, num_groups=2)),
        "summary.gini": (summary.gini, dict(load=LOAD)),
        # ------------------------------------------------------------------ evaluation
        "metrics.score": (
            metrics.score,
            dict(placement=PLACEMENT, load=LOAD, num_groups=2, bound=True),
        ),
        "metrics.score_windows": (
            metrics.score_windows,
            dict(placement=PLACEMENT, counts=TRACE.counts, windows=None),
        ),
        "metrics.score_trace": (
            metrics.score_trace,
            dict(placement=PLACEMENT, trace=TRACE, windows=[0, 2]),
        ),
        "metrics.gpu_loads": (metrics.gpu_loads, dict(placement=PLACEMENT, counts=TRACE.counts)),
        "metrics.balancedness": (metrics.balancedness, dict(gpu_load=LOAD)),
        "metrics.summarize": (metrics.summarize, dict(frame=_frame(), by=None)),
        "metrics.layer_bound": (metrics.layer_bound, dict(load=LOAD, topology=TOPO, num_groups=2)),
        "traffic.simulate": (
            traffic.simulate,
            dict(
                placement=PLACEMENT,
                load=LOAD,
                policy="even",
                hidden=16,
                top_k=2,
                num_groups=2,
                topk_groups=1,
                seed=0,
            ),
        ),
        "traffic.simulate_tokens": (
            traffic.simulate,
            dict(
                placement=PLACEMENT,
                topk_ids=TOKENS.topk_ids,
                token_rank=TOKENS.token_rank % 2,
                policy="local_first",
                hidden=16,
                dispatch_bytes=1,
                combine_bytes=2,
            ),
        ),
        "traffic.simulate_trace": (
            traffic.simulate_trace,
            dict(placement=PLACEMENT, trace=TRACE, windows=None, source="auto"),
        ),
        "replay.replay": (
            replay.replay,
            dict(
                trace=TRACE,
                topology=TOPO,
                solver="greedy",
                interval=1,
                history=1,
                ema=None,
                num_groups=2,
                expert_bytes=10.0,
                policy=None,
                seed=0,
            ),
        ),
        "compare.compare": (
            compare.compare,
            dict(
                traces={"t": TRACE},
                solvers=["deepseek"],
                topologies="1x2:12",
                num_groups=2,
                policy="even",
                holdout=0.0,
                seed=0,
                workers=1,
                progress=False,
            ),
        ),
        "compare.parse_topologies": (compare.parse_topologies, dict(text="1x2:12,1x2+4")),
        "pareto.sweep": (
            pareto.sweep,
            dict(
                load=LOAD,
                topology=TOPO,
                weights=(0.0, 1.0),
                num_groups=2,
                policy="even",
                ilp_time_limit=None,
                seed=0,
            ),
        ),
        "pareto.front": (pareto.front, dict(x=[1.0, 2.0], y=[2.0, 1.0])),
        "align.align": (align.align, dict(placement=PLACEMENT, trace=TRACE)),
        "align.with_layers": (align.with_layers, dict(placement=PLACEMENT, layer_ids=[5, 6])),
        "tables.markdown": (tables.markdown, dict(frame=_frame(), digits=3, index=True)),
        "tables.slug": (tables.slug, dict(text="a b/c")),
        "plots.layer_balance": (
            plots.layer_balance,
            dict(frames={"a": _frame()}, path=str(tmp / "b.png"), title="t"),
        ),
        "plots.gpu_heatmap": (
            plots.gpu_heatmap,
            dict(
                loads={"a": PLACEMENT.gpu_load(LOAD)},
                path=str(tmp / "h.png"),
                layer_ids=[3, 4],
                title="t",
                gpus_per_node=1,
            ),
        ),
    }


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """The baseline calls, run from a scratch working directory: junk strings drawn for
    output paths (``"0"``, ``"abc"``) are relative paths and must not land in the checkout."""
    tmp = tmp_path_factory.mktemp("junk")
    traces.write(TRACE, tmp / "t.npz")
    pio.write_placement(PLACEMENT, tmp / "ok.json")
    cwd = os.getcwd()
    scratch = tmp_path_factory.mktemp("junk-cwd")
    os.chdir(scratch)
    try:
        yield tmp, _cases(tmp)
    finally:
        os.chdir(cwd)


NAMES = list(_cases(__import__("pathlib").Path("/nonexistent")))


def _shape(*shape):
    return lambda r, tmp: isinstance(r, np.ndarray) and r.shape == shape


def _frame_of(rows: int, *columns: str):
    return lambda r, tmp: len(r) == rows and set(columns) <= set(r.columns)


def _trace_of(shape):
    return lambda r, tmp: isinstance(r, traces.Trace) and r.counts.shape == shape


# what each baseline call returns (or writes): one fact per call that breaks if it stops working
EXPECT = {
    "Topology": lambda r, tmp: r == TOPO,
    "Topology.parse": lambda r, tmp: (r.num_nodes, r.gpus_per_node, r.num_slots) == (1, 2, 12),
    "Topology.from_dict": lambda r, tmp: r == TOPO,
    "Placement": lambda r, tmp: r.equals(PLACEMENT),
    "Placement.gpu_load": lambda r, tmp: r.shape == (L, 2) and np.allclose(r.sum(1), LOAD.sum(1)),
    "Placement.node_load": lambda r, tmp: r.shape == (L, 1) and np.allclose(r[:, 0], LOAD.sum(1)),
    "check_load": lambda r, tmp: np.array_equal(r, LOAD),
    "io.format_for": lambda r, tmp: r == "native",
    "io.write_placement": lambda r, tmp: pio.read_placement(tmp / "p.json").equals(PLACEMENT),
    "io.read_placement": lambda r, tmp: r.equals(PLACEMENT),
    "io.sglang_map": _shape(8, TOPO.num_slots),
    "MoELayer": lambda r, tmp: isinstance(r, MoELayer) and r.num_experts == E,
    "MoELayer.route": lambda r, tmp: r[0].shape == (4, 2) and r[1].shape == (4, 2),
    "ReferenceExecutor": lambda r, tmp: isinstance(r, ReferenceExecutor),
    "ReferenceExecutor.forward": lambda r, tmp: r[0].shape == X.shape,
    "even_token_rank": lambda r, tmp: sorted(r.tolist()) == [0, 0, 1, 1],
    "routing.route": lambda r, tmp: r.shape == IDS.shape and np.array_equal(PHY[0][r], IDS),
    "routing.dispatch_table": _shape(TOPO.num_gpus, E),
    "kernels.dispatch_layout": lambda r, tmp: isinstance(r, kernels.DispatchLayout),
    "kernels.dispatch": lambda r, tmp: np.array_equal(r[0], X[LAYOUT.recv_token]),
    "kernels.combine": _shape(*X.shape),
    "traces.read": lambda r, tmp: np.array_equal(r.counts, TRACE.counts),
    "traces.write": lambda r, tmp: np.array_equal(traces.read(tmp / "w.npz").counts, TRACE.counts),
    "Trace": lambda r, tmp: np.array_equal(r.counts, TRACE.counts),
    "Trace.load": _shape(L, E),
    "Trace.select": _trace_of((1, 1, E)),
    "Trace.to_frame": lambda r, tmp: r["count"].sum() == TRACE.counts.sum(),
    "Trace.summary": _frame_of(L, "layer", "tokens"),
    "from_frame": lambda r, tmp: np.array_equal(r.counts, TRACE.counts),
    "synth.zipf": _trace_of((2, 2, 8)),
    "synth.drift": _trace_of((2, 2, 8)),
    "synth.bursty": _trace_of((2, 2, 8)),
    "synth.uniform": _trace_of((2, 2, 8)),
    "synth.lognormal": _trace_of((2, 2, 8)),
    "synth.calibrated": lambda r, tmp: isinstance(r, traces.Trace) and r.counts.shape[0] == 1,
    "synth.cap_shares": lambda r, tmp: r.shape == (2, 8) and np.allclose(r.sum(1), 1),
    "summary.skew_table": _frame_of(L, "layer", "tokens"),
    "summary.top_share": _shape(L),
    "summary.group_cv": _shape(L),
    "summary.gini": _shape(L),
    "metrics.score": _frame_of(L, "layer", "gpu_max", "lower_bound"),
    "metrics.score_windows": _frame_of(3 * L, "window", "layer", "gpu_max"),
    "metrics.score_trace": _frame_of(2 * L, "window", "layer", "gpu_max"),
    "metrics.gpu_loads": _shape(3, L, 2),
    "metrics.balancedness": _shape(L),
    "metrics.summarize": lambda r, tmp: len(r) > 0,
    "metrics.layer_bound": _shape(L),
    "traffic.simulate": lambda r, tmp: isinstance(r, traffic.TrafficReport),
    "traffic.simulate_tokens": lambda r, tmp: isinstance(r, traffic.TrafficReport),
    "traffic.simulate_trace": lambda r, tmp: isinstance(r, traffic.TrafficReport),
    "replay.replay": _frame_of(3, "window", "rebalanced"),
    "compare.compare": lambda r, tmp: isinstance(r, compare.CompareResult),
    "compare.parse_topologies": lambda r, tmp: [t.text for t in r] == ["1x2:12", "1x2+4"],
    "pareto.sweep": lambda r, tmp: len(r) > 0 and "rdma_weight" in r.columns,
    "pareto.front": _shape(2),
    "align.align": lambda r, tmp: r.layer_ids.tolist() == [3, 4],
    "align.with_layers": lambda r, tmp: r.layer_ids.tolist() == [5, 6],
    "tables.markdown": lambda r, tmp: isinstance(r, str) and r.startswith("|"),
    "tables.slug": lambda r, tmp: isinstance(r, str) and r and "/" not in r and " " not in r,
    "plots.layer_balance": lambda r, tmp: (tmp / "b.png").stat().st_size > 0,
    "plots.gpu_heatmap": lambda r, tmp: (tmp / "h.png").stat().st_size > 0,
}


def test_every_case_has_an_expectation():
    assert set(EXPECT) == set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_valid_call_works(cases, name):
    """The baseline arguments are valid (junk, not the baseline, is what fails below) and the
    call does what it names (`EXPECT`)."""
    tmp, calls = cases
    fn, kwargs = calls[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # matplotlib: glyphs missing from fonts
        result = fn(**kwargs)
    assert EXPECT[name](result, tmp), f"{name} returned {result!r}"


# the kind of value each argument takes, where the baseline value does not say it (`_kind`)
ARRAY, REAL, INT, STR, BOOL, MAPPING, ANY = "array", "real", "int", "str", "bool", "mapping", "any"
KINDS = {
    "format": STR, "ema": REAL, "windows": ANY, "layers": ANY, "by": ANY, "layer_ids": ARRAY,
    "num_model_layers": INT, "num_experts": INT, "source_counts": ARRAY, "topk_ids": ARRAY,
    "token_rank": ARRAY, "replica_share": ARRAY, "policy": STR, "topology": Topology,
    "dtype": ANY, "skew": ANY, "title": STR, "meta": MAPPING, "frames": MAPPING,
    "loads": MAPPING, "path": ANY, "text": STR, "name": STR, "scoring": STR, "ilp_time_limit": REAL,
    "weights": ANY, "hidden": REAL, "bound": ANY, "dispatch_bytes": REAL, "combine_bytes": REAL,
    "expert_bytes": REAL, "frac": REAL, "rate": REAL, "min_slots": INT, "traces": ANY,
    "solvers": ANY, "topologies": ANY, "data": MAPPING
}


# the function whose signature a wrapped case calls (`_cases` wraps these in lambdas)
SIGNATURE_OF = {"Placement": Placement, "ReferenceExecutor.forward": ReferenceExecutor.forward,
                "compare.compare": compare.CompareSpec}
# None is valid for these though their defaults are not None (history=None: all windows)
OPTIONAL = {"history"}


def _kind(name: str, fn, arg: str, base) -> tuple[object, bool]:
    """``(kind, optional)`` of argument ``arg`` of case ``name`` whose valid value is ``base``:
    optional when ``None`` is a valid value (the baseline or the signature's default)."""
    try:
        default = inspect.signature(SIGNATURE_OF.get(name, fn)).parameters[arg].default
    except (KeyError, TypeError, ValueError):
        default = inspect.Parameter.empty
    optional = base is None or default is None or arg in OPTIONAL
    if arg in KINDS:
        return KINDS[arg], optional
    if isinstance(base, (bool, np.bool_)):
        return BOOL, optional
    if isinstance(base, (int, np.integer)):
        return INT, optional
    if isinstance(base, (float, np.floating)):
        return REAL, optional
    if isinstance(base, str):
        return STR, optional
    if isinstance(base, (np.ndarray, list)):
        return ARRAY, optional
    if isinstance(base, dict):
        return MAPPING, optional
    if isinstance(base, (Placement, Topology, traces.Trace, MoELayer, kernels.DispatchLayout)):
        return type(base), optional
    return ANY, optional


def _numeric_array(value) -> bool:
    if isinstance(value, (str, bytes, dict)) or callable(value) or value is None:
        return False
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError, OverflowError):
        return False
    return arr.dtype.kind in "iuf" and arr.ndim >= 1


def is_junk(value, kind, optional: bool) -> bool:
    """``value`` is not of ``kind`` (so every call must refuse it)."""
    if value is None:
        return not optional and kind not in (ANY, MAPPING)
    if kind is ANY:
        return False
    if kind is BOOL:
        return not isinstance(value, (bool, np.bool_))
    if kind is INT:
        return isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer))
    if kind is REAL:
        return (isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float))
                or not math.isfinite(value))
    if kind is STR:
        return not isinstance(value, str)
    if kind is ARRAY:
        return not _numeric_array(value)
    if kind is MAPPING:  # None is {} (eplb.args.check_mapping)
        return not isinstance(value, dict)
    return not isinstance(value, kind)


@pytest.mark.parametrize("name", NAMES)
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_junk_raises_eplb_error(cases, name, data):
    fn, kwargs = cases[1][name]
    arg = data.draw(st.sampled_from(sorted(kwargs)), label="argument")
    junk = data.draw(
        st.one_of(
            st.sampled_from(JUNK),
            st.integers(-3, 40),
            st.floats(),
            st.text(max_size=4),
            st.lists(st.floats(), max_size=3),
        ),
        label="junk",
    )
    call = {**kwargs, arg: junk}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # matplotlib: glyphs missing from fonts
        warnings.simplefilter("error", RuntimeWarning)  # a warning is never the only sign
        try:
            fn(**call)
        except EplbError:
            return
        except (Exception, RecursionError) as exc:
            raise AssertionError(
                f"{name}({arg}={junk!r}) raised {type(exc).__name__}: {exc}"
            ) from exc
    kind, optional = _kind(name, fn, arg, kwargs[arg])
    assert not is_junk(junk, kind, optional), f"{name}({arg}={junk!r}): junk was accepted"


def test_the_kind_oracle_calls_wrong_kinds_junk():
    """What `test_junk_raises_eplb_error` demands be refused: a value of another kind."""
    assert is_junk("3", INT, False) and is_junk(2.0, INT, False) and is_junk(True, INT, False)
    assert is_junk(None, INT, False) and not is_junk(None, INT, True)
    assert is_junk(float("nan"), REAL, False) and is_junk("1e1", REAL, False)
    assert is_junk(True, ARRAY, False) and is_junk("abc", ARRAY, False)
    assert not is_junk(-1, INT, False) and not is_junk([1.0, 2.0], ARRAY, False)
    assert is_junk(TOPO, Placement, False) and not is_junk(PLACEMENT, Placement, False)


def test_wrong_kinds_are_refused_where_the_call_does_not_use_them(tmp_path):
    """Issue 32: junk the junk test found accepted (a bandwidth given as True or a string, a
    flag given None for a format that ignores it, token_rank=True for a policy without it)."""
    with pytest.raises(EplbError, match="nvlink_gbps"):
        Topology.parse("1x2", 12, nvlink_gbps=True)
    with pytest.raises(EplbError, match="rdma_gbps"):
        Topology(1, 2, 6, rdma_gbps="50")
    with pytest.raises(EplbError, match="layer_ids_are_model_ids"):
        pio.write_placement(PLACEMENT, tmp_path / "p.json", layer_ids_are_model_ids=None)
    with pytest.raises(EplbError, match="token_rank"):
        routing.route(IDS, PLACEMENT, policy="even", token_rank=True)


def test_named_api_errors(tmp_path):
    """The calls the issue lists raise EplbError subclasses that name the argument."""
    checks = [
        (lambda: traces.read(None), "path"),
        (lambda: metrics.score(None, LOAD), "placement"),
        (lambda: pio.write_placement("x", tmp_path / "x.json"), "placement"),
        (lambda: metrics.score(PLACEMENT, LOAD, num_groups=0), "num_groups"),
        (lambda: traffic.simulate(PLACEMENT, load=LOAD, top_k=99), "top_k"),
        (lambda: traffic.simulate(PLACEMENT, load=LOAD, top_k=8), "top_k"),
    ]
    for call, name in checks:
        with pytest.raises(EplbError, match=name):
            call()
