"""Search: what to try. Spaces and their constraints, the plan (kernel x shape x dtype x target),
the Optuna studies that propose configs, and pruning before compiling. No Ray."""
