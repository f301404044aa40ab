"""Instruction fine-tuning, the recipe: `builder` (the `objective.name: sft` schema and registry entry), `compose`
(the run config from a pre-trained run), and `RECIPE`, the command `tcsm finetune sft`. The method's objective is
`tcsm.posttrain.sft`; its data kind `tcsm.data.sft`."""

from __future__ import annotations

from tcsm.recipes.spec import Flag, Option, RecipeSpec

DOC = """`tcsm finetune sft`: instruction fine-tuning on prompt/completion or chat records (loss on the completion only).

An ordinary `tcsm train` run whose config is the pre-trained run's (path, model), then the `finetune-sft` preset (or
`-c`), then key=value overrides, then the flags below. Data: `data.kind: sft` over --data, JSON lines in TRL's
formats — `{"prompt", "completion"}` texts, the same with lists of role/content messages, or `{"messages": [...]}`
whose last message is the assistant's answer — tokenized with the pre-trained run's tokenizer; chats are rendered
with --chat-template (Jinja text, a .jinja file or a tokenizer directory). The prompt is conditioning (never noised,
never scored), so the loss is on the completion tokens; records are padded after the completion with end-of-text.

    tcsm finetune sft --from runs/ts --data instructions.jsonl -o runs/ts-sft
    tcsm finetune sft --from runs/ts --data chats.jsonl --chat-template templates/chatml.jinja -o runs/ts-chat

Validation reports the bound of held-out completions given their prompts (bits per completion token).
"""

RECIPE = RecipeSpec(
    name="sft",
    source_help="pre-trained run, checkpoints, step_* or export directory (the start)",
    flags=(Flag("data.chat_template"), Flag("data.truncate")),
    data_kind="sft",
    options=(Option(("--data",), {"help": "JSONL file of prompt/completion or messages records"}),),
)
