"""Placement files: native JSON and NPZ (lossless), SGLang, TensorRT-LLM and vLLM exports.

SGLang and TensorRT-LLM exports index rows by *model* layer id and refuse the default ``0..L-1``
unless ``layer_ids_are_model_ids=True``; vLLM's mapping file is keyed by MoE-layer index
(``0..L-1`` in model-layer order), so its rows are the placement's rows sorted by layer id;
the record written is the one vLLM PR #41141's loader reads at revisions A (``63727bfc``) and
B (``8f4722ce``) (`VLLM_LOADED_BY`; revision C reads stats, not a mapping). Writes are atomic;
reads raise `PlacementError` or `InputError` naming the file and field. Formats:
docs/deployment.md, section "Placement file formats".
"""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from eplb.args import check_bool
from eplb.atomic import atomic_write_bytes, atomic_write_text, check_output_path
from eplb.errors import InputError, PlacementError, TopologyError
from eplb.placement import Placement
from eplb.safeload import ZIP_MAGIC, check_regular, json_loads, read_npz, read_text, yaml_load
from eplb.topology import Topology

FORMATS = ("native", "npz", "sglang", "trtllm", "vllm")
VLLM_RECORD = "eplb_initial_mapping"  # vLLM offline EPLB (PR #41141): docs/deployment.md
# the revisions of PR #41141 whose loader (`_load_initial_mapping`) reads that record
VLLM_LOADED_BY = "vLLM PR #41141 revisions A (63727bfc) and B (8f4722ce)"
# meta["source"]["layer_ids"] of a placement whose layer ids are MoE-layer indices (a vLLM
# file read without layer_ids=), not model layer ids: see evaluation.align.moe_rows
MOE_INDEX = "moe_index"
_MAGIC = "eplb.placement"
_VERSION = 1
_META_BLOCKS = ("solver", "source", "metrics")


