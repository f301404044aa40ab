"""lm-evaluation-harness adapter (optional extra `lmeval`): the model class "tcsm" for `lm_eval`.

    python -m tcsm.cli.lmeval --model tcsm --model_args checkpoint=runs/my-run,num_t=32,method=margin,steps=64 \\
        --tasks my_task --include_path path/to/task_dir --output_path results/

registers the class and hands the rest of the command line to lm-eval's own CLI. Requests run through
`tcsm.evaluation.harness.DiffusionHarness`: `loglikelihood` is the negative of the model's masked bound on
−log p(continuation | context) (a lower bound on the log-likelihood; Monte Carlo with `num_t` stratified times,
seeded per request; the standard errors are kept in `TCSMLM.stderrs`, because lm-eval's interface has no field
for them), `loglikelihood_rolling` the bound over independent windows of the model's length, `generate_until`
any sampler (`method`, `steps`, `semi_ar_block`, `threshold`, `temperature`, `top_p`). Model arguments:
checkpoint (required), num_t (32), seed (0), device (cpu), no_ema (false), and the sampler settings above
(default: the run's `sample:` section).
"""

from __future__ import annotations

import sys

from tcsm.core.errors import ConfigError

__all__ = ["harness_from_checkpoint", "main", "register"]  # and TCSMLM, made on first use (needs lm-eval)


def harness_from_checkpoint(checkpoint: str, *, num_t: int = 32, seed: int = 0, device: str = "cpu",
                            no_ema: bool = False, **sampler):  # fmt: skip
    """(DiffusionHarness, tokenizer) of a masked diffusion run; `sampler`: overrides of its `sample:` settings."""
    from tcsm.builders.loading import load_checkpoint
    from tcsm.cli.sample import load_tokenizer
    from tcsm.evaluation.harness import DiffusionHarness
    from tcsm.models.kinds import kind_of
    from tcsm.sampling.settings import sample_settings

    loaded = load_checkpoint(checkpoint, device=device, ema=not no_ema)
    kind = kind_of(loaded.model)
    path = loaded.build_path()
    # every denoiser on a masked path (model.name=denoiser, hf_denoiser, a plugin's) has logits to bound with
    if path.mask_id is None or not kind.is_denoiser:
        what = kind.description
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
            kw = _model_args(checkpoint, kwargs)
            try:
                harness, tokenizer = harness_from_checkpoint(checkpoint, **kw)
            except ConfigError as e:  # a sampler setting given here, not the run's sample: section
                key = str(e).split(" ", 1)[0].removeprefix("sample.")
                if not str(e).startswith("sample.") or key not in kw:
                    raise
                raise ConfigError(f"model_args {key}: {str(e).split(' ', 1)[1]}") from None
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


#: model_args besides checkpoint and the sampler settings (tcsm.sampling.settings.SampleSettings), with their types
_OWN_ARGS = {"num_t": int, "seed": int, "device": str, "no_ema": bool}
_SCALARS = {"int": int, "float": float, "bool": bool}


def _sampler_type(key: str):
    """int / float / bool for a scalar sampler setting (its declared type, optional or not), else None."""
    from tcsm.sampling.settings import SampleSettings

    f = SampleSettings.__dataclass_fields__.get(key)
    return None if f is None else _SCALARS.get(str(f.type).removesuffix(" | None"))


def _model_args(checkpoint, kwargs: dict) -> dict:
    """The keyword arguments of `harness_from_checkpoint` from lm-eval's model_args (strings, or values lm-eval
    already converted); ConfigError (one line) for a missing checkpoint, an unknown key or a value of the wrong
    type."""
    import difflib
    from dataclasses import fields

    from tcsm.sampling.settings import SampleSettings

    known = ["checkpoint", *_OWN_ARGS, *(f.name for f in fields(SampleSettings))]
    for key in kwargs:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"unknown model_args key {key!r}{hint}; known keys: {', '.join(known)}")
    if checkpoint is None or str(checkpoint).strip() == "":
        raise ConfigError(
            "model_args needs checkpoint=<run directory or export>, e.g. --model_args checkpoint=runs/my-run,num_t=32"
        )
    out: dict = {}
    for key, value in kwargs.items():
        kind = _OWN_ARGS.get(key) or _sampler_type(key)
        if value is None or kind is None or kind is str:
            out[key] = value
        elif kind is bool:
            text = str(value).lower()
            if text not in ("1", "true", "yes", "0", "false", "no"):
                raise ConfigError(f"model_args {key}={value} is not true or false")
            out[key] = text in ("1", "true", "yes")
        else:
            try:
                number = float(value)
                if kind is int and not number.is_integer():
                    raise ValueError
                out[key] = kind(number)
            except (TypeError, ValueError):
                what = "an integer" if kind is int else "a number"
                raise ConfigError(f"model_args {key}={value} is not {what}") from None
    if out.get("num_t") is not None and out["num_t"] < 2:
        raise ConfigError(f"model_args num_t={out['num_t']}: must be >= 2 (a standard error needs two times)")
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
    try:
        register()
        from lm_eval.__main__ import cli_evaluate
    except ImportError as e:
        print(f"tcsm lmeval: error: the lm-eval adapter needs the extra: pip install 'tcsm[lmeval]' ({e})",
              file=sys.stderr)  # fmt: skip
        return 2
    if argv is not None:
        sys.argv = ["lm_eval", *argv]
    import os

    from tcsm.cli import _one_line, _user_errors

    try:
        cli_evaluate()
    except KeyboardInterrupt:
        print("tcsm lmeval: interrupted", file=sys.stderr)
        return 130
    except (*_user_errors(), TypeError) as e:  # every mistake in model_args, tasks or settings: one line
        if os.environ.get("TCSM_TRACEBACK"):
            raise
        text = _one_line(e)
        if text.startswith("Tasks not found"):
            text += " (lm_eval --tasks list shows the known tasks; --include_path DIR adds your own task files)"
        print(f"tcsm lmeval: error: {text}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
