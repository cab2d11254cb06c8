"""Moved: the validation study is hexiseq/validation/fidelity.py, its grid search hexiseq/fitting.py.

This module is kept only because calibrate/calibrate.py still imports `grid_search` from here; once
it imports hexiseq.fitting, delete this file.
"""

from ..fitting import grid_search

__all__ = ["grid_search"]
