"""Data pipeline benchmark: `tcsm prepare` throughput, and a training process's start-up, peak memory and
data-loading share on prepared shards of growing corpora.

Corpora: the documents of ../shared/data (IMDB reviews, TinyStories, LAMBADA, WikiText-2 paragraphs, LM1B and PTB
lines, tiny-shakespeare, text8-prefix cut into 10k-character pieces), shuffled with a fixed seed and written as
one JSONL file until the size is reached; sizes beyond the ~90 MB available repeat the documents (the number of
passes is recorded). Tokenizer: GPT-2's BPE from ../shared/data/gpt2_bpe.

* throughput: `tcsm prepare` with 1 and 2 workers against the `tokenizers` library's own `encode_batch` (one
  thread: the per-core ceiling), interleaved in rounds; tokens per wall second and per CPU second (all processes);
* train: per corpus size, a fresh process builds a run (`small` denoiser, batch 16 × 128 tokens, random windows)
  on the shards and trains a few steps: start-up (imports, data, model), peak RSS (VmHWM), anonymous RSS, and the
  share of the step spent in `get_batch`. With `--compare-inmemory`, the same for the in-memory `bpe` kind
  (which tokenises at start-up) on the smaller corpora.

    .venv/bin/python benchmarks/bench_data.py --sizes 10,100,1000 --out benchmarks/results/bench_data.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import resource
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = next((p for p in (ROOT.parent / "shared", ROOT.parent.parent / "shared") if p.is_dir()), ROOT.parent / "shared") / "data"
GPT2 = SHARED / "gpt2_bpe"
PY = sys.executable
TCSM = [PY, "-m", "tcsm.cli"]


def _lines(name: str) -> list[str]:
    with gzip.open(SHARED / name, "rt", encoding="utf-8") as f:
        return f.read().split("\n")


def shared_documents() -> list[str]:
    docs = []
    for name in ("imdb/imdb_train.jsonl.gz", "imdb/imdb_test.jsonl.gz", "lambada/lambada_test.jsonl.gz"):
        docs += [json.loads(line)["text"] for line in _lines(name) if line.strip()]
    with gzip.open(SHARED / "tinystories/train_head_2MiB.txt.gz", "rt", encoding="utf-8") as f:
        docs += [d.strip() for d in f.read().split("<|endoftext|>") if d.strip()]
    with gzip.open(SHARED / "wikitext2/wiki.test.raw.gz", "rt", encoding="utf-8") as f:
        docs += [d.strip() for d in f.read().split("\n \n") if d.strip()]
    for name in ("lm1b/lm1b_heldout_subset.dev.txt.gz", "lm1b/lm1b_heldout_subset.test.txt.gz",
                 "ptb/ptb.valid.txt.gz", "ptb/ptb.test.txt.gz"):  # fmt: skip
        lines = [x.strip() for x in _lines(name) if x.strip()]
        docs += [" ".join(lines[i : i + 20]) for i in range(0, len(lines), 20)]  # 20 sentences per document
    with gzip.open(SHARED / "shakespeare/tinyshakespeare.txt.gz", "rt", encoding="utf-8") as f:
        docs.append(f.read())
    with gzip.open(SHARED / "text8/text8_prefix.txt.gz", "rt", encoding="utf-8") as f:
        text8 = f.read()
    docs += [text8[i : i + 10_000] for i in range(0, len(text8), 10_000)]
    random.Random(0).shuffle(docs)
    return docs


def write_corpus(path: Path, mb: int, docs: list[str]) -> dict:
    """JSONL of `mb` MB of text (bytes of the documents' UTF-8), repeating the document list if needed."""
    target, written, passes = mb * 1_000_000, 0, 0
    if path.is_file() and path.with_suffix(".json").is_file():
        return json.loads(path.with_suffix(".json").read_text())
    with open(path, "w", encoding="utf-8") as f:
        while written < target:
            passes += 1
            for d in docs:
                f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
                written += len(d.encode("utf-8"))
                if written >= target:
                    break
    info = {"mb": mb, "text_bytes": written, "passes": passes, "file_bytes": path.stat().st_size}
    path.with_suffix(".json").write_text(json.dumps(info))
    return info


def run_measured(cmd: list[str], env=None) -> dict:
    """Wall and CPU seconds (the process and every descendant it reaped) of a command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "stdout": proc.stdout[-2000:], "load": os.getloadavg()[0]}


LIBRARY = textwrap.dedent(
    """
    import json, os, sys, time
    os.environ["RAYON_NUM_THREADS"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    from tcsm.data.bpe import gpt2_tokenizer
    tok = gpt2_tokenizer(sys.argv[2])
    docs = [json.loads(l)["text"] for l in open(sys.argv[1], encoding="utf-8")]
    t0, c0 = time.perf_counter(), time.process_time()
    n = 0
    for i in range(0, len(docs), 256):
        n += sum(len(e.ids) + 1 for e in tok.hf.encode_batch(docs[i : i + 256]))
    print(json.dumps({"tokens": n, "encode_wall_s": time.perf_counter() - t0, "encode_cpu_s": time.process_time() - c0}))
    """
)


def throughput(corpus: Path, work: Path, rounds: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    results: dict[str, list] = {"library_encode_batch_1thread": [], "prepare_w1": [], "prepare_w2": []}
    for r in range(rounds):
        for name, rows in results.items():
            if name.startswith("library"):
                m = run_measured([PY, "-c", LIBRARY, str(corpus), str(GPT2)], env)
                m.update(json.loads(m.pop("stdout").strip().splitlines()[-1]))
            else:
                w = int(name[-1])
                out = work / f"tp-w{w}"
                m = run_measured([*TCSM, "prepare", str(corpus), "-o", str(out), "--tokenizer", f"gpt2:{GPT2}",
                                  "--workers", str(w), "--no-progress", "--overwrite"], env)  # fmt: skip
                m.pop("stdout")
                index = json.loads((out / "index.json").read_text())
                m.update(tokens=index["tokens"], prepare_inner_s=index["seconds"])
            m["round"] = r
            rows.append(m)
            print(name, {k: round(v, 3) if isinstance(v, float) else v for k, v in m.items()}, flush=True)
    return results


PROBE = textwrap.dedent(
    """
    import json, os, sys, time
    t_start = time.perf_counter()
    import torch
    torch.set_num_threads(1)
    import tcsm.builders.components as comp
    from tcsm.builders.config import load_config
    from tcsm.train.trainer import Trainer
    t_imported = time.perf_counter()
    timing = {"data_s": 0.0, "batch_s": 0.0, "batches": 0}
    build = comp.build_data
    def timed_build(cfg):
        t = time.perf_counter(); out = build(cfg); timing["data_s"] += time.perf_counter() - t
        get = out.get_batch
        def timed_get(*a, **k):
            t = time.perf_counter(); x = get(*a, **k); timing["batch_s"] += time.perf_counter() - t
            timing["batches"] += 1
            return x
        out.get_batch = timed_get
        return out
    comp.build_data = timed_build
    cfg = load_config("text8-prefix-small", sys.argv[1:])
    trainer = Trainer.from_config(cfg, None, log=lambda s: None)
    t_built = time.perf_counter()
    def status():
        fields = dict(l.split(":", 1) for l in open("/proc/self/status") if ":" in l)
        return {k: int(fields[k].split()[0]) / 1024 for k in ("VmHWM", "VmRSS", "RssAnon", "RssFile")}
    at_start = status()
    c0, t0 = time.process_time(), time.perf_counter()
    trainer.fit()
    fit_s, fit_cpu = time.perf_counter() - t0, time.process_time() - c0
    print(json.dumps({"import_s": t_imported - t_start, "build_s": t_built - t_imported, **timing,
                      "fit_s": fit_s, "fit_cpu_s": fit_cpu, "mb_after_build": at_start, "mb_end": status(),
                      "steps": cfg.train.steps, "load": os.getloadavg()[0]}))
    """
)

TRAIN = ["model.preset=small", "data.seq_len=128", "model.max_len=128", "train.batch_size=16", "train.steps={steps}",
         "train.threads=1", "train.precision=fp32", "train.eval_every=0", "train.sample_every=0", "train.save_every=0",
         "train.progress=false", "train.tensorboard=false", "sample.num=0", "optim.warmup=2", "train.ema=0"]  # fmt: skip


def probe(data_args: list[str], steps: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    args = [a.format(steps=steps) for a in TRAIN] + data_args
    m = run_measured([PY, "-c", PROBE, *args], env)
    m.update(json.loads(m.pop("stdout").strip().splitlines()[-1]))
    m["data_share"] = m["batch_s"] / m["fit_s"]
    return m


def loader(shards: Path, rounds: int, calls: int = 100) -> dict:
    """ms (wall and CPU) per `get_batch` of B × L random rows from the shards, for the CPU benchmark batch and the
    GPU one (docs/benchmarks.md: the `small` step on an H100 is batch 128 × 256), interleaved in rounds."""
    import torch

    from tcsm.data import EpochBatches, build_data

    torch.set_num_threads(1)
    shapes = [(16, 128, "random"), (128, 256, "random"), (128, 256, "chunks")]
    bundles = {(L, w): build_data({"kind": "shards", "path": str(shards), "seq_len": L, "windows": w})
               for _, L, w in shapes}  # fmt: skip
    out: dict[str, list] = {f"B{B}xL{L}-{w}": [] for B, L, w in shapes}
    for _ in range(rounds):
        for B, L, w in shapes:
            bundle = bundles[(L, w)]
            order = EpochBatches(len(bundle.train), B, seed=0)
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(calls):
                bundle.get_batch("train", next(order))
            out[f"B{B}xL{L}-{w}"].append(
                {"wall_ms": 1e3 * (time.perf_counter() - t0) / calls, "cpu_ms": 1e3 * (time.process_time() - c0) / calls,
                 "load": os.getloadavg()[0]})  # fmt: skip
    return out


def repeat_shards(src: Path, dst: Path, times: int) -> dict:
    """A shard folder whose training split is `src`'s repeated `times` times (valid/test and tokenizer copied),
    written by tcsm's own shard writer, index last: a large corpus without tokenising it again."""
    import shutil

    import numpy as np

    from tcsm.data.prepare import _ShardWriter
    from tcsm.data.shards import read_index

    index = read_index(src)
    if (dst / "index.json").is_file():
        return json.loads((dst / "index.json").read_text())
    dst.mkdir(parents=True, exist_ok=True)
    writer = _ShardWriter(dst, "train", np.dtype(index["dtype"]), 1 << 28)
    for _ in range(times):
        for shard in index["splits"]["train"]["shards"]:
            writer.write(np.fromfile(src / shard["file"], dtype=index["dtype"]))
    train = writer.finish()
    train["documents"] = index["splits"]["train"]["documents"] * times
    for split in ("valid", "test"):
        for shard in index["splits"][split]["shards"]:
            shutil.copyfile(src / shard["file"], dst / shard["file"])
    shutil.copytree(src / "tokenizer", dst / "tokenizer", dirs_exist_ok=True)
    index["splits"]["train"] = train
    index["tokens"] = sum(index["splits"][s]["tokens"] for s in ("train", "valid", "test"))
    index["command"] = f"benchmarks/bench_data.py: the training split of {src.name} repeated {times} times"
    (dst / "index.json.tmp").write_text(json.dumps(index, indent=1))
    os.replace(dst / "index.json.tmp", dst / "index.json")
    return index


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10,100,1000", help="corpus sizes in MB of text")
    ap.add_argument("--work", default=str(ROOT / "runs" / "bench" / "data"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_data.json"))
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds of the throughput comparison")
    ap.add_argument("--steps", type=int, default=8, help="training steps of each probe")
    ap.add_argument("--workers", type=int, default=2, help="workers that prepare the corpora of the train probes")
    ap.add_argument("--compare-inmemory", default="10,100", help="sizes also run with the in-memory bpe kind")
    ap.add_argument("--repeat", default="", help="SRC_MB:TIMES: also probe shards of SRC_MB's tokens repeated TIMES times")
    ap.add_argument("--loader", default="", help="shard folder (under --work) to time get_batch on")
    ap.add_argument("--skip", default="", help="comma list of stages to skip: throughput,train")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    out = Path(args.out)
    result = json.loads(out.read_text()) if out.is_file() else {}
    result["machine"] = {"cpus": os.cpu_count(), "load_start": os.getloadavg()}
    docs = shared_documents()
    sizes = [int(s) for s in args.sizes.split(",")]
    corpora = {mb: work / f"corpus-{mb}MB.jsonl" for mb in sizes}
    result["corpora"] = {str(mb): write_corpus(p, mb, docs) for mb, p in corpora.items()}

    def save():
        out.write_text(json.dumps(result, indent=1))

    if "throughput" not in args.skip:
        result["throughput"] = throughput(corpora[sizes[0]], work, args.rounds)
        save()
    if "train" not in args.skip:
        result.setdefault("train", {})
        for mb in sizes:
            shards = work / f"shards-{mb}MB"
            if not (shards / "index.json").is_file():
                env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
                m = run_measured([*TCSM, "prepare", str(corpora[mb]), "-o", str(shards), "--tokenizer", f"gpt2:{GPT2}",
                                  "--workers", str(args.workers), "--no-progress"], env)  # fmt: skip
                m.pop("stdout")
                index = json.loads((shards / "index.json").read_text())
                m.update(tokens=index["tokens"], shard_bytes=sum(p.stat().st_size for p in shards.glob("*.bin")))
                result["train"][f"prepare-{mb}MB"] = m
                save()
            r = probe(["data.kind=shards", f"data.path={shards}", "data.windows=random"], args.steps)
            result["train"][f"shards-{mb}MB"] = r
            print(f"shards {mb}MB", {k: v for k, v in r.items() if k != "stdout"}, flush=True)
            save()
            if str(mb) in args.compare_inmemory.split(","):
                r = probe(["data.kind=bpe", f"data.path={corpora[mb]}", "data.tokenizer=gpt2", f"data.bpe_dir={GPT2}"],
                          args.steps)  # fmt: skip
                result["train"][f"bpe-inmemory-{mb}MB"] = r
                print(f"bpe in memory {mb}MB", r, flush=True)
                save()
    if args.loader:
        result["loader"] = loader(work / args.loader, args.rounds)
        print("loader", result["loader"], flush=True)
        save()
    if args.repeat:
        mb, times = (int(x) for x in args.repeat.split(":"))
        dst = work / f"shards-{mb}MBx{times}"
        t0 = time.perf_counter()
        index = repeat_shards(work / f"shards-{mb}MB", dst, times)
        result.setdefault("train", {})[f"repeat-{mb}MBx{times}"] = {"tokens": index["tokens"], "wall_s": time.perf_counter() - t0}
        r = probe(["data.kind=shards", f"data.path={dst}", "data.windows=random"], args.steps)
        result["train"][f"shards-{mb}MBx{times}"] = r
        print(f"shards {mb}MB x{times}", r, flush=True)
        save()
    result["machine"]["load_end"] = os.getloadavg()
    save()


if __name__ == "__main__":
    main()
