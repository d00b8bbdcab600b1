"""Search: what to try. Spaces and their constraints, the plan (kernel x shape x dtype x target),
one searcher per task over its Optuna study (`searcher`, with `studies` and `pruning`), which
proposes only valid, unmeasured configs. No Ray."""
