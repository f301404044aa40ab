"""AR → diffusion distillation (MATH.md §5.4): `target` (the teacher's concrete score: exact / Top-K /
Top-K + n-gram / Taylor, proposals), `ngram` (right-context n-gram for Top-K), `builder` (teacher inspection,
memory checks, registry entry), `recipe` (student run config and report). Command: `tcsm distill`."""
