"""Evaluation of placements: balance metrics, all-to-all traffic, replay, comparisons, plots.

Submodules are imported on use; ``import eplb.evaluation`` itself loads nothing heavy. What
each holds: docs/evaluation.md, section "The evaluation package".
"""
