"""lm-evaluation-harness adapter (optional extra `lmeval`): the model class "tcsm" for `lm_eval`.

    python -m tcsm.cli.lmeval --model tcsm --model_args checkpoint=runs/my-run,num_t=32,method=margin,steps=64 \\
        --tasks my_task --include_path path/to/task_dir --output_path results/

registers the class and hands the rest of the command line to lm-eval's own CLI. Requests run through
`tcsm.evaluation.harness.DiffusionHarness`: `loglikelihood` is the negative of the model's masked bound on
−log p(continuation | context) (a lower bound on the log-likelihood; Monte Carlo with `num_t` stratified times,
seeded per request; the standard errors are kept in `TCSMLM.stderrs`, because lm-eval's interface has no field
for them), `loglikelihood_rolling` the bound over independent windows of the model's length, `generate_until`
any sampler (`method`, `steps`, `block_length`, `threshold`, `temperature`, `top_p`). Model arguments:
checkpoint (required), num_t (32), seed (0), device (cpu), no_ema (false), and the sampler settings above
(default: the run's `sample:` section).
"""

from __future__ import annotations

import sys

__all__ = ["harness_from_checkpoint", "main", "register"]  # and TCSMLM, made on first use (needs lm-eval)


def harness_from_checkpoint(checkpoint: str, *, num_t: int = 32, seed: int = 0, device: str = "cpu",
                            no_ema: bool = False, **sampler):  # fmt: skip
    """(DiffusionHarness, tokenizer) of a masked diffusion run; `sampler`: overrides of its `sample:` settings."""
    from tcsm.builders.loading import load_checkpoint
    from tcsm.builders.sampler import sample_settings
    from tcsm.builders.source import NOT_DENOISERS
    from tcsm.cli.sample import load_tokenizer
    from tcsm.evaluation.harness import DiffusionHarness

    loaded = load_checkpoint(checkpoint, device=device, ema=not no_ema)
    family = str(loaded.config.model.get("name", "denoiser"))
    path = loaded.build_path()
    # every denoiser on a masked path (model.name=denoiser, hf_denoiser, a plugin's) has logits to bound with
    if path.mask_id is None or family in NOT_DENOISERS:
        what = NOT_DENOISERS.get(family, f"a {family} model")
        raise ValueError(f"{loaded.directory}: the lm-eval adapter evaluates masked diffusion runs, not "
                         f"{what} on a {path.kind} path")  # fmt: skip
    length = int(getattr(loaded.model.cfg, "max_len", None) or loaded.data_info["seq_len"])
    settings = sample_settings(loaded.config.sample, **sampler)
    h = DiffusionHarness(
        loaded.model, path, length, num_t=int(num_t), settings=settings, seed=int(seed), device=device
    )
    return h, load_tokenizer(loaded)


def _lm_base():
    try:
        from lm_eval.api.model import LM
    except ImportError as e:
        raise ImportError("the lm-eval adapter needs the extra: pip install 'tcsm[lmeval]'") from e
    return LM


class _Adapter:
    """The request handling, separate from lm-eval's base class so that it is testable without lm-eval."""

    def __init__(self, harness=None, tokenizer=None, checkpoint: str | None = None, **kwargs):
        if harness is None:
            if checkpoint is None:
                raise ValueError("model_args needs checkpoint=<run directory>")
            conv = {"num_t": int, "seed": int, "steps": int, "block_length": int, "threshold": float,
                    "temperature": float, "top_p": float}  # fmt: skip
            kw = {k: conv[k](v) if k in conv and v is not None else v for k, v in kwargs.items()}
            if isinstance(kw.get("no_ema"), str):
                kw["no_ema"] = kw["no_ema"].lower() in ("1", "true", "yes")
            harness, tokenizer = harness_from_checkpoint(checkpoint, **kw)
        self.harness, self.tokenizer = harness, tokenizer
        self.stderrs: list[float] = []

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text))

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        out = []
        for i, req in enumerate(requests):
            context, continuation = req.args[:2]
            r = self.harness.loglikelihood(self._encode(context), self._encode(continuation), index=i)
            self.stderrs.append(r.stderr)
            out.append((r.value, r.is_greedy))
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        out = []
        for i, req in enumerate(requests):
            r = self.harness.loglikelihood_rolling(self._encode(req.args[0]), index=i)
            self.stderrs.append(r.stderr)
            out.append(r.value)
        return out

    def generate_until(self, requests, disable_tqdm: bool = False):
        out = []
        for i, req in enumerate(requests):
            context, gen_kwargs = req.args[:2]
            until = gen_kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            n = int(gen_kwargs.get("max_gen_toks", 64))
            text = self.tokenizer.decode(self.harness.generate(self._encode(context), n, index=i))
            cut = min([text.find(s) for s in until if s and s in text], default=len(text))
            out.append(text[:cut])
        return out


_REGISTERED: dict[str, type] = {}


def register() -> type:
    """Register the class "tcsm" with lm-eval (once) and return it."""
    if "tcsm" in _REGISTERED:
        return _REGISTERED["tcsm"]
    from lm_eval.api.registry import register_model

    cls = register_model("tcsm")(type("TCSMLM", (_Adapter, _lm_base()), {"__init__": _init}))
    _REGISTERED["tcsm"] = cls
    return cls


def _init(self, harness=None, tokenizer=None, checkpoint=None, **kwargs):
    _lm_base().__init__(self)
    for k in ("batch_size", "max_batch_size", "device_map"):  # lm-eval's CLI passes these to every model
        kwargs.pop(k, None)
    import torch

    # lm-eval's CLI asks every model for cuda unless told otherwise; without a GPU that means the CPU
    if str(kwargs.get("device") or "cpu").startswith("cuda") and not torch.cuda.is_available():
        kwargs["device"] = "cpu"
    _Adapter.__init__(self, harness, tokenizer, checkpoint, **kwargs)


def __getattr__(name: str):
    if name == "TCSMLM":
        return register()
    raise AttributeError(name)


def main(argv: list[str] | None = None) -> int:
    register()
    try:
        from lm_eval.__main__ import cli_evaluate
    except ImportError as e:
        raise ImportError("the lm-eval adapter needs the extra: pip install 'tcsm[lmeval]'") from e
    if argv is not None:
        sys.argv = ["lm_eval", *argv]
    cli_evaluate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
