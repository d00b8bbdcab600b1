"""Measure: what one config does. Compile ahead of time, validate against the reference, time
device work; outcomes, capacities and software versions. No Ray."""
