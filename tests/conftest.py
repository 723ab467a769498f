"""Shared test fixtures: paths to the real traces (skipped when absent), hypothesis profile.

Real traces are looked up in ``$EPLB_DATA`` when set (a directory holding
``deepseek-v3-sglang/*.json``, ``qwen1.5-moe-harmoeny/`` ... as ``../shared/traces`` does),
else in ``../shared/traces`` next to the repository. See docs/data.md for where to get them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from eplb.data_dirs import requests_dir, traces_dir

REPO = Path(__file__).resolve().parents[1]
SHARED_TRACES = traces_dir()  # $EPLB_DATA, else ../shared/traces
BUNDLED = REPO / "traces" / "data"

settings.register_profile(
    "ci",
    deadline=None,
    max_examples=40,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
)
settings.register_profile("dev", deadline=None, max_examples=200)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    """``../shared/traces`` next to the repository; skips the test when it is absent."""
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"real traces not found at {SHARED_TRACES} (they live outside the repo; "
                    "set EPLB_DATA=DIR, see docs/data.md)")
    return SHARED_TRACES


# the expert-count dumps SGLang published for DeepSeek-V3 (docs/data.md): the tests assert
# facts of these six, so they ask for them by name (other files in the folder are not theirs)
DEEPSEEK_JSONS = ("decode_in1000out1000.json", "decode_in2000out100.json",
                  "prefill_in1000out1000.json", "prefill_in1024.json", "prefill_in2048.json",
                  "prefill_in512.json")


@pytest.fixture(scope="session")
def deepseek_jsons(shared_traces: Path) -> list[Path]:
    """The six published DeepSeek-V3 dumps, sorted by name; skips unless all are there."""
    folder = shared_traces / "deepseek-v3-sglang"
    missing = [n for n in DEEPSEEK_JSONS if not (folder / n).is_file()]
    if missing:
        pytest.skip(f"DeepSeek-V3 JSON files {', '.join(missing)} not found under {folder}")
    return [folder / n for n in DEEPSEEK_JSONS]


# request traces (Mooncake, Azure): $EPLB_REQUESTS when set, else ../shared/requests
SHARED_REQUESTS = requests_dir()


@pytest.fixture(scope="session")
def shared_requests() -> Path:
    """``../shared/requests`` (Mooncake and Azure request traces); skips when absent."""
    if not SHARED_REQUESTS.is_dir():
        pytest.skip(f"request traces not found at {SHARED_REQUESTS} (they live outside the repo; "
                    "set EPLB_REQUESTS=DIR, see docs/data.md)")
    return SHARED_REQUESTS


def shared_file(folder: Path, *parts: str) -> Path:
    """``folder / parts`` (a data folder's file), skipping the test when it is absent: the
    folder $EPLB_DATA or $EPLB_REQUESTS names may hold other files than this checkout's."""
    path = folder.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} not found (the data lives outside the repo; point EPLB_DATA or "
                    "EPLB_REQUESTS at a folder holding it, see docs/data.md)")
    return path


@pytest.fixture(scope="session")
def mooncake_jsonl(shared_requests: Path) -> Path:
    """The Mooncake conversation trace (JSON lines); skips when absent."""
    return shared_file(shared_requests, "mooncake_conversation.jsonl")


@pytest.fixture(scope="session")
def azure_csv(shared_requests: Path) -> Path:
    """The Azure LLM inference code trace (2023, CSV); skips when absent."""
    return shared_file(shared_requests, "azure_code_2023.csv")


@pytest.fixture(scope="session")
def qwen_dir(shared_traces: Path) -> Path:
    """The Qwen1.5-MoE per-rank CSV directory (six ranks); skips when absent."""
    return shared_file(shared_traces, "qwen1.5-moe-harmoeny", "0", "moe_layer-0.csv").parents[1]


@pytest.fixture(scope="session")
def deepseek_prefill_json(shared_traces: Path) -> Path:
    """SGLang's DeepSeek-V3 prefill expert-count dump (``prefill_in1024.json``)."""
    return shared_file(shared_traces, "deepseek-v3-sglang", "prefill_in1024.json")


@pytest.fixture(scope="session", autouse=True)
def _checkout_stays_clean():
    """Tests write only to temporary folders: fail the run if the repository's top level
    gained entries (a relative output path in a test lands in the working directory)."""
    before = set(os.listdir(REPO))
    yield
    new = sorted(set(os.listdir(REPO)) - before - {".pytest_cache", ".hypothesis"})
    assert not new, f"tests wrote into the checkout: {new}"


def registry_leaks(module: str, what: str):
    """Generator for a guard fixture: names registered in ``module``'s registry (its
    ``available()``) during the test and left there fail the test that left them. A module
    not imported yet holds nothing to check."""
    registry = sys.modules.get(module)
    before = registry.available() if registry else None
    yield
    if before is not None:
        left = sorted(set(registry.available()) - set(before))
        assert not left, f"the test left {what} registered: {left}"


@pytest.fixture(autouse=True)
def _solver_registry_unchanged():
    """A test that registers a policy removes it again (register spies in a fixture that calls
    `solvers.unregister`): a policy left behind fails the test that left it."""
    yield from registry_leaks("eplb.solvers.registry", "solvers")


@pytest.fixture(autouse=True)
def _balancer_registry_unchanged():
    """The same guard for DP balancers (`serving.balancers.registry.unregister`)."""
    yield from registry_leaks("eplb.evaluation.serving.balancers.registry", "balancers")


def _dispatch_entries() -> dict | None:
    """``{registry kind: {name: id(entry)}}`` of the dispatch registries (routed and shared
    expert), or None before `eplb.dispatch` is imported."""
    if "eplb.dispatch" not in sys.modules:  # not imported yet: nothing registered to check
        return None
    from eplb.dispatch import DISPATCH, SHARED_EXPERT

    return {reg.kind: {name: id(reg[name]) for name in reg} for reg in (DISPATCH, SHARED_EXPERT)}


@pytest.fixture(autouse=True)
def _dispatch_registry_unchanged():
    """A test that registers a dispatch policy removes it again (`Registry.remove` in a
    fixture), and one that removes or replaces a built-in puts it back: a registry left
    changed fails the test that changed it."""
    before = _dispatch_entries()
    yield
    if before is not None:
        after = _dispatch_entries()
        changed = sorted(f"{kind} {name!r}" for kind in after
                         for name in set(after[kind]) | set(before[kind])
                         if after[kind].get(name) != before[kind].get(name))
        assert not changed, f"the test left dispatch policies registered or changed: {changed}"
