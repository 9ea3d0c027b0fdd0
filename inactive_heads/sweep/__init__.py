"""Stage 8, sweeps: a resumable folder of runs (baseline, thresholds, ablated runs) on one machine
or on Ray, and grids of sweeps across models and tasks."""

from .run import run_sweep
from .config import SweepConfig
from .results import SweepResults, load_results, sweep_results
