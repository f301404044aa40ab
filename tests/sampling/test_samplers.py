"""Samplers (MATH.md §6) checked against exact enumeration (tcsm.evaluation.exact).

Distribution checks compare the empirical law of N samples with an exact law by total variation. The
tolerance is tv_tol(S, N) = ½√(S/N) + √(ln(10⁶)/(2N)): the first term bounds E[TV] for S states, the second
is McDiarmid's deviation (one sample moves the TV by ≤ 1/N) at probability 10⁻⁶. Seeds are fixed.
"""

from __future__ import annotations

import math

import pytest
import torch

from tcsm.evaluation.exact import EnumerableDistribution
from tcsm.paths import MaskedPath, UniformPath
from tcsm.sampling import (
    SamplingStats,
    adjust_log_probs,
    categorical,
    jump_prob,
    may_cache,
    prefix_condition,
    sample,
    time_grid,
)

PATHS = {"masked": MaskedPath, "uniform": UniformPath}
FACTORIZED = [
    ("masked", "ancestral"),
    ("masked", "euler"),
    ("masked", "analytic"),
    ("uniform", "analytic"),
    ("uniform", "euler"),
]
ALL_METHODS = FACTORIZED + [("masked", "joint"), ("uniform", "joint")]


def tv_tol(num_states: int, n: int) -> float:
    return 0.5 * math.sqrt(num_states / n) + math.sqrt(math.log(1e6) / (2 * n))


def empirical(dist: EnumerableDistribution, x: torch.Tensor) -> torch.Tensor:
    return torch.bincount(dist.index(x), minlength=dist.states.shape[0]).double() / x.shape[0]


def tv(p: torch.Tensor, q: torch.Tensor) -> float:
    return 0.5 * float((p - q).abs().sum())


def product_of_marginals(dist: EnumerableDistribution) -> torch.Tensor:
    """⊗_i p_1(x^i): the law of every one-step factorized sampler (from t = 0 the posterior is p_1)."""
    V, L = dist.vocab_size, dist.length
    marg = torch.stack(
        [
            (torch.nn.functional.one_hot(dist.states[:, i], V).double() * dist.probs[:, None]).sum(0)
            for i in range(L)
        ]
    )  # [L, V]
    return marg[torch.arange(L), dist.states].prod(-1)


def _oracle_time(path, t):
    # Masked source: the posterior does not depend on t in (0, 1) (MATH.md §1.3), but at t = 0 exactly the
    # kernel gives an unmasked (conditioned) token probability 0 and the oracle is undefined; any t > 0 is exact.
    return t.clamp_min(1e-6) if path.mask_id is not None else t


def exact_denoiser(dist: EnumerableDistribution, path):
    """Per-token posterior marginals p_{1|t}(x_1^i | x_t) as logits."""
    base = dist.denoiser(path)
    return lambda xt, t: base(xt, _oracle_time(path, t))


def posterior_x1_sampler(dist: EnumerableDistribution, path):
    """x̂_1 ~ p_{1|t}(· | x_t) jointly, from the exact posterior table (oracle for §6.2 e.a)."""

    def fn(xt, t, generator):
        return dist.states[categorical(dist.log_posterior(xt, _oracle_time(path, t), path), generator)]

    return fn


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def dist():
    # Strongly correlated p_1 on V=3, L=2: one-step factorized sampling is far from it (TV ≈ 0.42).
    return EnumerableDistribution.random(3, 2, seed=0, concentration=0.3)


@pytest.fixture(scope="module")
def dist3():
    return EnumerableDistribution.random(2, 3, seed=1, concentration=0.3)


# --- exactness of the joint-x̂_1 bridge (MATH.md §6.2, oracle e.a) --------------------------------------


@pytest.mark.parametrize("source", ["masked", "uniform"])
@pytest.mark.parametrize("steps", [1, 2, 8])
def test_joint_bridge_is_exact_for_any_step_count(source, steps, dist, dist3):
    n = 20000
    for d in (dist, dist3):
        path = PATHS[source](d.vocab_size)
        x = sample(
            None,
            path,
            batch_size=n,
            length=d.length,
            num_steps=steps,
            seed=steps,
            x1_sampler=posterior_x1_sampler(d, path),
        )
        assert tv(empirical(d, x), d.probs) < tv_tol(d.states.shape[0], n)


