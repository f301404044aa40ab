"""AR → diffusion distillation builders (MATH.md §5.4): `target.name: distill` — an AR teacher (a tcsm causal-LM
run or a local Hugging Face causal-LM directory), its candidate estimator and the proposal h.

Before any teacher weight is loaded the builder refuses, in one line, (1) a teacher whose vocabulary or
tokenizer is not the student's data's — it says whether the sizes, the token ids or the tokenizer files (BPE
merges) differ — and (2) a teacher that would not fit: weights plus the working memory of scoring
`target.max_tokens` tokens at a time, against the memory available on the run's device (or
`target.memory_budget_gb`).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tcsm.builders.registry import TARGETS, BuildContext, ReferenceUse
from tcsm.core.errors import CheckpointError, ConfigError
from tcsm.targets.ar import AR_ESTIMATORS, estimator_options

__all__ = [
    "DistillTargetConfig",
    "TeacherSpec",
    "available_memory",
    "check_teacher_fits",
    "check_teacher_vocabulary",
    "inspect_teacher",
    "load_distill_teacher",
]


@dataclass
class DistillTargetConfig:
    """The teacher is the run's frozen model, `reference.path`: a tcsm causal-LM run (tcsm train -c causal-lm)
    or a Hugging Face causal-LM directory."""

    name: str = "distill"
    estimator: str = field(
        default="topk_ngram",
        metadata={"help": "exact | topk | topk_ngram | taylor (MATH.md §5.4)",
                  "choices": ("exact", "topk", "topk_ngram", "taylor")},
    )
    k: int = field(default=8, metadata={"help": "topk / topk_ngram: the teacher's candidates per position"})
    ngram_order: int = field(
        default=3, metadata={"help": "topk_ngram: N of the right-context n-gram p(x^i | x^{i+1:i+N−1})"}
    )
    ngram_k: int | None = field(default=None, metadata={"help": "topk_ngram: the n-gram's candidates (null: k)"})
    temperature: float = field(default=1.0, metadata={"help": "taylor: ℓ is divided by this"})
    max_tokens: int = field(default=1 << 16, metadata={"help": "tokens per teacher pass (memory bound)"})
    proposal: str = field(
        default="data",
        metadata={"help": "x_1 ~ h: data | teacher (no data) | student", "choices": ("data", "teacher", "student")},
    )
    sample_steps: int = field(default=16, metadata={"help": "proposal=student: sampler steps per draw"})
    audit_rows: int = field(
        default=0, metadata={"help": "sequences per step scored exactly to report missed mass (0: none)"}
    )
    bos_token_id: int | None = field(
        default=None, metadata={"help": "HF teacher: BOS id (null: its config's bos_token_id)"}
    )
    memory_budget_gb: float | None = field(
        default=None, metadata={"help": "memory the teacher may use (null: what the device has available)"}
    )
    autocast: bool = field(default=False, metadata={"help": "run the teacher under the trainer's bf16 autocast"})


# --------------------------------------------------------------------------------------------------- teacher


@dataclass
class TeacherSpec:
    """What is known about a teacher before its weights are loaded."""

    kind: str  # "tcsm" | "hf"
    path: Path
    weight_bytes: int
    d_model: int | None
    n_layers: int | None
    n_heads: int | None
    max_len: int | None
    state: dict | None = None  # tcsm: the run's saved state (config, data_info)


_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def _safetensors_header(path: Path) -> dict:
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if not 0 < n < 1 << 30:
            raise CheckpointError(f"{str(path)!r} is not a safetensors file")
        return json.loads(f.read(n))


def _tensor_bytes(header: dict) -> int:
    return sum(
        math.prod(v["shape"]) * _DTYPE_BYTES.get(v["dtype"], 4) for k, v in header.items() if k != "__metadata__"
    )


def _first(d: dict, *keys):
    return next((int(d[k]) for k in keys if isinstance(d.get(k), int)), None)


def inspect_teacher(path: str | os.PathLike, ema: bool = True) -> TeacherSpec:
    """Size and shape of a teacher from its files only: a tcsm run (resolved to its latest checkpoint) or a
    Hugging Face model directory (config.json + weight files)."""
    p = Path(path)
    if (p / "config.json").is_file():
        try:
            cfg = json.loads((p / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise CheckpointError(f"cannot read {str(p / 'config.json')!r}: {e}") from None
        files = sorted(p.glob("*.safetensors"))
        weight = sum(_tensor_bytes(_safetensors_header(f)) for f in files)
        if not files:
            weight = sum(f.stat().st_size for f in p.glob("*.bin"))
        if weight == 0:
            raise CheckpointError(f"Hugging Face directory {str(p)!r} holds no weights (*.safetensors or *.bin)")
        return TeacherSpec(
            "hf", p, weight,
            _first(cfg, "hidden_size", "n_embd", "d_model"),
            _first(cfg, "num_hidden_layers", "n_layer", "num_layers"),
            _first(cfg, "num_attention_heads", "n_head"),
            _first(cfg, "max_position_embeddings", "n_positions", "n_ctx"),
        )  # fmt: skip
    from tcsm.builders.config import load_config
    from tcsm.builders.registry import family_of_name
    from tcsm.models.lm import LM_PRESETS
    from tcsm.storage.checkpoint import read_state, resolve_checkpoint

    try:
        directory = resolve_checkpoint(p)
    except CheckpointError as e:
        raise CheckpointError(
            f"teacher {str(p)!r} is neither a Hugging Face model directory (no config.json) nor a tcsm run ({e})"
        ) from None
    state = read_state(directory)[1]
    if "config" not in state or "data_info" not in state:
        raise CheckpointError(f"{str(directory)!r} holds no run config; it was not written by `tcsm train`")
    model = dict(state["config"].get("model", {}))
    kind = family_of_name(model.get("name"))
    if not kind.is_autoregressive:
        raise CheckpointError(
            f"teacher {str(directory)!r} holds a {model.get('name')!r} model, not a causal LM "
            "(train one with tcsm train -c causal-lm)"
        )
    use = "ema.safetensors" if ema and (directory / "ema.safetensors").is_file() else "model.safetensors"
    header = _safetensors_header(directory / use)
    dims = {**LM_PRESETS.get(model.get("preset"), {}), **{k: v for k, v in model.items() if v is not None}}
    hf_config = Path(str(model.get("name_or_path") or "")) / "config.json"
    if hf_config.is_file():  # a HF model trained by `tcsm train` (model.name_or_path names its directory)
        hf = inspect_teacher(hf_config.parent)
        dims.update(d_model=hf.d_model, n_layers=hf.n_layers, n_heads=hf.n_heads, max_len=hf.max_len)
    blocks = {k.split(".")[1] for k in header if k.startswith("blocks.")}
    embed = header.get("embed.weight", {}).get("shape")
    load_config(base=state["config"])  # a saved config that no longer validates fails here, in one line
    return TeacherSpec(
        "tcsm", directory, _tensor_bytes(header),
        int(embed[1]) if embed else _first(dims, "d_model"),
        len(blocks) or _first(dims, "n_layers"),
        _first(dims, "n_heads"),
        _first(dims, "max_len"),
        state,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------------- vocabulary


def _fingerprint(tok) -> tuple[dict | None, list | None]:
    """(token → id, BPE merges) of a tokenizer: a CharTokenizer, a tcsm BPETokenizer, a `tokenizers.Tokenizer`
    or a transformers tokenizer; (None, None) when it exposes neither."""
    chars = getattr(tok, "chars", None)
    if isinstance(chars, str):
        return {c: i for i, c in enumerate(chars)}, None
    inner = getattr(tok, "backend_tokenizer", None) or getattr(tok, "hf", None) or tok
    vocab = tok.get_vocab() if hasattr(tok, "get_vocab") else (inner.get_vocab() if hasattr(inner, "get_vocab") else None)
    merges = None
    if hasattr(inner, "to_str"):
        model = json.loads(inner.to_str()).get("model", {})
        if "merges" in model:
            merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return (dict(vocab) if vocab is not None else None), merges


def compare_tokenizers(teacher, student, where: str, sizes: tuple[int, int]) -> None:
    """Raise CheckpointError naming what differs: the vocabulary sizes, the token ids, or the tokenizer files."""
    tv, sv = sizes
    if tv != sv:
        raise CheckpointError(
            f"teacher {where!r} has a {tv}-token vocabulary but the student's data has {sv} tokens: the vocabulary "
            "sizes differ; distill on data tokenized with the teacher's tokenizer"
        )
    (t_vocab, t_merges), (s_vocab, s_merges) = _fingerprint(teacher), _fingerprint(student)
    if t_vocab is None or s_vocab is None:
        return  # nothing but the size to compare (e.g. abstract synthetic ids)
    if t_vocab != s_vocab:
        tok = next((k for k in sorted(s_vocab) if t_vocab.get(k) != s_vocab[k]), None)
        if tok is None:
            tok = next(k for k in sorted(t_vocab) if k not in s_vocab)
        raise CheckpointError(
            f"teacher {where!r} and the student's data both have {tv} tokens but different token ids "
            f"({tok!r} is {t_vocab.get(tok)} in the teacher, {s_vocab.get(tok)} in the data); use the teacher's tokenizer"
        )
    if t_merges is not None and s_merges is not None and t_merges != s_merges:
        n = next((i for i, (a, b) in enumerate(zip(t_merges, s_merges)) if a != b), min(len(t_merges), len(s_merges)))
        raise CheckpointError(
            f"teacher {where!r} and the student's data have the same {tv} token ids but different tokenizer files "
            f"(the BPE merges differ from merge {n} on), so the same text is split differently; use the teacher's tokenizer"
        )


#: data keys that do not change the tokenizer: a student may use other lengths, names or held-out files.
_NOT_TOKENIZER = {"seq_len", "name", "valid_path", "test_path", "num_valid", "num_test", "num_train", "cache_dir", "verify"}


def check_teacher_vocabulary(spec: TeacherSpec, data, data_section: dict) -> None:
    """Refuse a teacher whose vocabulary differs from the student's data (size, ids or tokenizer files)."""
    where = str(spec.path)
    V = int(data.vocab_size)
    if spec.kind == "hf":
        from tcsm.models.hf import import_transformers

        try:
            tok = import_transformers().AutoTokenizer.from_pretrained(str(spec.path), local_files_only=True,
                                                                       trust_remote_code=False)
        except (OSError, ValueError) as e:
            raise CheckpointError(
                f"teacher {where!r} has no usable tokenizer files ({str(e).splitlines()[0][:120]}); save its tokenizer "
                "beside the model so that its token ids can be checked against the data's"
            ) from None
        compare_tokenizers(tok, data.tokenizer, where, (len(tok.get_vocab()), V))
        return
    info, tdata = spec.state["data_info"], dict(spec.state["config"].get("data", {}))
    if int(info["vocab_size"]) != V:
        compare_tokenizers(None, None, where, (int(info["vocab_size"]), V))
    strip = lambda d: {k: v for k, v in d.items() if k not in _NOT_TOKENIZER}
    if strip(tdata) == strip(dict(data_section)):
        return  # the same data config builds the same tokenizer
    if info.get("chars") and isinstance(getattr(data.tokenizer, "chars", None), str):
        from tcsm.data import CharTokenizer

        compare_tokenizers(CharTokenizer(info["chars"]), data.tokenizer, where, (V, V))
        return
    from tcsm.builders.components import build_data

    try:
        teacher_data = build_data(_config(spec.state["config"]))
    except (ValueError, OSError) as e:
        raise CheckpointError(
            f"cannot rebuild the tokenizer of teacher {where!r} from its data config to compare it with the "
            f"student's data ({str(e).splitlines()[0]}); use the teacher's data section"
        ) from None
    compare_tokenizers(teacher_data.tokenizer, data.tokenizer, where, (int(teacher_data.vocab_size), V))


