"""AR → diffusion distillation builders (MATH.md §5.4): the teacher target with its candidate estimators."""
