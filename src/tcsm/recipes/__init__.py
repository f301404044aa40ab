"""Post-training recipes, one folder per method of `tcsm.posttrain`: `builder` (its config schema and registry
entries), `compose` (the run config from the source run, the report) and `RECIPE` in its `__init__` (the command:
preset, flags that are config keys, options), a `spec.RecipeSpec`. `tcsm finetune <name>` and the builders find the
recipes by listing this package (docs/DESIGN.md "Adding a post-training method")."""
