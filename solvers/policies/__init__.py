"""The placement policies, one registered function per module (named for the policy).

Importing this package registers them all: ``biased``, ``craft``, ``deepseek``, ``greedy``,
``greedy_weighted``, ``greedy_traffic``, ``repair``, ``hierarchical``, ``relaxed``,
``robust``, ``ilp``, ``ilp_weighted``, ``lplb``. A policy builds on `solvers.primitives` and
`solvers.analysis`, never on another policy's module. Call them through `solvers.solve`.
"""

from eplb.solvers.policies import (  # noqa: F401  (each module registers its policy)
    biased,
    craft,
    deepseek,
    greedy,
    greedy_traffic,
    greedy_weighted,
    hierarchical,
    ilp,
    ilp_weighted,
    lplb,
    relaxed,
    repair,
    robust,
)
