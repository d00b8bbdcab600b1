"""Retune: nightly retuning after software upgrades (stale tasks, warm starts, the promotion
rule, the rollout gate)."""
