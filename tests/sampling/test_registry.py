"""Samplers own their settings (MATH.md §6): one registry of sampler classes, each with its own settings dataclass;
the run's `sample:` section (its schema derived from the registry) is the one way to choose, and every caller
outside the sampling package draws through `sampling.settings.draw`."""

from __future__ import annotations

import ast
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from train_helpers import restore_torch_threads  # noqa: F401

from tcsm.builders.config import load_config
from tcsm.builders.schema import SampleConfig
from tcsm.core.errors import ConfigError
from tcsm.paths import MaskedPath, UniformPath
from tcsm.sampling import registry
from tcsm.sampling.decoding import decode
from tcsm.sampling.registry import Sampler, SamplerSettings, register_sampler, sampler_class, sampler_names
from tcsm.sampling.samplers import sample
from tcsm.sampling.settings import SampleSettings, draw, make_sampler, sample_settings, section_fields

SRC = Path(__file__).resolve().parents[2] / "src" / "tcsm"
V, L = 5, 6


class _Logits(torch.nn.Module):
    """A fixed random denoiser that depends on x_t (so a wrong draw order shows) and ignores t."""

    time_independent = True

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.table = torch.nn.Parameter(torch.randn(V + 1, L, V, generator=g))

    def forward(self, xt, t):
        return self.table[xt, torch.arange(xt.shape[1])] + 0.1 * self.table[xt.roll(1, -1), torch.arange(xt.shape[1])]


def test_the_names_come_from_the_registry_everywhere(capsys):
    names = sampler_names()
    assert names == ("ancestral", "analytic", "euler", "joint", "random", "confidence", "margin", "entropy",
                     "threshold", "native", "speculative")  # fmt: skip
    with pytest.raises(ConfigError, match=r"^sample\.method must be one of \[.*'speculative'\], got 'bogus'$"):
        load_config("synthetic", ["sample.method=bogus"])
    from tcsm.cli import main

    with pytest.raises(SystemExit):
        main(["sample", "--help"])
    assert " | ".join(names) in " ".join(capsys.readouterr().out.split())


def test_every_sampler_declares_its_settings_and_they_make_the_section():
    section = {f.name for f in dataclasses.fields(SampleSettings)}
    schema = {f.name for f in dataclasses.fields(SampleConfig)}
    for cls in registry.all_sampler_classes():
        own = {f.name for f in dataclasses.fields(cls.settings_type)}
        assert issubclass(cls.settings_type, registry.Settings) and own <= section <= schema, cls
        assert all(f.metadata.get("help") for f in dataclasses.fields(cls.settings_type)), cls
    # a key only one sampler uses is that sampler's, not every sampler's
    assert "threshold" in {f.name for f in dataclasses.fields(sampler_class("threshold").settings_type)}
    assert "threshold" not in {f.name for f in dataclasses.fields(sampler_class("confidence").settings_type)}
    assert "sir_k" not in {f.name for f in dataclasses.fields(sampler_class("euler").settings_type)}


def test_a_new_sampler_is_one_class_and_its_keys_reach_the_section():
    @dataclass(frozen=True)
    class GreedySettings(SamplerSettings):
        greediness: float = field(default=0.5, metadata={"help": "how greedy"})

    @register_sampler
    class Greedy(Sampler):
        name = "greedy"
        settings_type = GreedySettings

        def __call__(self, model, path, num, length, **kw):
            return torch.zeros(num, length, dtype=torch.long), self.settings.greediness

    try:
        assert "greedy" in sampler_names() and "greediness" in {f.name for f in section_fields()}
        from tcsm.sampling import settings as section_module

        section = section_module._section_type()(method="greedy", greediness=0.9)
        x, stats = draw(None, None, 2, 3, section)
        assert x.shape == (2, 3) and stats == 0.9
    finally:
        registry.SAMPLERS.pop("greedy", None)


