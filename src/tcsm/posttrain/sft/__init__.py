"""Instruction fine-tuning (supervised fine-tuning on prompt / completion data): the ordinary TCSM objective on
records whose prompt is conditioning — pinned, never noised, never scored — so the loss is on the completion only.

data       the `sft` data kind: TRL's prompt/completion and `messages` formats, chats through a chat template, the
           preference pairs' conventions (run tokenizer, EOS padding as part of the response, prompt mask)
objective  `SFTObjective`: the composed objective plus the held-out bound of completions given their prompts
builder    `objective.name: sft` (the composed objective's keys and eval_num_t)
recipe     the run config from a pre-trained run (`tcsm finetune sft`)
"""