# --- factorized samplers converge with the number of steps (§6.1, §6.2, oracle e.b) ---------------------


@pytest.mark.parametrize("source,method", FACTORIZED)
def test_factorized_sampler_converges(source, method, dist):
    n = 10000
    path = PATHS[source](dist.vocab_size)
    tol = tv_tol(dist.states.shape[0], n)
    tvs = {}
    for steps in (1, 4, 64):
        # "ancestral" runs with MDLM's cache: the masked oracle ignores t (MATH.md §1.3).
        x = sample(
            exact_denoiser(dist, path),
            path,
            batch_size=n,
            length=dist.length,
            num_steps=steps,
            method=method,
            seed=10 + steps,
            time_independent=method == "ancestral",
        )
        emp = empirical(dist, x)
        tvs[steps] = tv(emp, dist.probs)
        if steps == 1:
            # One step from t = 0 draws every token from its p_1 marginal, independently.
            assert tv(emp, product_of_marginals(dist)) < tol
    assert tvs[1] > 0.3  # the factorization error this toy is built to show
    assert tvs[1] > tvs[4] + 0.1 and tvs[4] > tvs[64] + 0.05
    assert tvs[64] < tol


@pytest.mark.parametrize("source", ["masked", "uniform"])
def test_cosine_grid_converges(source, dist):
    n = 10000
    path = PATHS[source](dist.vocab_size)
    x = sample(
        exact_denoiser(dist, path),
        path,
        batch_size=n,
        length=dist.length,
        num_steps=48,
        grid="cosine",
        seed=5,
    )
    assert tv(empirical(dist, x), dist.probs) < tv_tol(dist.states.shape[0], n)


def test_time_grid():
    for kind in ("uniform", "cosine"):
        for K in (1, 3, 64):
            g = time_grid(K, kind)
            assert g.dtype == torch.float64 and g.numel() == K + 1
            assert g[0] == 0.0 and g[-1] == 1.0 and (g[1:] > g[:-1]).all()
    assert torch.allclose(time_grid(4), torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0], dtype=torch.float64))
    with pytest.raises(ValueError):
        time_grid(0)
    with pytest.raises(ValueError):
        time_grid(4, "bogus")


def test_custom_grid_must_end_at_one(dist):
    path = MaskedPath(dist.vocab_size)
    den = exact_denoiser(dist, path)
    x = sample(den, path, batch_size=8, length=2, num_steps=3, grid=[0.0, 0.2, 0.9, 1.0], seed=0)
    assert (x < dist.vocab_size).all()
    for bad in ([0.0, 0.5, 0.9], [0.0, 0.6, 0.5, 1.0], [0.0, 0.5, 1.0]):
        with pytest.raises(ValueError):
            sample(den, path, batch_size=8, length=2, num_steps=3, grid=bad, seed=0)


def test_jump_prob_matches_masked_reveal_prob():
    path = MaskedPath(4)
    t, s = torch.tensor([0.0, 0.3, 0.9]), torch.tensor([0.1, 0.5, 1.0])
    torch.testing.assert_close(jump_prob(path, t, s), path.reveal_prob(t, s))
    assert jump_prob(path, torch.tensor([0.4]), torch.tensor([1.0])).item() == 1.0


# --- MDLM caching (§6.2) ---------------------------------------------------------------------------------


class CountingDenoiser:
    """Time-independent wrapper (t is ignored) that counts how often each input row is evaluated."""

    def __init__(self, fn, time_independent=None):
        self.fn = fn
        self.rows = 0
        self.calls = 0
        if time_independent is not None:
            self.time_independent = time_independent

    def __call__(self, xt, t):
        self.calls += 1
        self.rows += xt.shape[0]
        return self.fn(xt, torch.full_like(t, 0.5))


