"""Deploy: what a serving process needs. Pull and verify a bundle, look configs up, run tuned
kernels. Imports neither Ray nor Optuna."""
