"""What the schema's types cannot say: ranges, choices and cross-key rules of the fixed sections, and OmegaConf's
errors turned into one line that names the key (`unknown config key 'model.n_layerz' (did you mean ...)`)."""

from __future__ import annotations

from omegaconf import DictConfig
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from tcsm.builders.presets import first_line
from tcsm.core.errors import ConfigError

__all__ = ["friendly", "validate"]


def friendly(e: OmegaConfBaseException) -> str:
    key = getattr(e, "full_key", None) or ""
    msg = first_line(e)
    if isinstance(e, ConfigKeyError):
        hint = ""
        if "Did you mean" in str(e):
            hint = (
                " (did you mean "
                + str(e).split("Did you mean", 1)[1].split("\n")[0].strip(" :?")
                + "?)"
            )
        return f"unknown config key {key!r}{hint}; `tcsm train --help` lists the keys"
    if isinstance(e, ValidationError):
        return f"config key {key!r}: {msg}"
    return f"invalid config{(' at ' + repr(key)) if key else ''}: {msg}"


def _check(ok: bool, msg: str) -> None:
    if not ok:
        raise ConfigError(msg)


def validate(cfg: DictConfig) -> None:
    """Checks the schema's types cannot express."""
    from tcsm.paths import PATHS, SCHEDULES

    t, o = cfg.train, cfg.optim
    _check(cfg.path.source in PATHS, f"path.source must be one of {sorted(PATHS)}, got {cfg.path.source!r}")
    _check(
        cfg.path.schedule in SCHEDULES,
        f"path.schedule must be one of {sorted(SCHEDULES)}, got {cfg.path.schedule!r}",
    )
    bl = cfg.path.get("block_length")
    _check(bl is None or bl >= 1, f"path.block_length must be >= 1 or null, got {bl}")
    # train.steps=0 writes the model as built (a pretrained directory imported as a run) and trains nothing.
    _check(t.steps >= 0, f"train.steps must be >= 0, got {t.steps}")
    for key in ("batch_size", "log_every"):
        _check(t[key] >= 1, f"train.{key} must be >= 1, got {t[key]}")
    for key in ("eval_every", "sample_every", "save_every", "keep_last", "eval_examples"):
        _check(t[key] >= 0, f"train.{key} must be >= 0, got {t[key]}")
    _check(
        t.micro_batch is None or t.micro_batch >= 1, f"train.micro_batch must be >= 1, got {t.micro_batch}"
    )
    _check(
        t.micro_batch is None or t.batch_size % t.micro_batch == 0,
        f"train.batch_size={t.batch_size} must be a multiple of train.micro_batch={t.micro_batch}",
    )
    _check(
        t.precision in ("fp32", "bf16", "auto"),
        f"train.precision must be fp32 | bf16 | auto, got {t.precision!r}",
    )
    dev = t.device
    _check(
        dev in ("auto", "cpu", "cuda") or (dev.startswith("cuda:") and dev[5:].isdigit()),
        f"train.device must be auto | cpu | cuda | cuda:N, got {dev!r}",
    )
    _check(0.0 <= t.ema < 1.0, f"train.ema must be in [0, 1), got {t.ema}")
    _check(
        t.init_weights in ("ema", "model"), f"train.init_weights must be ema | model, got {t.init_weights!r}"
    )
    _check(o.lr > 0, f"optim.lr must be > 0, got {o.lr}")
    _check(
        len(o.betas) == 2 and all(0 <= b < 1 for b in o.betas),
        f"optim.betas must be two numbers in [0, 1), got {list(o.betas)}",
    )
    _check(o.warmup >= 0, f"optim.warmup must be >= 0, got {o.warmup}")
    _check(
        o.decay in ("cosine", "linear", "constant"),
        f"optim.decay must be cosine | linear | constant, got {o.decay!r}",
    )
    _check(0.0 <= o.min_lr_ratio <= 1.0, f"optim.min_lr_ratio must be in [0, 1], got {o.min_lr_ratio}")
    _check(o.clip >= 0, f"optim.clip must be >= 0, got {o.clip}")
    _check(
        cfg.eval.split in ("train", "valid", "test"),
        f"eval.split must be train | valid | test, got {cfg.eval.split!r}",
    )
    _check(cfg.eval.num_t >= 1 and cfg.eval.batch_size >= 1, "eval.num_t and eval.batch_size must be >= 1")
    _check(
        cfg.eval.max_examples is None or cfg.eval.max_examples >= 1,
        f"eval.max_examples must be >= 1 or null (the whole split), got {cfg.eval.max_examples}",
    )
    lora = t.get("lora")
    if lora is not None:
        _check(lora.r >= 0, f"train.lora.r must be >= 0 (0: no adapters, all weights train), got {lora.r}")
        _check(lora.alpha > 0, f"train.lora.alpha must be > 0, got {lora.alpha}")
        _check(
            lora.r > 0 or not lora.target_modules,
            f"train.lora.r=0 trains all weights, yet train.lora.target_modules={list(lora.target_modules or [])} "
            "names layers to adapt: give a rank train.lora.r >= 1, or drop target_modules",
        )
    _check(cfg.sample.num >= 0, f"sample.num must be >= 0, got {cfg.sample.num}")
    from tcsm.sampling.settings import sample_settings

    sample_settings(cfg.sample)  # every registered sampler checks its keys (ConfigError, one line)