@pytest.mark.parametrize("steps", [2, 8, 64])
def test_cached_and_uncached_masked_samplers_agree(steps, dist3):
    path = MaskedPath(dist3.vocab_size)
    L = dist3.length
    out = {}
    for cached in (False, True):
        den = CountingDenoiser(exact_denoiser(dist3, path))
        x, st = sample(
            den,
            path,
            batch_size=1000,
            length=L,
            num_steps=steps,
            seed=7,
            time_independent=cached,
            return_stats=True,
        )
        assert isinstance(st, SamplingStats) and st.cached == cached
        assert (st.num_calls, st.num_rows) == (den.calls, den.rows)
        assert int(st.row_calls.sum()) == st.num_rows
        out[cached] = (x, st)
    (x0, st0), (x1, st1) = out[False], out[True]
    assert torch.equal(x0, x1)
    # Each evaluated state has ≥ 1 mask and every change reveals ≥ 1 token: ≤ min(K, L) ≤ min(K, L+1) per row.
    assert st1.max_row_calls <= min(steps, L + 1)
    assert st1.num_calls <= steps
    assert st0.num_calls == steps  # without the cache every step calls the network
    if steps > L:
        assert st1.num_rows < st0.num_rows


def test_cache_flag_defaults_to_denoiser_attribute(dist3):
    path = MaskedPath(dist3.vocab_size)
    den = CountingDenoiser(exact_denoiser(dist3, path), time_independent=True)
    _, st = sample(den, path, batch_size=200, length=dist3.length, num_steps=32, seed=0, return_stats=True)
    assert st.cached and int(st.row_calls.max()) <= dist3.length
    _, st = sample(
        den,
        path,
        batch_size=200,
        length=dist3.length,
        num_steps=32,
        seed=0,
        return_stats=True,
        time_independent=False,
    )
    assert not st.cached and st.num_calls == 32


def test_may_cache_needs_a_t_free_posterior_and_a_declaring_denoiser():
    """§1.3, §6.2: the cache is allowed iff the path's posterior ignores t and the denoiser declares it does."""
    from types import SimpleNamespace

    masked, uniform = MaskedPath(3), UniformPath(3)
    declared = SimpleNamespace(time_independent=True)
    by_config = SimpleNamespace(cfg=SimpleNamespace(time_conditioning=False))
    assert may_cache(declared, masked) and may_cache(by_config, masked)
    assert not may_cache(declared, uniform) and not may_cache(by_config, uniform)
    assert not may_cache(SimpleNamespace(time_independent=False, cfg=by_config.cfg), masked)
    assert not may_cache(lambda xt, t: xt, masked) and not may_cache(None, masked)


def test_time_conditioned_denoiser_sees_grid_times(dist):
    path = UniformPath(dist.vocab_size)
    seen = []
    base = exact_denoiser(dist, path)

    def den(xt, t):
        seen.append(t.clone())
        return base(xt, t)

    sample(den, path, batch_size=4, length=2, num_steps=4, seed=0)
    torch.testing.assert_close(
        torch.stack([s[0] for s in seen]).double(), torch.tensor([0.0, 0.25, 0.5, 0.75], dtype=torch.float64)
    )
    assert all(s.shape == (4,) and s.is_floating_point() for s in seen)


# --- conditioning ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("source,method", ALL_METHODS)
def test_conditioning_never_changes_fixed_positions(source, method, dist3):
    path = PATHS[source](dist3.vocab_size)
    B, L, V = 300, dist3.length, dist3.vocab_size
    g = torch.Generator().manual_seed(0)
    kwargs = {"x1_sampler": posterior_x1_sampler(dist3, path)} if method == "joint" else {}
    den = None if method == "joint" else exact_denoiser(dist3, path)
    prompt = torch.randint(0, V, (B, 1), generator=g)
    infill = torch.rand(B, L, generator=g) < 0.4
    infill_values = torch.randint(0, V, (B, L), generator=g)
    for cond in ({"prompt": prompt}, {"fixed": infill, "values": infill_values}):
        fixed, values = prefix_condition(prompt, B, L) if "prompt" in cond else (infill, infill_values)

        def check(k, t, x, fixed=fixed, values=values):
            assert torch.equal(x[fixed], values[fixed]), f"fixed token moved at step {k}"

        for steps in (1, 5):
            x = sample(
                den,
                path,
                batch_size=B,
                length=L,
                num_steps=steps,
                method=method,
                seed=steps,
                callback=check,
                **cond,
                **kwargs,
            )
            assert torch.equal(x[fixed], values[fixed])
            assert ((x >= 0) & (x < V)).all()