def _config(saved: dict):
    from tcsm.builders.config import load_config

    return load_config(base=saved)


# --------------------------------------------------------------------------------------------------- memory


def available_memory(device) -> int | None:
    """Bytes free on `device`: CUDA's free memory, or the host's MemAvailable (capped by a cgroup limit)."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    avail = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    except OSError:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
        if limit.isdigit():
            avail = min(avail, int(limit) - used) if avail is not None else int(limit) - used
    except (OSError, ValueError):
        pass
    return avail


def teacher_working_memory(spec: TeacherSpec, estimator: str, *, vocab_size: int, seq_len: int, batch: int,
                           max_tokens: int, audit_rows: int = 0, proposal: str = "data") -> int:
    """Bytes the teacher needs besides its weights, float32, for one student micro-batch (an estimate):
    candidate scoring holds ≤ max_tokens positions in flight, each with the sliced key/value past of every layer
    (2·d·layers), one block's working set (≈12·d), attention scores (heads·L) and its logits (3·V); the base
    pass keeps the batch's cache and logits; the exact marginal also materialises [B, L, V] index tensors;
    Taylor back-propagates through the whole batch."""
    V, L, B = int(vocab_size), int(seq_len), int(batch)
    d = spec.d_model or 1024
    n = spec.n_layers or 24
    h = spec.n_heads or max(1, d // 64)
    f = 4  # bytes per float32
    base = f * B * L * (2 * d * n + 2 * V)
    if estimator == "taylor":
        work = 2 * f * B * L * (n * (16 * d + h * L) + 4 * V)
    else:
        work = f * min(max_tokens, 10**12) * (2 * d * n + 12 * d + h * L + 3 * V)
    rows_with_all_v = (B if estimator == "exact" else 0) + (min(audit_rows, B) if audit_rows else 0)
    index = rows_with_all_v * L * V * (8 * 5 + f * 3)
    sampling = f * B * L * 2 * d * n if proposal == "teacher" else 0
    return int(base + work + index + sampling)


def check_teacher_fits(spec: TeacherSpec, work_bytes: int, device, budget_gb: float | None, max_tokens: int) -> None:
    """ConfigError before loading when weights + working memory exceed the budget (loading briefly holds the
    weights twice: the model and the state dict it is copied from)."""
    avail = int(budget_gb * 2**30) if budget_gb is not None else available_memory(device)
    if avail is None:
        return
    need = spec.weight_bytes + max(spec.weight_bytes, work_bytes)
    if need > avail:
        gib = lambda b: b / 2**30
        raise ConfigError(
            f"teacher {str(spec.path)!r} needs about {gib(need):.2f} GiB ({gib(spec.weight_bytes):.2f} GiB of weights, "
            f"{gib(work_bytes):.2f} GiB to score target.max_tokens={max_tokens} tokens at a time) but "
            f"{gib(avail):.2f} GiB is {'allowed' if budget_gb is not None else 'available on ' + str(device)}; "
            "lower target.max_tokens or train.batch_size, or use a smaller teacher or a larger device"
        )


# --------------------------------------------------------------------------------------------------- loading


def load_distill_teacher(spec: TeacherSpec, device, *, vocab_size: int, ema: bool = True, bos_token_id=None):
    """The teacher's causal model (frozen, eval mode) over ids 0..V−1, on `device`."""
    if spec.kind == "hf":
        from tcsm.models.hf import HFCausalLM

        try:
            model = HFCausalLM.from_pretrained(
                str(spec.path), token_ids=list(range(vocab_size)), bos_token_id=bos_token_id, local_files_only=True
            )
        except ValueError as e:
            hint = "; set target.bos_token_id" if "bos_token_id" in str(e) else ""
            raise ConfigError(f"teacher {str(spec.path)!r}: {str(e).splitlines()[0]}{hint}") from None
        except OSError as e:
            raise CheckpointError(f"cannot load teacher {str(spec.path)!r}: {str(e).splitlines()[0]}") from None
        model = model.to(device)
    else:
        from tcsm.builders.frozen import load_frozen

        model = load_frozen(
            spec.path, role="reference.path (the teacher)", families=("causal",), ema=ema, device=device, vocab_size=vocab_size
        ).model
    return model.eval().requires_grad_(False)


