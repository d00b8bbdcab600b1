"""pallas-farm: a distributed autotuning farm for JAX Pallas kernels, built on Ray."""
__version__ = "0.1.0"