def test_masked_infilling_samples_the_conditional(dist3):
    """Masked source + exact joint posterior: fixing x^1 = v gives p_1(· | x^1 = v) exactly."""
    path = MaskedPath(dist3.vocab_size)
    n, v = 20000, 1
    fixed = torch.tensor([False, True, False])
    values = torch.tensor([0, v, 0])
    x = sample(
        None,
        path,
        batch_size=n,
        length=3,
        num_steps=3,
        seed=3,
        fixed=fixed,
        values=values,
        x1_sampler=posterior_x1_sampler(dist3, path),
    )
    cond = torch.where(dist3.states[:, 1] == v, dist3.probs, torch.zeros_like(dist3.probs))
    assert tv(empirical(dist3, x), cond / cond.sum()) < tv_tol(4, n)


def test_prefix_condition_shapes():
    fixed, values = prefix_condition(torch.tensor([3, 4]), 2, 5)
    assert fixed.shape == values.shape == (2, 5)
    assert fixed[:, :2].all() and not fixed[:, 2:].any() and (values[:, :2] == torch.tensor([3, 4])).all()
    with pytest.raises(ValueError):
        prefix_condition(torch.zeros(6, dtype=torch.long), 2, 5)


def test_fixed_values_must_be_clean(dist):
    path = MaskedPath(dist.vocab_size)
    with pytest.raises(ValueError):
        sample(
            exact_denoiser(dist, path),
            path,
            batch_size=2,
            length=2,
            num_steps=2,
            prompt=torch.tensor([path.mask_id]),
        )


# --- temperature, nucleus, argmax ------------------------------------------------------------------------


@pytest.mark.parametrize("source,method", FACTORIZED)
def test_unit_temperature_and_full_nucleus_change_nothing(source, method, dist):
    path = PATHS[source](dist.vocab_size)
    den = exact_denoiser(dist, path)
    a = sample(den, path, batch_size=500, length=2, num_steps=6, method=method, seed=4)
    b = sample(
        den, path, batch_size=500, length=2, num_steps=6, method=method, seed=4, temperature=1.0, top_p=1.0
    )
    assert torch.equal(a, b)
    c = sample(den, path, batch_size=500, length=2, num_steps=6, method=method, seed=4, temperature=0.5)
    assert not torch.equal(a, c)


@pytest.mark.parametrize("source", ["masked", "uniform"])
def test_top_p_removes_the_tail(source, dist3):
    path = PATHS[source](dist3.vocab_size)
    n, top_p = 4000, 0.6
    marg = torch.stack(
        [
            (torch.nn.functional.one_hot(dist3.states[:, i], 2).double() * dist3.probs[:, None]).sum(0)
            for i in range(3)
        ]
    )  # [L, V] p_1 marginals = one-step m at t = 0
    keep = adjust_log_probs(marg.log(), top_p=top_p).isfinite()
    assert (~keep).any(), "the toy must have a tail for this test to mean anything"
    x = sample(exact_denoiser(dist3, path), path, batch_size=n, length=3, num_steps=1, seed=0, top_p=top_p)
    for i in range(3):
        assert keep[i, x[:, i]].all()


