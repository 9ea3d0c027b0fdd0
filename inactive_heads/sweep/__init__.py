"""Stage 7, sweeps: a resumable folder of runs (baseline, thresholds, ablated runs) on one machine
or on Ray, and grids of sweeps across models and tasks."""

from .runner import SweepConfig, SweepResults, load_results, run_sweep, sweep_results
