"""The dre recipe: `builder` (config schema, registry entries) and `compose` (run config from a pre-trained run,
report)."""
