"""Validation studies of the cost model: how well it predicts what others measured.

- `fidelity`: published training throughputs (data/validation/) against the step replay's
  predictions, and the fit of the catalog's efficiencies (`benchmarks/bench_fidelity.py`).
"""
