"""What a file given to the wrong verb is: `kind_of` sniffs a file's first bytes (never the
whole file) for the kinds of file eplb reads or writes, and `explain` turns a reader's error on
such a file into one line naming what it is and which verb takes it ("is a Mooncake request
trace ...: eplb workload info, eplb simulate --workload take it")."""

from __future__ import annotations

import os
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

from eplb.errors import EplbError, InputError

HEAD = 65536  # bytes read to tell a kind (a summary's keys, a TOML's tables)

TRACE, PLACEMENT, REQUESTS, CLUSTER, RESULT = "trace", "placement", "requests", "cluster", "result"
SUMMARY = "summary"
# who takes each kind (what the message names)
TAKES = {
    TRACE: "eplb solve / compare / trace info / replay / advise take it (as LOAD or TRACE), and "
           "eplb evaluate as its second argument",
    PLACEMENT: "eplb evaluate PLACEMENT TRACE, eplb execute PLACEMENT, eplb solve --previous "
               "and a cluster config's eplb.initial take it",
    REQUESTS: "eplb workload info and eplb simulate --workload take it",
    CLUSTER: "eplb simulate CONFIG takes it",
    RESULT: "it is an output of eplb, not an input: open it with pandas or a viewer",
    SUMMARY: "eplb advise --from-summary takes it (or its folder); otherwise it is an output "
             "of eplb: open it with a viewer",
}


@dataclass(frozen=True)
class Kind:
    """A recognised file: ``group`` (one of `TAKES`) and ``what`` it is, in words."""

    group: str
    what: str


def _head(p: Path) -> bytes:
    try:
        with open(p, "rb") as fh:
            return fh.read(HEAD)
    except OSError:
        return b""


def _first_line(text: str) -> str:
    return text.lstrip("\ufeff \t\r\n").split("\n", 1)[0]


def _zip_kind(p: Path) -> Kind | None:
    try:
        with zipfile.ZipFile(p) as zf:
            names = {n.rsplit("/", 1)[-1] for n in zf.namelist()}
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return None
    if "data.pkl" in names:
        return Kind(TRACE, "a torch.save dump (SGLang's expert-distribution recorder)")
    if {"phy2log.npy", "header.npy"} <= names:
        return Kind(PLACEMENT, "an eplb placement (.npz)")
    if "counts.npy" in names:
        return Kind(TRACE, "an eplb expert-load trace (.npz)")
    return None


def _parquet_kind(p: Path) -> Kind | None:
    try:
        import pyarrow.parquet as pq  # lazy: only when a Parquet file is misread

        cols = set(pq.read_schema(p).names)
    except Exception:
        return None
    if {"window", "layer", "expert", "count"} <= cols:
        return Kind(TRACE, "a long expert-load table (Parquet)")
    if {"arrival_s", "input_tokens"} <= cols:
        return Kind(REQUESTS, "a request workload (Parquet, as eplb workload synth writes)")
    return None


def _json_kind(text: str) -> Kind | None:
    first = _first_line(text)
    if (first.startswith("{") and '"record_type"' in first) or '"record_type"' in text[:4096]:
        if '"eplb_initial_mapping"' in text:
            return Kind(PLACEMENT, "vLLM's offline-EPLB mapping file (eplb_initial_mapping)")
        if '"eplb_load_' in text:
            return Kind(TRACE, "vLLM's recorded expert load (eplb_load_stats records)")
    if first.startswith("{") and '"hash_ids"' in first and '"input_length"' in first:
        return Kind(REQUESTS, "a Mooncake request trace (JSON lines of timestamp, input_length, "
                              "output_length, hash_ids)")
    if re.search(r'"format"\s*:\s*"eplb\.placement"', text[:4096]):
        return Kind(PLACEMENT, "an eplb placement (native JSON)")
    if '"physical_to_logical_map"' in text[:4096]:
        return Kind(PLACEMENT, "an SGLang expert-location file (--init-expert-location)")
    if '"logical_count"' in text[:4096]:
        return Kind(TRACE, "an SGLang expert-distribution dump (logical_count)")
    if '"ttft_p50_s"' in text or '"tok_s_per_node"' in text:
        return Kind(SUMMARY, "a serving result summary (eplb simulate's summary.json)")
    if re.search(r'"columns"\s*:', text) and re.search(r'"rows"\s*:', text):
        return Kind(RESULT, "a result table as JSON (eplb advise --json)")
    return None


def _yaml_kind(text: str) -> Kind | None:
    if re.search(r"^\s*initial_global_assignments\s*:", text, re.M) or re.search(
            r"^\s*load_balancer\s*:", text, re.M):
        return Kind(PLACEMENT, "a TensorRT-LLM load-balancer file (initial_global_assignments)")
    return None


def _toml_kind(text: str) -> Kind | None:
    tables = set(re.findall(r"^\s*\[+\s*([A-Za-z_]+)", text, re.M))
    keys = set(re.findall(r"^\s*([A-Za-z_]+)\s*=", text, re.M))
    if tables & {"prefill", "decode", "eplb", "kv", "slo", "routing", "hardware"} or \
            {"model", "hardware"} <= keys:
        return Kind(CLUSTER, "a cluster config (TOML)")
    return None


