"""`tcsm export RUN -o DIR`: a trained run as a Hugging Face-style directory (tcsm.builders.export), loadable with
`tcsm.from_pretrained(DIR)`, `transformers.AutoModelForMaskedLM.from_pretrained(DIR, trust_remote_code=True)`,
`train.init_from=DIR`, `tcsm sample DIR` and `tcsm eval DIR`."""

from __future__ import annotations

import argparse

HELP = "export a run as a Hugging Face-style directory (config.json, model.safetensors, modeling code, card)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="run directory, its checkpoints/ directory, a step_* checkpoint or an export")
    p.add_argument("-o", "--output", required=True, help="directory to write (new, empty, or an earlier export)")
    p.add_argument("--weights", choices=("ema", "model"), default="ema", help="EMA (default, when saved) or raw")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an earlier export in --output (only the files it wrote; refused if other files are there)",
    )
    p.add_argument(
        "--keep-other-files",
        action="store_true",
        help="with --overwrite: leave files the earlier export did not write (your eval results, onnx/) in place",
    )


    lora = p.add_mutually_exclusive_group()
    lora.add_argument("--merge-lora", dest="lora_merge", action="store_const", const=True, default=None,
                      help="a LoRA run: export the weights with the adapters folded in (default: train.lora.merge)")
    lora.add_argument("--lora-adapter", dest="lora_merge", action="store_const", const=False,
                      help="a LoRA run: export the adapters alone, as a PEFT adapter directory")


def run(args) -> int:
    from tcsm.builders.export import export
    from tcsm.core.errors import ConfigError

    if args.keep_other_files and not args.overwrite:
        raise ConfigError("--keep-other-files goes with --overwrite (it says what an overwrite leaves in place)")
    out = export(
        args.run, args.output, ema=args.weights == "ema", overwrite=args.overwrite,
        keep_other_files=args.keep_other_files, lora_merge=args.lora_merge,
    )  # fmt: skip
    if (out / "adapter_config.json").is_file():
        print(f"exported the LoRA adapters of {args.run} to {out} (load with peft.PeftModel.from_pretrained(base, DIR))")
    else:  # the family's exporter says what loads it (its own transformers class, or the remote code)
        from tcsm.builders.exporters import exporter_of_export

        print(f"exported {args.run} to {out} (load with {exporter_of_export(out).loads_with})")
    return 0