@pytest.mark.parametrize("method", ["ancestral", "analytic", "euler"])
@pytest.mark.parametrize("source", ["masked", "uniform"])
def test_path_samplers_draw_what_the_sampling_function_draws(method, source, one_thread):
    model, path = _Logits(), (MaskedPath(V) if source == "masked" else UniformPath(V))
    settings = SampleSettings(method=method, steps=5, temperature=0.8, top_p=0.9, grid="cosine")
    x, stats = draw(model, path, 7, L, settings, generator=torch.Generator().manual_seed(3))
    ref, ref_stats = sample(model, path, batch_size=7, length=L, num_steps=5, method=method, grid="cosine",
                            temperature=0.8, top_p=0.9, generator=torch.Generator().manual_seed(3),
                            return_stats=True)  # fmt: skip
    assert torch.equal(x, ref) and stats.method == ref_stats.method and stats.num_calls == ref_stats.num_calls


@pytest.mark.parametrize("method", ["random", "confidence", "margin", "entropy", "threshold"])
@pytest.mark.parametrize("block", [None, 3])
def test_decoding_orders_draw_what_decode_draws(method, block, one_thread):
    model, path = _Logits(), MaskedPath(V)
    settings = SampleSettings(method=method, steps=4, semi_ar_block=block, threshold=0.3)
    x, stats = draw(model, path, 5, L, settings, generator=torch.Generator().manual_seed(1))
    ref, ref_stats = decode(model, path, batch_size=5, length=L, num_steps=4, method=method, block_length=block,
                            threshold=0.3, time_independent=True, generator=torch.Generator().manual_seed(1))
    assert torch.equal(x, ref) and stats.num_calls == ref_stats.num_calls


def test_the_section_validates_every_samplers_keys_in_one_line():
    for bad, message in [({"steps": 0}, "steps must be >= 1"), ({"threshold": 1.5}, "threshold must be in"),
                         ({"sir_k": 0}, "sir_k must be >= 1"), ({"semi_ar_block": 0}, "semi_ar_block must be")]:
        with pytest.raises(ValueError, match=message):
            SampleSettings(**bad)
    assert make_sampler(SampleSettings()).name == "ancestral"  # method null: the cached reveal / analytic bridge


def test_a_prompt_is_pinned_by_draw(one_thread):
    model, path = _Logits(), MaskedPath(V)
    prompt = torch.tensor([1, 2])
    x, _ = draw(model, path, 4, L, SampleSettings(steps=3), prompt=prompt, generator=torch.Generator().manual_seed(0))
    assert (x[:, :2] == prompt).all()


#: modules that may call the sampling functions directly: the sampling package itself, and math that samples as
#: part of a training target (the reward target's sample pool, the on-policy distillation proposal)
DIRECT_OK = {"sampling", "posttrain/reward/targets.py", "posttrain/distill/target.py"}