def _csv_kind(text: str) -> Kind | None:
    cells = {c.strip().strip('"') for c in _first_line(text).split(",")}
    if {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= cells:
        return Kind(REQUESTS, "an Azure LLM inference trace (TIMESTAMP, ContextTokens, "
                              "GeneratedTokens)")
    if {"arrival_s", "input_tokens"} <= cells:
        return Kind(REQUESTS, "a request workload CSV")
    if {"solver", "topology", "status"} <= cells:
        return Kind(RESULT, "a comparison result table (eplb compare -o)")
    if {"window", "layer", "expert", "count"} <= cells:
        return Kind(TRACE, "a long expert-load table (CSV)")
    if "layer" in cells and {"max_over_mean", "balancedness"} & cells:
        return Kind(RESULT, "a per-layer result table (eplb evaluate -o)")
    return None


def kind_of(path: str | os.PathLike) -> Kind | None:
    """What ``path`` is, from its first bytes (None when not recognised, a directory or
    unreadable)."""
    try:
        p = Path(path)
        if not p.is_file():
            return None
    except (OSError, ValueError, TypeError):
        return None
    head = _head(p)
    if head.startswith(b"PK\x03\x04"):
        return _zip_kind(p)
    if head.startswith(b"PAR1"):
        return _parquet_kind(p)
    if head.startswith(b"\x93NUMPY"):
        return Kind(TRACE, "a numpy load matrix (.npy)")
    text = head.decode("utf-8", "replace")
    first = _first_line(text)
    if first[:1] in ("{", "["):
        return _json_kind(text)
    suffix = p.suffix.lower()
    if suffix in (".yaml", ".yml"):
        return _yaml_kind(text)
    if suffix == ".toml" or re.match(r"\s*(\[[A-Za-z_]|[A-Za-z_]+\s*=)", first):
        found = _toml_kind(text)
        if found is not None:
            return found
    return _csv_kind(text) or _yaml_kind(text)


def explain(path, wanted: str, exc: EplbError) -> EplbError:
    """``exc`` (a reader's error on ``path``, given where a ``wanted`` kind belongs) replaced
    by one `InputError` naming what the file is and which verb takes it, when `kind_of`
    recognises another kind; else ``exc`` itself."""
    kind = kind_of(path)
    if kind is None or kind.group == wanted:
        return exc
    article = "an" if wanted[0] in "aeiou" else "a"
    want = {TRACE: "an expert-load trace", PLACEMENT: "a placement file",
            REQUESTS: "a request workload", CLUSTER: "a cluster config"}.get(
        wanted, f"{article} {wanted}")
    return InputError(f"{path} is {kind.what}, not {want}: {TAKES[kind.group]}")


def check_not_swapped(placement, trace) -> None:
    """Refuse ``eplb evaluate TRACE PLACEMENT``: the first argument recognised as a trace and
    the second as a placement are one error saying they look swapped."""
    first, second = kind_of(placement), kind_of(trace)
    if first is not None and second is not None and first.group == TRACE and \
            second.group == PLACEMENT:
        raise InputError(f"the arguments look swapped: PLACEMENT {placement} is {first.what} and "
                         f"TRACE {trace} is {second.what}; run eplb evaluate {trace} {placement}")


def read_trace_as(path, format: str | None = None):
    """`traces.read`, its errors on a file of another kind replaced by `explain`'s."""
    from eplb import traces  # lazy: keeps eplb --help fast

    try:
        return traces.read(path, format=format)
    except EplbError as exc:
        raise explain(path, TRACE, exc) from None


def read_placement_as(path, **kw):
    """`eplb.io.read_placement`, its errors on a file of another kind replaced by
    `explain`'s."""
    from eplb.io import read_placement  # lazy: keeps eplb --help fast

    try:
        return read_placement(path, **kw)
    except EplbError as exc:
        raise explain(path, PLACEMENT, exc) from None


def read_workload_as(path, **kw):
    """`workload.read`, its errors on a file of another kind replaced by `explain`'s."""
    from eplb.evaluation.serving import workload as W  # lazy: keeps eplb --help fast

    try:
        return W.read(path, **kw)
    except EplbError as exc:
        raise explain(path, REQUESTS, exc) from None


def workload_spec_as(spec, **kw):
    """`workload.from_spec` (a file or ``synth:...``), a file's errors explained as above."""
    from eplb.evaluation.serving import workload as W  # lazy: keeps eplb --help fast

    try:
        return W.from_spec(spec, **kw)
    except EplbError as exc:
        raise explain(spec, REQUESTS, exc) from None


def load_cluster_as(text):
    """`ClusterConfig.load` (a TOML file or a preset name), a file's errors explained as
    above."""
    from eplb.evaluation.serving import ClusterConfig  # lazy: keeps eplb --help fast

    try:
        return ClusterConfig.load(text)
    except EplbError as exc:
        raise explain(text, CLUSTER, exc) from None
