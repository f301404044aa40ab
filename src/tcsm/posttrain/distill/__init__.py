"""AR → diffusion distillation, the math (MATH.md §5.4): `target` (the teacher's concrete score: exact / Top-K /
Top-K + n-gram / Taylor, and the proposals h), `ngram` (the right-context n-gram behind Top-K + n-gram). Its recipe
(schema, teacher checks, run config, report, `tcsm distill`) is `tcsm.recipes.distill`."""
