"""Search spaces shipped with pallas-farm: one YAML file per registered kernel (package data)."""
