"""LoRA against full fine-tuning: trainable parameters and peak memory of one post-training step that reads a
frozen reference (a reward / preference / DRE step), each in a fresh process.

    full: the student, the reference as a second copy of the weights, the EMA copy, AdamW over every weight;
    lora: one set of weights with adapters; the reference is the model with its adapters disabled
          (tcsm.models.lora.adapters_off), the EMA shares the frozen weights, AdamW over the adapters only.

Peak memory is the process's peak resident set (ru_maxrss) minus its resident set before the model was built
(torch's CPU allocations bypass tracemalloc). A masked diffusion LM directory (tests/llada_helpers.py) of the size
given is written to a temporary directory and loaded with model.name=hf_masked_dlm's class.

    python benchmarks/lora_memory.py --hidden 512 --layers 8 --vocab 8000
    python benchmarks/lora_memory.py --hidden 512 --layers 8 --vocab 8000 --cli   # whole `tcsm finetune dre` runs

With `--cli` the same comparison is made on whole runs: the directory is imported (`tcsm train ... train.steps=0`
on synthetic data of its vocabulary), then `tcsm finetune dre --strategy i` (a frozen reference: the run it starts
from) trains 2 steps in full and with LoRA, each in a fresh process reporting its own peak resident set.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def one(mode: str, directory: str, r: int, targets: list[str], length: int) -> dict:
    import torch
    import transformers as tf

    from tcsm.builders.hf_masked import HFMaskedDLM
    from tcsm.models.lora import adapters_off, add_adapters
    from tcsm.train.ema import EMA

    torch.set_num_threads(1)
    before = _rss_mb()
    hf = tf.AutoModel.from_pretrained(directory, trust_remote_code=True)
    V = hf.config.vocab_size
    model = HFMaskedDLM(hf, V - 1, V - 1)
    if mode == "lora":
        add_adapters(model, r=r, alpha=2 * r, dropout=0.0, target_modules=targets, seed=0)
        reference = adapters_off(model)
    else:
        import copy

        reference = copy.deepcopy(model).eval().requires_grad_(False)
    ema = EMA(model, 0.99)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, V, (4, length), generator=g)
    for _ in range(2):
        with torch.no_grad():
            ref = torch.log_softmax(reference(x), -1)
        loss = (torch.softmax(model(x), -1) * (torch.log_softmax(model(x), -1) - ref)).sum(-1).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        ema.update(model)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    # Bytes of the distinct tensor storages the step holds: model, reference, EMA copy, optimizer state.
    held = [*model.state_dict().values(), *reference.state_dict().values(), *ema.model.state_dict().values(),
            *(v for st in opt.state.values() for v in st.values() if torch.is_tensor(v))]  # fmt: skip
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in held}
    return {"mode": mode, "trainable": sum(p.numel() for p in params),
            "total": sum(p.numel() for p in model.parameters()), "peak_mb": round(peak - before, 1),
            "tensors_mb": round(sum(storages.values()) / 2**20, 1)}  # fmt: skip


CLI_CHILD = """
import resource, sys
from tcsm.cli import main
rc = main(sys.argv[1:])
print("PEAK_MB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
sys.exit(rc)
"""

QUIET = ["train.device=cpu", "train.threads=1", "train.progress=false", "train.tensorboard=false", "train.precision=fp32",
         "train.eval_every=0", "train.sample_every=0", "sample.num=0", "train.batch_size=4", "eval.num_t=1"]  # fmt: skip


def _child(argv: list[str]) -> float:
    out = subprocess.run([sys.executable, "-c", CLI_CHILD, *argv], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"tcsm {' '.join(argv[:3])} failed: {out.stderr.strip().splitlines()[-1:]}")
    return float(out.stdout.strip().splitlines()[-1].split()[-1])


def cli_rows(d: Path, a) -> list[dict]:
    """Peak memory of whole `tcsm finetune dre --strategy i` runs, full and LoRA, from the imported directory."""
    import random

    from tokenizers import Tokenizer, models, pre_tokenizers

    tmp = d.parent
    words = [f"w{i}" for i in range(a.vocab - 2)]  # + end of text + the mask token (its last id)
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate([*words, "<|eot|>", "<|mdm_mask|>"])},
                                     unk_token="<|eot|>"))  # fmt: skip
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(d / "tokenizer.json"))
    rng = random.Random(0)
    (tmp / "corpus.txt").write_text("\n".join(" ".join(rng.choices(words, k=2 * a.length)) for _ in range(64)))
    _child(["prepare", str(tmp / "corpus.txt"), "-o", str(tmp / "shards"), "--tokenizer", str(d / "tokenizer.json"),
            "--doc-separator", "\\n", "--eos", "<|eot|>", "--val-fraction", "0.1", "--test-fraction", "0", "--no-progress"])  # fmt: skip
    base = _child(["train", "-o", str(tmp / "run"), "model.name=hf_masked_dlm", f"model.name_or_path={d}",
            "model.trust_remote_code=true", "data.kind=shards", f"data.path={tmp / 'shards'}",
            f"data.seq_len={a.length}", "train.steps=0", *QUIET])  # fmt: skip
    rows = [{"mode": "import (train.steps=0)", "peak_mb": base}]
    lora = [f"train.lora.r={a.r}", f"train.lora.target_modules=[{a.targets}]"]
    # LoRA with the reference loaded as a second copy: the start's raw weights (train.init_weights=model) against a
    # reference read with reference.ema=true is not provably the same checkpoint read, so nothing is shared
    for mode, extra in (("full", []), ("lora", lora), ("lora, reference copied", [*lora, "train.init_weights=model"])):
        peak = _child(["finetune", "dre", "--from", str(tmp / "run"), "--strategy", "i", "--loss", "bce", "--steps",
                       "2", "--eval-examples", "0", "-o", str(tmp / mode), *QUIET, *extra])  # fmt: skip
        rows.append({"mode": f"{mode}", "peak_mb": peak})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--length", type=int, default=64)
    p.add_argument("--r", type=int, default=8)
    p.add_argument("--targets", default="q_proj,k_proj,v_proj,attn_out")
    p.add_argument("--cli", action="store_true", help="measure whole `tcsm finetune dre` runs (peak RSS)")
    p.add_argument("--one", nargs=2, metavar=("MODE", "DIR"), help=argparse.SUPPRESS)
    a = p.parse_args()
    targets = a.targets.split(",")
    if a.one:
        print(json.dumps(one(a.one[0], a.one[1], a.r, targets, a.length)))
        return
    sys.path.insert(0, str(ROOT / "tests"))
    from llada_helpers import CONFIGURATION, MODELING  # the tiny modeling code, at a larger size

    with tempfile.TemporaryDirectory() as tmp:
        import json as _json

        d = Path(tmp) / "m"
        d.mkdir()
        (d / "configuration_tiny_dlm.py").write_text(CONFIGURATION)
        (d / "modeling_tiny_dlm.py").write_text(MODELING)
        (d / "config.json").write_text(_json.dumps({
            "model_type": "tiny_dlm", "vocab_size": a.vocab, "hidden_size": a.hidden, "num_layers": a.layers,
            "num_heads": 8, "max_position_embeddings": 512, "mask_token_id": a.vocab - 1,
            "auto_map": {"AutoConfig": "configuration_tiny_dlm.TinyDLMConfig",
                         "AutoModel": "modeling_tiny_dlm.TinyDLMModel"}}))  # fmt: skip
        import transformers as tf

        cfg = tf.AutoConfig.from_pretrained(str(d), trust_remote_code=True)
        tf.AutoModel.from_config(cfg, trust_remote_code=True).save_pretrained(str(d))
        if a.cli:
            for row in cli_rows(d, a):
                print(f"{row['mode']:26s} peak resident memory {row['peak_mb']:.1f} MB")
            return
        rows = []
        for mode in ("full", "lora"):
            out = subprocess.run([sys.executable, __file__, "--one", mode, str(d), "--r", str(a.r), "--targets",
                                  a.targets, "--length", str(a.length)], capture_output=True, text=True, check=True)  # fmt: skip
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    for row in rows:
        print(f"{row['mode']:5s} trainable {row['trainable']:>10,} of {row['total']:>10,} parameters, "
              f"tensors held {row['tensors_mb']:.1f} MB, peak memory +{row['peak_mb']:.1f} MB")  # fmt: skip


if __name__ == "__main__":
    main()
