"""Calibration from measurement (issue 11, parts 5-6).

- `profile(world=4 | cluster=...) -> Profile`: measure the local devices (kernel rates over the shapes
  plans use, memory-bound rate) and links (P2P and all-to-all bandwidth and latency of every pair) of
  a running world of CPU ranks; `Profile.to_yaml()` / `.save()` is a `data/profiles/` file that
  `hexiseq plan/estimate --profile` reads (profile.py, measure.py);
- `calibrate(world=4, profile=None, quick=False) -> Calibration`: run the calibration plans on that
  world, measure, fit what the profile cannot measure, predicted vs measured per plan (calibrate.py,
  plans.py); `prepare_calibration` / `run_calibration` / `fit_calibration` are its three parts, for a
  caller that runs the plans a few at a time between its own runs (compare_dp's in-window calibration);
- `compare("cpu-4") -> Comparison`: the planner's uneven plan against the best even plan on an
  emulated heterogeneous cluster, measured and predicted (compare.py);
- `emulation`: which clusters CPU ranks can emulate and how (the mechanism: hexiseq/runtime/emulation.py);
  `catalog`: data/gpus-cpu.yaml from a reference profile.
"""

from .calibrate import Calibration, calibrate
from .compare import Comparison, compare
from .profile import Profile, profile

__all__ = ["Calibration", "Comparison", "Profile", "calibrate", "compare", "profile"]