def test_adjust_log_probs():
    logits = torch.tensor([[2.0, 1.0, 0.0, -3.0]])
    torch.testing.assert_close(adjust_log_probs(logits), torch.log_softmax(logits.double(), -1))
    p = torch.softmax(logits.double(), -1)[0]  # ≈ [0.66, 0.24, 0.09, 0.003]
    lp = adjust_log_probs(logits, top_p=0.7)  # mass above token 1 is 0.66 < 0.7: keep {0, 1}
    assert lp[0, :2].isfinite().all() and not lp[0, 2:].isfinite().any()
    torch.testing.assert_close(lp[0, :2].exp(), p[:2] / p[:2].sum())
    assert adjust_log_probs(logits, top_p=1e-6)[0].isfinite().sum() == 1  # the top token always stays
    torch.testing.assert_close(
        adjust_log_probs(logits, temperature=2.0), torch.log_softmax(logits.double() / 2, -1)
    )


def test_categorical_matches_probabilities():
    p = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0], dtype=torch.float64)
    n = 20000
    g = torch.Generator().manual_seed(0)
    y = categorical(p.log().expand(n, -1), g)
    assert y.dtype == torch.long and (y != 4).all()
    assert tv(torch.bincount(y, minlength=5).double() / n, p) < tv_tol(4, n)


def test_final_argmax_and_low_temperature(dist):
    for source in ("masked", "uniform"):
        path = PATHS[source](dist.vocab_size)
        den = exact_denoiser(dist, path)
        x = sample(den, path, batch_size=50, length=2, num_steps=1, seed=0, final_argmax=True)
        mode = den(path.prior_sample(1, 2), torch.zeros(1)).argmax(-1)  # at t = 0 the posterior is p_1
        assert (x == mode).all()
        y = sample(den, path, batch_size=50, length=2, num_steps=1, seed=0, temperature=1e-3)
        assert (y == mode).all()


# --- output contract, reproducibility, trajectory, chunking ---------------------------------------------


@pytest.mark.parametrize("source,method", ALL_METHODS)
def test_output_contract_and_reproducibility(source, method, dist3):
    path = PATHS[source](dist3.vocab_size)
    kw = {"batch_size": 64, "length": 3, "num_steps": 7, "method": method}
    if method == "joint":
        kw["x1_sampler"] = posterior_x1_sampler(dist3, path)
    den = exact_denoiser(dist3, path)
    x = sample(den, path, seed=11, **kw)
    assert x.dtype == torch.long and x.shape == (64, 3)
    assert ((x >= 0) & (x < dist3.vocab_size)).all()  # in particular no mask id
    assert torch.equal(x, sample(den, path, generator=torch.Generator().manual_seed(11), **kw))
    assert not torch.equal(x, sample(den, path, seed=12, **kw))


def test_global_generator_is_used_without_seed(dist):
    path = UniformPath(dist.vocab_size)
    den = exact_denoiser(dist, path)
    torch.manual_seed(0)
    a = sample(den, path, batch_size=32, length=2, num_steps=3)
    torch.manual_seed(0)
    assert torch.equal(a, sample(den, path, batch_size=32, length=2, num_steps=3))


def test_trajectory_and_callback(dist3):
    path = MaskedPath(dist3.vocab_size)
    K, B = 10, 200
    seen = []
    x, st = sample(
        exact_denoiser(dist3, path),
        path,
        batch_size=B,
        length=3,
        num_steps=K,
        seed=1,
        return_stats=True,
        record_steps=[0, 5, K],
        callback=lambda k, t, xt: seen.append((k, t)),
        chunk_size=64,
    )
    assert sorted(st.trajectory) == [0, 5, K]
    assert all(v.shape == (B, 3) for v in st.trajectory.values())
    assert (st.trajectory[0] == path.mask_id).all()
    assert torch.equal(st.trajectory[K], x)
    n_mask = [(st.trajectory[k] == path.mask_id).sum(-1) for k in (0, 5, K)]
    assert (n_mask[0] >= n_mask[1]).all() and (n_mask[1] >= n_mask[2]).all() and (n_mask[2] == 0).all()
    # The callback runs per chunk (4 chunks of ≤ 64 rows), at every step k = 0..K.
    assert [k for k, _ in seen] == list(range(K + 1)) * 4
    assert seen[K][1] == 1.0 and st.row_calls.shape == (B,)


