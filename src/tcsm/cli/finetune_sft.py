"""`tcsm finetune sft`: instruction-tune a pre-trained diffusion checkpoint on prompt / completion records.

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

from __future__ import annotations

import argparse

HELP = "instruction fine-tuning on prompt/completion or chat records (loss on the completion only)"

SFT_FLAGS = {"chat_template": "data.chat_template", "truncate": "data.truncate", "steps": "train.steps"}


def add_arguments(r: argparse.ArgumentParser) -> None:
    from tcsm.cli.common import add_config_arguments, add_steps_and_resume_arguments

    r.add_argument("--from", "-k", "--checkpoint", dest="checkpoint",
                   help="pre-trained run, checkpoints, step_* or export directory (the start)")  # fmt: skip
    r.add_argument("--data", help="JSONL file of prompt/completion or messages records")
    add_config_arguments(r, "finetune-sft")
    r.add_argument("--chat-template", help="chat template for messages records: Jinja text, .jinja file or tokenizer dir")
    r.add_argument("--truncate", action="store_true", default=None,
                   help="cut completions that do not fit the model's length (default: refuse such records)")  # fmt: skip
    add_steps_and_resume_arguments(r, "fine-tuning")
    r.add_argument("--print-config", action="store_true", help="print the resolved config and exit")


def run(args) -> int:
    from tcsm.cli.common import resolve_recipe, run_recipe
    from tcsm.core.errors import ConfigError

    def new_config(config: str, values: dict):
        from tcsm.recipes.sft.compose import sft_config

        if not args.checkpoint or not args.data:
            raise ConfigError("give the pre-trained model and the data: tcsm finetune sft --from RUN --data FILE")
        return sft_config(args.checkpoint, args.data, config, args.overrides, values)

    cfg, run_dir, resume = resolve_recipe(args, "finetune-sft", SFT_FLAGS, new_config)
    return run_recipe(args, cfg, run_dir, resume, report=None, report_file="", describe=str)