def _jsonable(obj: Any) -> Any:
    """``obj`` (a placement's meta, perhaps from a third-party policy) as strict JSON values:
    NaN and infinities become None (JSON has no such numbers), sets sorted lists, numpy
    scalars and arrays Python ones; other objects their ``str``."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (set, frozenset)):
        try:
            items = sorted(obj)
        except TypeError:  # mixed kinds
            items = sorted(obj, key=repr)
        return [_jsonable(v) for v in items]
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return float(obj) if np.isfinite(obj) else None
    if obj is None or isinstance(obj, (str, int)):
        return obj
    return str(obj)


def _check_path(path, what: str = "placement file") -> None:
    if path is None or isinstance(path, bool) or not isinstance(path, (str, os.PathLike)):
        raise InputError(f"{what} path must be a file name (str or os.PathLike), got {path!r}")


def format_for(path: str | os.PathLike, format: str | None = None) -> str:
    """The placement format to use for ``path``: explicit ``format`` or its suffix."""
    _check_path(path)
    if format is not None:
        if not isinstance(format, str) or format not in FORMATS:
            raise InputError(
                f"unknown placement format {format!r}; use one of {', '.join(FORMATS)}"
            )
        return format
    suffix = Path(path).suffix.lower()
    if suffix == ".npz":
        return "npz"
    if suffix in (".yaml", ".yml"):
        return "trtllm"
    if suffix == ".json":
        return "native"
    if suffix == ".jsonl":
        return "vllm"
    raise InputError(
        f"cannot tell the placement format of {str(path)!r} from its suffix; "
        f"name it .json/.npz/.yaml/.jsonl or pass format= ({', '.join(FORMATS)})"
    )


# ---------------------------------------------------------------------- write
def _header(p: Placement) -> dict:
    meta = _jsonable(dict(p.meta))
    head = {
        "format": _MAGIC,
        "version": _VERSION,
        "topology": p.topology.to_dict(),
        "num_logical_experts": p.num_experts,
        "num_layers": p.num_layers,
        "num_slots": p.num_slots,
    }
    for block in _META_BLOCKS:
        head[block] = meta.pop(block, None)
    head["meta"] = meta
    return head


def dumps_native(p: Placement) -> str:
    head = _header(p)
    head["layer_ids"] = p.layer_ids.tolist()
    head["phy2log"] = p.phy2log.tolist()
    head["replica_share"] = None if p.replica_share is None else p.replica_share.tolist()
    order = [
        "format",
        "version",
        "topology",
        "num_logical_experts",
        "num_layers",
        "num_slots",
        "layer_ids",
        "solver",
        "source",
        "metrics",
        "meta",
        "phy2log",
        "replica_share",
    ]
    return json.dumps(_jsonable({k: head[k] for k in order}), indent=1, allow_nan=False) + "\n"


def _default_ids(p: Placement) -> bool:
    return bool(np.array_equal(p.layer_ids, np.arange(p.num_layers)))


def check_model_layer_ids(p: Placement, target: str, layer_ids_are_model_ids: bool) -> None:
    """Refuse exporting rows labelled 0..L-1 (the default) unless the caller vouches for them."""
    if not isinstance(layer_ids_are_model_ids, (bool, np.bool_)):
        raise InputError(f"layer_ids_are_model_ids must be True or False, got "
                         f"{layer_ids_are_model_ids!r}")
    if layer_ids_are_model_ids or not _default_ids(p):
        return
    top = p.num_layers - 1
    raise PlacementError(
        f"the placement's layer_ids are the default 0..{top}, but {target} files are indexed by "
        f"model layer id (DeepSeek-V3's MoE layers are 3..60). Solve from the trace "
        f"(solvers.solve(name, trace, ...)) or label the rows (evaluation.align.with_layers("
        f"placement, trace.layer_ids)); if 0..{top} are the model's layer ids, pass "
        f"layer_ids_are_model_ids=True"
    )


def _check_num_model_layers(num_model_layers) -> None:
    if num_model_layers is None:
        return
    if isinstance(num_model_layers, bool) or not isinstance(num_model_layers,
                                                            (int, np.integer)):
        raise InputError(f"num_model_layers must be an integer, got {num_model_layers!r}")
    if not 1 <= num_model_layers <= 100_000:
        raise InputError(f"num_model_layers must be in 1..100000, got {num_model_layers}")


def sglang_map(p: Placement, num_model_layers: int | None = None) -> np.ndarray:
    """int64[num_model_layers, P]: SGLang's ``physical_to_logical_map`` for every model layer."""
    if not isinstance(p, Placement):
        raise InputError(f"placement must be an eplb.Placement, got {type(p).__name__}")
    _check_num_model_layers(num_model_layers)
    if p.layer_ids.min() < 0:
        raise InputError("layer ids must be >= 0 for an SGLang export")
    need = int(p.layer_ids.max()) + 1
    rows = need if num_model_layers is None else int(num_model_layers)
    if rows < need:
        raise InputError(f"num_model_layers {rows} is below the largest layer id {need - 1} + 1")
    if rows > 100_000:
        raise InputError(f"layer id {need - 1} would make {rows} SGLang rows; layer ids must be "
                         "the model's (a few hundred at most)")
    out = np.tile(np.arange(p.num_slots, dtype=np.int64) % p.num_experts, (rows, 1))
    out[p.layer_ids] = p.phy2log
    return out


_RUNTIME = {"sglang": "SGLang", "trtllm": "TensorRT-LLM", "vllm": "vLLM"}


# the field each runtime reads an expert id per slot from, and what it does with a -1 there
_SLOT_FIELD = {
    "sglang": ("physical_to_logical_map",
               "its loader appends slot p to logical_to_all_physical_map[layer][-1], so the "
               "slot would serve the last expert without its weights"),
    "trtllm": ("initial_global_assignments",
               "its MoE load balancer loads the weights of the expert id in every slot (some "
               "releases assert every row is a permutation with repeats of 0..E-1)"),
    "vllm": ("initial_global_assignments",
             "its mapping loader requires every slot to hold a logical expert id 0..E-1"),
}


