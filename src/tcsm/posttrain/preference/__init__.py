"""Preference fine-tuning (MATH.md §5.3): `objective` (sequence log-ratios against the frozen reference, the
paper's BCE and a DPO-style loss), `pairs` (the chosen/rejected JSONL data kind), `builder` (config schema and
registry entry), `recipe` (pairs from a model's own samples, run config and report). Commands: `tcsm pairs`,
`tcsm finetune preference`."""