@pytest.mark.parametrize("source", ["masked", "uniform"])
def test_chunking_keeps_the_distribution(source, dist):
    path = PATHS[source](dist.vocab_size)
    den = exact_denoiser(dist, path)
    n = 20000
    x, st = sample(
        None,
        path,
        batch_size=n,
        length=2,
        num_steps=2,
        seed=2,
        chunk_size=3000,
        return_stats=True,
        x1_sampler=posterior_x1_sampler(dist, path),
    )
    assert x.shape == (n, 2) and st.row_calls.shape == (n,) and st.num_calls == 2 * math.ceil(n / 3000)
    assert tv(empirical(dist, x), dist.probs) < tv_tol(9, n)
    kw = {"batch_size": 100, "length": 2, "num_steps": 5, "seed": 9}
    assert torch.equal(sample(den, path, **kw), sample(den, path, chunk_size=100, **kw))


def test_argument_errors(dist):
    path = MaskedPath(dist.vocab_size)
    den = exact_denoiser(dist, path)
    kw = {"batch_size": 2, "length": 2, "num_steps": 2}
    for bad in (
        {"method": "bogus"},
        {"method": "joint"},
        {"top_p": 0.0},
        {"temperature": 0.0},
        {"record_steps": [3], "return_stats": True},
        {"record_steps": [1]},
        {"x1_sampler": lambda x, t, g: x, "method": "euler"},
    ):
        with pytest.raises(ValueError):
            sample(den, path, **kw, **bad)
    with pytest.raises(ValueError):
        sample(lambda x, t: torch.zeros(x.shape[0], 2, dist.vocab_size + 1), path, **kw)


@pytest.mark.parametrize("source", ["masked", "uniform"])
def test_runs_a_real_denoiser(source):
    """Smoke test with the library's transformer: the cache default follows `cfg.time_conditioning`."""
    from tcsm.models.transformer import Denoiser, DenoiserConfig

    V, L, B, K = 5, 8, 16, 16
    path = PATHS[source](V)
    torch.manual_seed(0)
    cfg = DenoiserConfig(
        vocab_size=V,
        num_states=path.num_states,
        max_len=L,
        d_model=32,
        n_layers=1,
        n_heads=2,
        time_conditioning=source == "uniform",
    )
    model = Denoiser(cfg).eval()
    torch.nn.init.normal_(model.head.weight)  # the zero-initialised head would give uniform logits
    x, st = sample(
        model,
        path,
        batch_size=B,
        length=L,
        num_steps=K,
        seed=0,
        prompt=torch.tensor([1, 2]),
        return_stats=True,
    )
    assert x.shape == (B, L) and x.dtype == torch.long and ((x >= 0) & (x < V)).all()
    assert (x[:, :2] == torch.tensor([1, 2])).all()
    assert st.cached == (source == "masked")
    if source == "masked":
        assert st.max_row_calls <= min(K, L - 2)


def test_bf16_sampling_stays_close_to_fp32():
    """precision="bf16" only changes the denoiser's arithmetic: with the same random stream, the samples agree with
    fp32 ones except where bf16 rounding flips a near-tie, and "fp32" inside an outer autocast is exact fp32."""
    from tcsm.models import build_denoiser

    V, L = 11, 24
    path = MaskedPath(V)
    model = build_denoiser("tiny", vocab_size=V, num_states=V + 1).eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.1, generator=torch.Generator().manual_seed(p.numel()))
    kw = {"batch_size": 64, "length": L, "num_steps": 16, "time_independent": False}
    ref = sample(model, path, seed=3, precision="fp32", **kw)
    low = sample(model, path, seed=3, precision="bf16", **kw)
    assert (ref != low).float().mean() < 0.05
    with torch.autocast("cpu", dtype=torch.bfloat16):
        forced = sample(model, path, seed=3, precision="fp32", **kw)
    assert torch.equal(forced, ref)
    with pytest.raises(ValueError, match="precision"):
        sample(model, path, seed=3, precision="fp16", **kw)