def check_no_empty_slots(p: Placement, fmt: str) -> None:
    """Refuse a runtime export of a placement with empty slots (``-1``: failed GPUs, or the
    unused slots of a replica budget such as ``craft``): SGLang, TensorRT-LLM and vLLM read
    one expert id per slot and none of them has a value meaning "no expert"."""
    field, why = _SLOT_FIELD[fmt]
    if p.topology.failed_gpus:
        raise InputError(
            f"the placement leaves failed GPUs {list(p.topology.failed_gpus)} empty; "
            f"{_RUNTIME[fmt]} files have no empty slot ({field}): export the native format, "
            "or solve for the smaller cluster that is left"
        )
    empty = p.phy2log < 0
    if empty.any():
        layer, slot = (int(i[0]) for i in np.nonzero(empty))
        raise InputError(
            f"{field} cannot express an empty slot: {int(empty.sum())} slots are -1 (first: "
            f"layer {int(p.layer_ids[layer])}, slot {slot}) and {_RUNTIME[fmt]} would misread "
            f"them ({why}). Solve with a policy that fills every slot (--solver greedy or any "
            "but craft, whose budget leaves slots empty), or export the native format"
        )


def check_vllm_layers(p: Placement) -> None:
    """Refuse a placement whose layer ids skip some between the first and the last: vLLM's
    file numbers rows by MoE-layer index, so a missing MoE layer (an all-zero one a trace
    reader dropped as dense) would shift every later row onto the wrong layer."""
    ids = np.unique(p.layer_ids)
    missing = np.setdiff1d(np.arange(ids[0], ids[-1] + 1), ids) if ids.size else ids
    if missing.size:
        shown = ", ".join(str(int(i)) for i in missing[:8])
        more = f", ... ({missing.size} in all)" if missing.size > 8 else ""
        raise InputError(
            f"vLLM's mapping file numbers rows by MoE-layer index, so the placement must cover "
            f"every MoE layer, but it has no rows for layers {shown}{more} (between layers "
            f"{int(ids[0])} and {int(ids[-1])}; a trace reader drops a layer with no counts as "
            "dense); every later row would land on the wrong layer. Solve from a trace that "
            "records load for every MoE layer, or export a format keyed by model layer id "
            "(native, sglang, trtllm)"
        )


def vllm_record(p: Placement) -> dict:
    """vLLM's offline-EPLB mapping record: ``initial_global_assignments`` maps the MoE-layer
    index ``"0".."L-1"`` (the placement's rows in model-layer order) to that layer's
    ``physical_to_logical`` slot list; ``num_redundant_experts = num_slots - num_experts``."""
    if p.replica_share is not None:
        raise InputError("vLLM's expert mapping cannot carry replica_share; vLLM splits tokens "
                         "evenly. Solve without weighted shares or export the native format")
    check_vllm_layers(p)
    order = np.argsort(p.layer_ids, kind="stable")
    return {
        "record_type": VLLM_RECORD,
        "version": 1,
        "num_redundant_experts": int(p.num_slots - p.num_experts),
        "num_slots": int(p.num_slots),
        "initial_global_assignments": {
            str(i): p.phy2log[row].tolist() for i, row in enumerate(order)
        },
    }


def dumps_vllm(p: Placement) -> str:
    """The vLLM mapping file: one JSON line holding `vllm_record`."""
    return json.dumps(vllm_record(p)) + "\n"


