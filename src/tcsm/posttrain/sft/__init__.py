"""Instruction fine-tuning (supervised fine-tuning on prompt / completion data), the math: `objective`
(`SFTObjective`: the composed TCSM objective on records whose prompt is conditioning — pinned, never noised, never
scored — and the held-out bound of completions given their prompts, MATH.md §2.4). Its data kind is `tcsm.data.sft`;
its recipe (`tcsm finetune sft`) is `tcsm.recipes.sft`."""
