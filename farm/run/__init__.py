"""Run: all the Ray code. `sweep.run_sweep` (the one sweep path), the worker `pool` (placement,
replacement, hung and dead workers), the worker `actor`, the trial log `runlog`, live `progress`."""
