"""Run: all the Ray code. Placement of device workers, the worker actor, the sweep loop with its
fault handling and run log, and live progress."""