def load_checked_teacher(node: dict, ctx: BuildContext):
    """The reference step of a distillation run: the AR teacher named by reference.path (a tcsm causal-LM run or a
    Hugging Face causal-LM directory), checked against the student's data and memory before it is loaded."""
    from omegaconf import OmegaConf

    from tcsm.posttrain.distill.target import PROPOSALS

    ref = ctx.config.reference
    if node["proposal"] not in PROPOSALS:
        raise ConfigError(f"target.proposal must be one of {list(PROPOSALS)}, got {node['proposal']!r}")
    if node["estimator"] not in AR_ESTIMATORS:
        raise ConfigError(f"target.estimator must be one of {sorted(AR_ESTIMATORS)}, got {node['estimator']!r}")
    device = torch.device(ctx.device or "cpu")
    spec = inspect_teacher(ref.path, ema=ref.ema)
    check_teacher_vocabulary(spec, ctx.data, OmegaConf.to_container(ctx.config.data, resolve=True))
    if spec.max_len is not None and spec.max_len < ctx.seq_len:
        raise ConfigError(
            f"teacher {str(spec.path)!r} handles at most {spec.max_len} positions, the student's data has "
            f"sequences of {ctx.seq_len}; shorten data.seq_len"
        )
    t = ctx.config.train
    work = teacher_working_memory(
        spec, node["estimator"], vocab_size=ctx.vocab_size, seq_len=ctx.seq_len,
        batch=t.micro_batch or t.batch_size, max_tokens=node["max_tokens"], audit_rows=node["audit_rows"],
        proposal=node["proposal"],
    )  # fmt: skip
    check_teacher_fits(spec, work, device, node["memory_budget_gb"], node["max_tokens"])
    return load_distill_teacher(spec, device, vocab_size=ctx.vocab_size, ema=ref.ema, bos_token_id=node["bos_token_id"])


