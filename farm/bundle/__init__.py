"""Bundle: what a sweep ships. Winner selection, signed Parquet bundles, keys and trust,
software fingerprints, merging bundles. No Ray, no Optuna."""