def write_placement(
    placement: Placement,
    path: str | os.PathLike,
    format: str | None = None,
    *,
    num_model_layers: int | None = None,
    layer_ids_are_model_ids: bool = False,
) -> str:
    """Write ``placement`` atomically; returns the format written.

    ``num_model_layers`` (SGLang only) sets the row count of the map; default is the largest
    layer id + 1. vLLM files (``.jsonl``) number the rows by MoE-layer index in model-layer
    order, so the placement must cover every MoE layer of the model.
    SGLang and TensorRT-LLM exports refuse a placement whose ``layer_ids`` are
    the default ``0..L-1`` unless ``layer_ids_are_model_ids=True`` (docs/deployment.md).
    """
    if not isinstance(placement, Placement):
        raise InputError(f"placement must be an eplb.Placement, got {type(placement).__name__}")
    fmt = format_for(path, format)
    check_output_path(path, "placement")
    _check_num_model_layers(num_model_layers)
    check_bool("layer_ids_are_model_ids", layer_ids_are_model_ids)  # also where unused
    if num_model_layers is not None and fmt != "sglang":
        raise InputError(f"num_model_layers applies to the sglang format only, not {fmt}")
    p = placement
    if fmt in ("sglang", "trtllm", "vllm"):
        check_no_empty_slots(p, fmt)
    if fmt in ("sglang", "trtllm"):
        check_model_layer_ids(p, _RUNTIME[fmt], layer_ids_are_model_ids)
    if fmt == "native":
        atomic_write_text(path, dumps_native(p))
    elif fmt == "npz":
        arrays = {
            "phy2log": p.phy2log,
            "layer_ids": p.layer_ids,
            "header": np.array(json.dumps(_header(p), allow_nan=False)),
        }
        if p.replica_share is not None:
            arrays["replica_share"] = p.replica_share
        buf = io.BytesIO()
        np.savez_compressed(buf, **arrays)
        atomic_write_bytes(path, buf.getvalue())
    elif fmt == "sglang":
        if p.replica_share is not None:
            raise InputError(
                "SGLang's expert location file cannot carry replica_share; SGLang splits tokens "
                "evenly. Solve without weighted shares or export the native format"
            )
        rows = sglang_map(p, num_model_layers).tolist()
        atomic_write_text(path, json.dumps({"physical_to_logical_map": rows}) + "\n")
    elif fmt == "vllm":
        atomic_write_text(path, dumps_vllm(p))
    else:  # trtllm
        import yaml  # lazy: PyYAML is needed only for TensorRT-LLM files

        if p.replica_share is not None:
            raise InputError("TensorRT-LLM's initial_global_assignments cannot carry replica_share")
        doc = {
            "num_slots": int(p.num_slots),
            "initial_global_assignments": {
                int(lid): row.tolist() for lid, row in zip(p.layer_ids, p.phy2log, strict=True)
            },
        }
        atomic_write_text(path, yaml.safe_dump(doc, default_flow_style=None, sort_keys=False))
    return fmt


# ----------------------------------------------------------------------- read
def _fail(path, msg: str) -> PlacementError:
    return PlacementError(f"{path}: {msg}")


def _read_json(path) -> Any:
    text = read_text(path, "placement file")
    if not text.strip():
        raise _fail(path, "file is empty")
    return _parse_json(path, text)


def _parse_json(path, text: str) -> Any:
    """JSON of placement file ``path``: duplicated keys and deep nesting refused."""
    return json_loads(text, str(path), PlacementError)


def _int_table(path, name: str, rows) -> np.ndarray:
    if not isinstance(rows, list) or not rows or not all(isinstance(r, list) for r in rows):
        raise _fail(path, f"{name} must be a non-empty list of lists (one per layer)")
    widths = {len(r) for r in rows}
    if len(widths) != 1:
        raise _fail(path, f"{name} is ragged: rows have lengths {sorted(widths)}")
    if not all(isinstance(v, int) and not isinstance(v, bool) for r in rows for v in r):
        raise _fail(path, f"{name} must hold integers only")
    try:
        return np.asarray(rows, dtype=np.int64)
    except OverflowError:
        big = next(v for r in rows for v in r if abs(v) >= 2**63)
        raise _fail(path, f"{name} holds {str(big)[:30]}..., beyond 64-bit integers; expert "
                    "ids are small non-negative integers") from None


def _from_header(path, head: dict, phy2log, share, layer_ids) -> Placement:
    if head.get("format") != _MAGIC:
        raise _fail(path, f"'format' is {head.get('format')!r}, expected {_MAGIC!r}")
    if head.get("version") != _VERSION:
        raise _fail(
            path, f"unsupported version {head.get('version')!r}; this eplb reads {_VERSION}"
        )
    try:
        topo = Topology.from_dict(head.get("topology"))
    except TopologyError as exc:
        raise _fail(path, f"topology: {exc}") from None
    num_experts = head.get("num_logical_experts")
    if not isinstance(num_experts, int):
        raise _fail(path, "num_logical_experts must be an integer")
    if not isinstance(head.get("meta") or {}, dict):
        raise _fail(path, f"'meta' is {type(head['meta']).__name__}, expected a JSON object "
                    "(or drop the field)")
    meta = dict(head.get("meta") or {})
    for block in _META_BLOCKS:
        if head.get(block) is not None:
            meta[block] = head[block]
    try:
        return Placement(phy2log, num_experts, topo, share, meta, layer_ids).validate()
    except PlacementError as exc:
        raise _fail(path, str(exc)) from None