def build_distill_target(node: dict, ctx: BuildContext):
    """`target.name: distill`: AR teacher → N^1 target with an estimator and a proposal (MATH.md §5.4)."""
    from tcsm.posttrain.distill.target import DistillTarget
    from tcsm.targets.parametric import ARTeacher

    node = dict(node)
    if ctx.reference is None:
        raise ConfigError("reference.path must name the AR teacher: a tcsm causal-LM run or a HF causal-LM directory")
    # the teacher options the estimator takes (its constructor's, MATH.md §5.4)
    options = {k: node[k] for k in estimator_options(node["estimator"]) if k in node}
    teacher = ARTeacher(ctx.reference, node["estimator"], autocast=node["autocast"], **options)
    # [:] reads memory-mapped shards (data.kind=shards) into one tensor: the n-gram counts every row
    ngram_rows = ctx.data.train[:] if node["estimator"] == "topk_ngram" else None
    return DistillTarget(teacher, node["proposal"], sample_steps=node["sample_steps"], audit_rows=node["audit_rows"],
                         ngram_rows=ngram_rows, ngram_order=node["ngram_order"])  # fmt: skip


TARGETS.register(
    "distill", build_distill_target, schema=DistillTargetConfig, overwrite=True,
    reference=ReferenceUse("reference.path (the teacher)", families=("causal",), load=load_checked_teacher),
    help="AR → diffusion distillation: an AR teacher's N^1 conditionals on data / teacher / student proposals (MATH.md §5.4)",
)  # fmt: skip