def test_callers_outside_sampling_go_through_draw():
    offenders = []
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).as_posix()
        if rel.split("/")[0] in DIRECT_OK or rel in DIRECT_OK or rel.startswith("models/hf_remote"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module in ("tcsm.sampling", "tcsm.sampling.samplers",
                                                                    "tcsm.sampling.decoding"):  # fmt: skip
                names = {a.name for a in node.names} & {"sample", "decode"}
                if names:
                    offenders.append(f"{rel}:{node.lineno} imports {sorted(names)}")
    assert not offenders, offenders


def test_tcsm_sample_method_choices_are_the_registry():
    import argparse

    from tcsm.cli import sample as sample_cli

    p = argparse.ArgumentParser()
    sample_cli.add_arguments(p)
    (action,) = [a for a in p._actions if "--method" in a.option_strings]
    assert tuple(action.choices) == sampler_names()


def test_unknown_method_is_one_line_listing_the_registry():
    with pytest.raises(ConfigError) as e:
        sample_settings({"method": "gibbs"})
    message = str(e.value)
    assert "\n" not in message and message.startswith("sample.method must be one of")
    assert all(repr(n) in message for n in sampler_names())


@pytest.mark.parametrize("method", sampler_names())
def test_every_registered_sampler_builds_from_a_config_section(method):
    cfg = load_config("synthetic", [f"sample.method={method}", "sample.steps=7"])
    sampler = make_sampler(sample_settings(cfg.sample))
    assert type(sampler) is sampler_class(method) and sampler.settings.steps == 7
    assert set(vars(sampler.settings)) == {f.name for f in dataclasses.fields(sampler_class(method).settings_type)}
    # a caller's explicit override (a report's step count) wins over the section; None keeps the section's value
    assert sample_settings(cfg.sample, steps=3, grid=None).steps == 3


def test_joint_draws_what_the_sampling_function_draws_with_the_models_x1_sampler(one_thread):
    from tcsm.evaluation.exact import EnumerableDistribution

    dist, path = EnumerableDistribution.random(3, 3, seed=0), MaskedPath(3)
    x, stats = draw(dist, path, 6, 3, SampleSettings(method="joint", steps=4, grid="cosine"),
                    generator=torch.Generator().manual_seed(2))  # fmt: skip
    ref, ref_stats = sample(None, path, batch_size=6, length=3, num_steps=4, method="joint", grid="cosine",
                            x1_sampler=dist.x1_sampler(path), generator=torch.Generator().manual_seed(2),
                            return_stats=True)  # fmt: skip
    assert torch.equal(x, ref) and stats.num_calls == ref_stats.num_calls
    with pytest.raises(ConfigError, match="^method joint needs a model that draws x̂_1 jointly"):
        draw(_Logits(), path, 2, L, SampleSettings(method="joint", steps=2))


def test_sir_reports_the_one_sampling_stats_type(one_thread):
    from tcsm.posttrain.dre.sir import sample_sir
    from tcsm.sampling import SamplingStats

    model, path = _Logits(), MaskedPath(V)
    _, st = sample_sir(model, lambda x1, xt, t: x1.float().sum(-1), path, batch_size=3, length=L, num_steps=4,
                       window=(0.0, 1.0), generator=torch.Generator().manual_seed(0), return_stats=True)  # fmt: skip
    assert isinstance(st, SamplingStats) and st.method == "sir" and st.counts["sir_steps"] == 4
    assert st.num_calls >= 1 and st.num_rows == int(st.row_calls.sum()) and st.counts["energy_rows"] == 2 * st.num_rows




class _SIRObjective:
    """An objective that brings its own sampler (`Samples`): SIR with a fixed energy over the given reference."""

    sampler = "sir"

    def __init__(self, path):
        self.path, self.seen = path, None

    def sample(self, model, num, length, generator=None, device=None, *, settings=None, fixed=None, values=None):
        from tcsm.posttrain.dre.sir import sample_sir

        self.seen = settings
        return sample_sir(model, _energy, self.path, batch_size=num, length=length, num_steps=settings.steps,
                          num_candidates=settings.sir_k, window=settings.sir_window,
                          temperature=settings.sir_temperature, grid=settings.grid, fixed=fixed, values=values,
                          generator=generator, device=device, return_stats=True)  # fmt: skip


def _energy(x1, xt, t):
    return x1.float().sum(-1) / 4


def test_the_objectives_own_sampler_draws_what_sir_draws_with_the_sections_keys(one_thread):
    from tcsm.posttrain.dre.sampler import SIRSettings
    from tcsm.posttrain.dre.sir import sample_sir

    model, path = _Logits(), MaskedPath(V)
    objective = _SIRObjective(path)
    section = sample_settings({"method": "euler", "steps": 6, "sir_k": 3, "sir_window": [0.2, 0.9],
                               "sir_temperature": 0.5, "grid": "cosine"})  # fmt: skip
    x, stats = draw(model, path, 4, L, section, objective=objective, generator=torch.Generator().manual_seed(5))
    assert type(objective.seen) is SIRSettings and objective.seen.sir_window == (0.2, 0.9)  # method is not its key
    ref, ref_stats = sample_sir(model, _energy, path, batch_size=4, length=L, num_steps=6, num_candidates=3,
                                window=(0.2, 0.9), temperature=0.5, grid="cosine",
                                generator=torch.Generator().manual_seed(5), return_stats=True)  # fmt: skip
    assert torch.equal(x, ref) and stats.num_calls == ref_stats.num_calls and stats.counts == ref_stats.counts
