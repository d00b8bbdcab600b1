"""Bundle: what a sweep ships. Winner selection, signed Parquet bundles, keys and trust, one way to
open and verify a bundle wherever it lives (locate), software fingerprints, merging bundles.
No Ray, no Optuna."""