def _read_native(path, doc: Any = None) -> Placement:
    doc = _read_json(path) if doc is None else doc
    if not isinstance(doc, dict):
        raise _fail(path, "top level must be an object")
    for key in ("phy2log", "layer_ids", "topology", "num_logical_experts"):
        if key not in doc:
            raise _fail(path, f"missing field {key!r}")
    phy2log = _int_table(path, "phy2log", doc["phy2log"])
    share = doc.get("replica_share")
    if share is not None:
        try:
            share = np.asarray(share, dtype=np.float64)
        except (TypeError, ValueError, OverflowError):
            raise _fail(path, "replica_share must be a table of numbers") from None
    if share is not None:
        if share.dtype == object or share.ndim != 2:
            raise _fail(path, "replica_share must be a table of numbers [layers][slots]")
    ids = doc["layer_ids"]
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool)
                                            and abs(i) < 2**62 for i in ids):
        raise _fail(path, "layer_ids must be a list of (model layer id) integers")
    return _from_header(path, doc, phy2log, share, np.asarray(ids, dtype=np.int64))


def _read_npz(path) -> Placement:
    z = read_npz(path, lambda msg: _fail(path, msg),
                 names=("phy2log", "layer_ids", "header", "replica_share"))
    for key in ("phy2log", "layer_ids", "header"):
        if key not in z:
            raise _fail(path, f"missing array {key!r}")
    if z["header"].dtype.kind not in "SU" or z["header"].ndim != 0:
        raise _fail(path, "header must be a JSON string")
    head = _parse_json(path, str(z["header"][()]))
    if not isinstance(head, dict):
        raise _fail(path, "header must be a JSON object")
    for key in ("phy2log", "layer_ids"):
        if z[key].dtype.kind not in "iu":
            raise _fail(path, f"{key} holds {z[key].dtype}, expected integers")
    return _from_header(path, head, z["phy2log"], z.get("replica_share"), z["layer_ids"])


def _need_topology(path, fmt: str, topology: Topology | str | None, slots: int,
                   ep_size: int | None = None) -> Topology:
    """The topology of a runtime file that records none: ``topology`` as given (a `Topology`),
    or ``"NODESxGPUS"`` with the file's own slot count ``slots`` (its rows, or TensorRT-LLM's
    ``num_slots``); ``ep_size`` (TensorRT-LLM's ``moe_expert_parallel_size``) must match."""
    if topology is None:
        raise InputError(
            f"{path}: a {fmt} placement file does not record the topology; pass topology= "
            "(CLI: --topology NODESxGPUS; the slots come from the file)"
        )
    if isinstance(topology, str):
        try:
            topology = Topology.parse(topology, slots)
        except TopologyError as exc:
            raise _fail(path, f"the file's {slots} slots per layer do not fit topology "
                        f"{topology!r}: {exc}") from None
    if ep_size is not None and topology.num_gpus != ep_size:
        raise _fail(path, f"moe_expert_parallel_size {ep_size} but the topology has "
                    f"{topology.num_gpus} GPUs; give --topology with {ep_size} GPUs")
    return topology


def _build(path, phy2log, topology, num_experts, layer_ids, meta) -> Placement:
    fmt = meta["source"]["format"]
    if (phy2log < 0).any():  # eplb's own empty slot; these runtimes have none (they misread it)
        layer, slot = (int(i[0]) for i in np.nonzero(phy2log < 0))
        field = _SLOT_FIELD[fmt][0] if fmt != "sglang" else "physical_to_logical_map"
        raise _fail(path, f"{field} row {layer}, slot {slot} is {int(phy2log[layer, slot])}; "
                    f"{_RUNTIME[fmt]} files hold an expert id 0..E-1 in every slot (no empty "
                    "slot): fix the file, or save a placement with empty slots in the native "
                    "format")
    E = int(phy2log.max()) + 1 if num_experts is None else num_experts
    try:
        return Placement(phy2log, E, topology, None, meta, layer_ids).validate()
    except PlacementError as exc:
        raise _fail(path, str(exc)) from None


def _read_sglang(path, topology, num_experts, doc: Any = None) -> Placement:
    doc = _read_json(path) if doc is None else doc
    if not isinstance(doc, dict) or "physical_to_logical_map" not in doc:
        raise _fail(path, "expected an object with 'physical_to_logical_map'")
    if topology is None:
        _need_topology(path, "sglang", topology, 0)
    phy2log = _int_table(path, "physical_to_logical_map", doc["physical_to_logical_map"])
    topo = _need_topology(path, "sglang", topology, phy2log.shape[1])
    return _build(path, phy2log, topo, num_experts, None, {"source": {"format": "sglang"}})


