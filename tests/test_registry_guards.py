"""The registry leak guards of conftest (issue 32 part 6): a test that registers a policy and
leaves it registered fails, for solvers and DP balancers alike."""

from __future__ import annotations

import pytest

from eplb import solvers
from eplb.evaluation.serving.balancers import registry as balancers
from tests.conftest import registry_leaks


def _leave_registered(module: str, what: str, register, unregister) -> None:
    guard = registry_leaks(module, what)
    next(guard)  # the test starts
    register("guard_probe")
    try:
        with pytest.raises(AssertionError, match=rf"left {what} registered: \['guard_probe'\]"):
            next(guard)  # the test ends with the probe still registered
    finally:
        unregister("guard_probe")


def test_a_balancer_left_registered_fails_the_test():
    _leave_registered("eplb.evaluation.serving.balancers.registry", "balancers",
                      lambda n: balancers.register(n)(lambda requests, state, *, seed: None),
                      balancers.unregister)


def test_a_solver_left_registered_fails_the_test():
    _leave_registered("eplb.solvers.registry", "solvers",
                      lambda n: solvers.register(n)(lambda load, topology: None),
                      solvers.unregister)


def test_a_test_that_cleans_up_passes_the_guard():
    guard = registry_leaks("eplb.evaluation.serving.balancers.registry", "balancers")
    next(guard)
    balancers.register("guard_probe")(lambda requests, state, *, seed: None)
    balancers.unregister("guard_probe")
    with pytest.raises(StopIteration):  # the check ran and found nothing left
        next(guard)