def _trtllm_doc(path) -> tuple[Any, int | None]:
    """The load-balancer mapping of a TensorRT-LLM YAML and its EP size: the standalone file
    (``num_slots``, ``initial_global_assignments``) or an LLM-API config whose
    ``moe_config.load_balancer`` is that mapping inline or the path of such a file."""
    doc = yaml_load(read_text(path, "placement file"), str(path), PlacementError)
    if not isinstance(doc, dict) or "initial_global_assignments" in doc:
        return doc, None
    moe = doc.get("moe_config")
    lb = moe.get("load_balancer") if isinstance(moe, dict) else None
    ep = doc.get("moe_expert_parallel_size")
    ep = ep if isinstance(ep, int) and not isinstance(ep, bool) and ep > 0 else None
    if isinstance(lb, str):
        target = Path(lb) if Path(lb).is_absolute() else Path(path).parent / lb
        check_regular(target, "placement file")
        inner = yaml_load(read_text(target, "placement file"), str(target), PlacementError)
        return inner, ep
    if isinstance(lb, dict):
        return lb, ep
    return doc, ep


def _read_trtllm(path, topology, num_experts) -> Placement:
    doc, ep = _trtllm_doc(path)
    if not isinstance(doc, dict) or "initial_global_assignments" not in doc:
        raise _fail(path, "expected a mapping with 'initial_global_assignments' (TensorRT-LLM's "
                    "load-balancer file, or an LLM-API config whose moe_config.load_balancer "
                    "holds or names one)")
    assign = doc["initial_global_assignments"]
    if not isinstance(assign, dict) or not assign:
        raise _fail(path, "initial_global_assignments must map layer ids to slot lists")
    if not all(isinstance(k, int) and not isinstance(k, bool) and 0 <= k < 2**31
               for k in assign):
        raise _fail(path, "initial_global_assignments keys must be integer layer ids >= 0")
    ids = sorted(assign)
    phy2log = _int_table(path, "initial_global_assignments", [assign[i] for i in ids])
    slots = doc.get("num_slots", phy2log.shape[1])
    if isinstance(slots, bool) or not isinstance(slots, int) or slots != phy2log.shape[1]:
        raise _fail(path, f"num_slots {slots!r} but rows have {phy2log.shape[1]} slots "
                    "(TensorRT-LLM requires every row to be num_slots long)")
    topo = _need_topology(path, "trtllm", topology, slots, ep)
    meta = {"source": {"format": "trtllm"}}
    return _build(path, phy2log, topo, num_experts, np.asarray(ids), meta)


def _read_vllm(path, topology, num_experts, layer_ids) -> Placement:
    text = read_text(path, "placement file")  # a regular UTF-8 file within EPLB_MAX_BYTES
    records = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not records:
        raise _fail(path, "file is empty")
    found, kinds = [], set()
    for n, line in records:
        doc = _parse_json(f"{path}:{n}", line)
        kind = doc.get("record_type") if isinstance(doc, dict) else None
        kinds.add(kind)
        if kind == VLLM_RECORD:
            found.append((n, doc))
    if not found:
        if kinds & {"eplb_load_stats", "eplb_load_meta"}:
            raise _fail(path, "is vLLM's recorded expert load (eplb_load_stats records), a "
                        "trace, not a placement: eplb solve TRACE places it, eplb trace info "
                        "reads it")
        raise _fail(path, f"no {VLLM_RECORD!r} record (one JSON object per line); not a vLLM "
                    "mapping file")
    n, doc = found[-1]  # vLLM keeps the last mapping record, as here
    where = f"{path}:{n}"
    if doc.get("version") != 1:
        raise _fail(where, f"unsupported version {doc.get('version')!r}; this eplb reads 1")
    assign = doc.get("initial_global_assignments")
    if not isinstance(assign, dict) or not assign:
        raise _fail(where, "initial_global_assignments must map MoE-layer indices to slot lists")
    L = len(assign)
    if set(assign) != {str(i) for i in range(L)}:
        raise _fail(where, f"initial_global_assignments keys must be the MoE-layer indices "
                    f"\"0\"..\"{L - 1}\", got {sorted(assign)[:8]}")
    phy2log = _int_table(where, "initial_global_assignments",
                         [assign[str(i)] for i in range(L)])
    P = phy2log.shape[1]
    if doc.get("num_slots") != P:
        raise _fail(where, f"num_slots {doc.get('num_slots')!r} but rows have {P} slots")
    E = int(phy2log.max()) + 1 if num_experts is None else int(num_experts)
    if doc.get("num_redundant_experts") != P - E:
        raise _fail(where, f"num_redundant_experts {doc.get('num_redundant_experts')!r} but "
                    f"{P} slots - {E} experts = {P - E}")
    topo = _need_topology(path, "vllm", topology, P)
    ids = np.arange(L) if layer_ids is None else np.asarray(layer_ids)
    if ids.shape != (L,) or not np.issubdtype(ids.dtype, np.integer):
        raise InputError(f"layer_ids must be {L} integers (the model layer id of each MoE "
                         f"layer), got {str(layer_ids)[:60]}")
    meta = {"source": {"format": "vllm"}}
    if layer_ids is None:
        # rows are MoE-layer indices: evaluation.align maps index i to a trace's i-th MoE layer
        meta["source"]["layer_ids"] = MOE_INDEX
    return _build(where, phy2log, topo, E, ids.astype(np.int64), meta)


def read_placement(
    path: str | os.PathLike,
    format: str | None = None,
    *,
    topology: Topology | str | None = None,
    num_experts: int | None = None,
    layer_ids=None,
) -> Placement:
    """Read and validate a placement file.

    Native and npz files carry their topology. SGLang, TensorRT-LLM and vLLM files do not: pass
    ``topology``, a `Topology` or ``"NODESxGPUS"`` (the slots are then the file's: its row
    width, TensorRT-LLM's ``num_slots``), and ``num_experts`` if some expert id is absent
    (default max id + 1). A TensorRT-LLM LLM-API config whose ``moe_config.load_balancer``
    holds the mapping inline, or names its file, is read too.
    A ``.json`` file is sniffed: native when it has ``"format": "eplb.placement"``, SGLang
    when it has ``physical_to_logical_map``. vLLM files (``.jsonl``) are keyed by MoE-layer
    index: ``layer_ids: int[L]`` gives each row's model layer id (default ``0..L-1``).
    """
    fmt = format_for(path, format)
    if topology is not None and not isinstance(topology, (Topology, str)):
        raise InputError(f"topology must be an eplb.Topology or 'NODESxGPUS', got "
                         f"{type(topology).__name__}")
    if isinstance(topology, str) and not re.fullmatch(r"\s*\d+\s*[xX]\s*\d+\s*", topology):
        raise InputError(f"topology {topology[:40]!r} is not 'NODESxGPUS' (e.g. '4x8'; the "
                         "slots come from the file), nor an eplb.Topology")
    if num_experts is not None and (isinstance(num_experts, bool) or not isinstance(
            num_experts, (int, np.integer)) or num_experts < 1):
        raise InputError(f"num_experts must be a positive integer, got {num_experts!r}")
    p = check_regular(path, "placement file")
    if fmt != "npz":
        with open(p, "rb") as fh:
            if fh.read(4) == ZIP_MAGIC:
                raise _fail(path, f"is a zip/npz archive, not a {fmt} file; name it .npz or "
                            "pass format='npz' (CLI: the .npz suffix)")
    if layer_ids is not None and fmt != "vllm":
        raise InputError(f"layer_ids= applies to vLLM files only; {fmt} files carry their own")
    doc = None
    if fmt in ("native", "sglang"):
        doc = _read_json(path)
        if format is None and isinstance(doc, dict) and "physical_to_logical_map" in doc:
            fmt = "sglang"
    if fmt == "native":
        return _read_native(path, doc)
    if fmt == "npz":
        return _read_npz(path)
    if fmt == "sglang":
        return _read_sglang(path, topology, num_experts, doc)
    if fmt == "vllm":
        return _read_vllm(path, topology, num_experts, layer_ids)
    return _read_trtllm(path, topology, num_experts)
