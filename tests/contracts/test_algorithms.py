"""Contracts every algorithm obeys, over ONE table of all algorithms.

(a) double entry: what a run records equals what was planned (docs/design.md rule 1);
(b) noise 0 and clip ∞ reproduce the non-private method (docs/algorithms.md §5);
(c) calibrate, then run: the run's ε is within the target;
(d) hyper-parameter validation: a bad value raises DpoptError naming the field.

The run is replayed by hand with ``train.randomness`` (the generator and noise source ``dpopt.run`` uses), so
the replay's ledger is the run's ledger; the replay is checked against ``dpopt.run``'s output.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import dp_accounting as dpa
import pytest
import torch

import dpopt
from dpopt import accounting, train
from dpopt._validate import DpoptError
from dpopt.accounting import Ledger, canonical, epsilon_of
from dpopt.algorithms import AdamBC, registry
from dpopt.base import Algorithm, Batch, NoiseSource, Sampler
from dpopt.mechanisms import SeededNoise
from dpopt.sampling import FixedSize, FullBatch, Poisson
from dpopt.oracles import NonconvexLogistic
from dpopt.oracles import zeroth_order as zo

N, DIM, DELTA, SEED = 400, 5, 1e-5, 3


@cache
def oracle() -> NonconvexLogistic:
    """n = 400, d = 5 logistic data (nonconvex regulariser, as in the DP-SRM experiment)."""
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(N, DIM, generator=gen, dtype=torch.float64)
    w = torch.randn(DIM, generator=gen, dtype=torch.float64)
    y = torch.where(X @ w + 0.5 * torch.randn(N, generator=gen, dtype=torch.float64) >= 0, 1.0, -1.0)
    return NonconvexLogistic(X, y, reg=0.1)


@dataclass(frozen=True)
class Case:
    """One algorithm: ``make(noise, clip)`` builds it (noise 0 and clip ∞: its non-private form);
    ``registered``: the name of the registry's algorithm it is a form of."""

    registered: str
    make: Callable[[float, float], Any]
    steps: int
    adaptive: bool = False     # the ledger is adaptive (a privacy filter): compare ε only
    private: bool = True       # False: a non-private method (no noise to calibrate)
    atoms: int | None = None   # the atomic events of a run when not one per step (banded: ⌈T/b⌉ rounds)


INF = math.inf
CLIENTS = dpopt.sampling.Clients(N, 4)  # P = 4 clients of m = 100 records
TABLE: dict[str, Case] = {
    "dpsgd-poisson": Case("dp-sgd", lambda z, c: dpopt.DPSGD(lr=0.5, clip=c, noise_multiplier=z, batch_size=40), 30),
    "dpsgd-fixed": Case("dp-sgd", lambda z, c: dpopt.DPSGD(lr=0.5, clip=c, noise_multiplier=z, batch_size=40,
                                                           sampling=FixedSize), 30),
    "dp_gd": Case("dp-gd", lambda z, c: dpopt.dp_gd(lr=0.5, clip=c, noise_multiplier=z), 20),
    "dpsgd-banded": Case("dp-bandmf", lambda z, c: dpopt.DPSGD(lr=0.5, clip=c, noise_multiplier=z, batch_size=40,
                                                               bands=4), 30, atoms=8),
    "dpsgd-quantile": Case("dp-sgd", lambda z, c: dpopt.DPSGD(lr=0.5, clip=c if c < INF else 1.0, noise_multiplier=z,
                                                              batch_size=40, clip_quantile=0.5, count_noise=10.0), 30),
    "dpsgd-quantile-fixed": Case("dp-sgd", lambda z, c: dpopt.DPSGD(lr=0.5, clip=c if c < INF else 1.0,
                                                                    noise_multiplier=z, batch_size=40,
                                                                    sampling=FixedSize, clip_quantile=0.3,
                                                                    count_noise=10.0), 30),
    "dpsgd-adambc": Case("dp-sgd", lambda z, c: AdamBC(dpopt.DPSGD(lr=0.5, clip=c, noise_multiplier=z,
                                                                   batch_size=40), lr=0.05), 30),
    "dpsgd-banded-adambc": Case("dp-bandmf", lambda z, c: AdamBC(dpopt.DPSGD(lr=0.5, clip=c, noise_multiplier=z,
                                                                             batch_size=40, bands=3), lr=0.05), 30,
                                atoms=10),
    "rrpsgd": Case("rrpsgd", lambda z, c: dpopt.rrpsgd(lr=0.5, clip=c, noise_multiplier=z, batch_size=40), 30),
    "dpsrm-poisson": Case("dp-srm", lambda z, c: dpopt.DPSRM(lr=0.5, clip=c, clip_diff=c / 10 if c < INF else INF,
                                                             gamma=0.3, noise_multiplier0=z, noise_multiplier=z,
                                                             batch_size0=80, batch_size=40), 30),
    "dpsrm-fixed": Case("dp-srm", lambda z, c: dpopt.DPSRM(lr=0.5, clip=c, clip_diff=c / 10 if c < INF else INF,
                                                           gamma=0.3, noise_multiplier0=z, noise_multiplier=z,
                                                           batch_size0=80, batch_size=40, sampling=FixedSize), 30),
    "storm": Case("storm", lambda z, c: dpopt.Storm(lr=0.5, momentum=0.3, batch_size0=80, batch_size=40), 30,
                  private=False),
    "aclip": Case("aclip", lambda z, c: dpopt.AClip(lr=0.5, clip=c / 4, noise_multiplier=z, batch_size=40), 30),
    "aclip-banded": Case("aclip", lambda z, c: dpopt.AClip(lr=0.5, clip=c / 4, noise_multiplier=z, batch_size=40,
                                                           bands=4), 30, atoms=8),
    "aclip-projected": Case("aclip", lambda z, c: dpopt.AClip(lr=0.5, clip=c / 10, noise_multiplier=z, batch_size=40,
                                                              radius=0.3), 30),
    "aclip-restarted": Case("aclip", lambda z, c: dpopt.RestartedAClip(
        stages=(dpopt.Stage(12, 40, c / 4, 0.5), dpopt.Stage(18, 80, c / 8, 0.25)), noise_multiplier=z), 30),
    "dpsur": Case("dp-sur", lambda z, c: dpopt.DPSUR(lr=0.5, clip=c, noise_multiplier=z, val_noise_multiplier=2 * z,
                                                     batch_size=40, val_rate=0.1, val_clip=c / 2, threshold=-0.001,
                                                     noise_ratios=(1.0, 2.0)), 30, atoms=60),
    "dpagd": Case("dp-agd", lambda z, c: dpopt.DPAGD(noise_multiplier=z, clip=c, obj_clip=2.0 if c < INF else INF,
                                                     grad_fraction=0.05, select_fraction=0.05, adapt_every=5), 40,
                  adaptive=True),
    "diff2-gd": Case("diff2-gd", lambda z, c: dpopt.DIFF2(lr=0.5, clip=c, clip_diff=2 * c, restart=5,
                                                          noise_multiplier1=z, noise_multiplier2=z,
                                                          clients=CLIENTS), 20),
    "diff2-bvr": Case("diff2-bvr", lambda z, c: dpopt.DIFF2(lr=0.5, clip=c, clip_diff=2 * c, restart=5,
                                                            noise_multiplier1=z, noise_multiplier2=z, clients=CLIENTS,
                                                            local=dpopt.LocalSteps(steps=3, batch=20, clip=2 * c),
                                                            noise_multiplier3=z), 20),
}


def o2nc(estimator: str, passes: str) -> Callable[[float, float], Any]:
    if passes == "multi":
        return lambda z, c: dpopt.O2NCMulti(lr=0.5, radius=0.05, window=5, alpha=0.1, period=10, clip0=c, clip=c / 4,
                                            noise_multiplier=z, estimator=estimator, directions=3)
    return lambda z, c: dpopt.O2NC(lr=0.5, radius=0.05, window=5, alpha=0.1, period=10, clip0=c, clip=c / 4,
                                   noise_multiplier=z, estimator=estimator, directions=3, batch_size0=40, batch_size=4)


TABLE |= {f"o2nc-{estimator}-{passes}": Case(f"o2nc-{estimator if passes == 'single' else passes}",
                                            o2nc(estimator, passes), 30)
          for estimator, passes in (("zeroth", "single"), ("zeroth", "multi"), ("first", "single"))}
NAMES = list(TABLE)
PRIVATE = [name for name in NAMES if TABLE[name].private]


@dataclass
class Replay:
    state: Any
    ledger: Ledger
    thetas: list[torch.Tensor]          # θ^0 … θ^T
    batches: list[torch.Tensor]
    epsilons: list[float]               # the ledger's ε(δ) after each step (when tracked)


def sampler_of(algo: Any, state: Any, t: int) -> Sampler:
    """Step t's sampler as ``dpopt.run`` asks for it: from the state for a keyed algorithm (banded
    noise's cyclic Poisson groups)."""
    return algo.batch_sampler(state, t, N) if train.keyed(algo) else algo.sampler(t, N)


def replay(algo: Any, steps: int, seed: int = SEED, track_epsilon: bool = False) -> Replay:
    """``dpopt.run``'s loop, by hand: the same generators, samplers, steps and ledger."""
    sample_gen, source, _ = train.randomness(seed)
    theta0 = torch.zeros(DIM, dtype=torch.float64)
    state = algo.init(theta0, steps, sample_gen)
    ledger = Ledger(algo.relation())
    thetas, batches, epsilons = [state.theta.clone()], [], []
    for t in range(steps):
        sampler = sampler_of(algo, state, t)
        indices = sampler.sample(sample_gen)
        state, event = algo.step(state, Batch(t, indices, sampler), oracle(), source)
        ledger.record(event)
        thetas.append(state.theta.clone())
        batches.append(indices)
        if track_epsilon:
            epsilons.append(ledger.epsilon(DELTA))
    return Replay(state, ledger, thetas, batches, epsilons)


def run(algo: Any, steps: int, seed: int = SEED) -> dpopt.History:
    return dpopt.run(algo, oracle(), steps=steps, seed=seed, delta=DELTA, log_every=steps)


# ------------------------------------------------------------------------------ (a) double entry


@pytest.mark.parametrize("name", NAMES)
def test_double_entry(name):
    case = TABLE[name]
    algo = case.make(1.0, 1.0)
    history = run(algo, case.steps)
    manual = replay(algo, case.steps, track_epsilon=case.adaptive)
    # The replay is dpopt.run's loop: same output, bit for bit.
    assert torch.equal(algo.output(manual.state), history.theta)
    planned = algo.planned_event(N, case.steps)
    relation = algo.relation()
    planned_epsilon = epsilon_of(planned, DELTA, relation)
    if not case.adaptive:
        assert manual.ledger.event() == canonical(planned)
        assert manual.ledger.steps == accounting.count_steps(planned)
        # BVR: + its local steps; single-pass O2NC: one tree for the whole pass (no-ops cost nothing)
        atoms = case.atoms or (1 if name.endswith("-single") else case.steps)
        assert manual.ledger.steps == atoms or name == "diff2-bvr"
    else:
        # A privacy filter: never above the plan, and the whole budget once exhausted.
        assert manual.state.exhausted
        assert all(eps <= planned_epsilon * (1 + 1e-12) for eps in manual.epsilons)
    if math.isinf(planned_epsilon):
        assert math.isinf(history.final["epsilon"]) and not case.private
    else:
        # Equal compositions; dp_accounting's PLD differs by ~1e-13 between the planned and the
        # canonical nesting of the same events.
        assert history.final["epsilon"] == pytest.approx(planned_epsilon, rel=1e-9)
    assert history.final["epsilon"] == pytest.approx(manual.ledger.epsilon(DELTA), rel=1e-12)
    assert history.accountant == manual.ledger.accountant
    assert history.neighboring_relation == accounting.RELATION_NAMES[relation]


def test_dpagd_records_only_zcdp_that_sums_to_the_budget():
    """The ledger holds what the mechanisms returned: Gaussians (ρ = 1/(2z²)) and the noisy
    argmin's ``ZCDpEvent(ρ_s)``, summing to the filter's budget; the run claims the budget."""
    algo = TABLE["dpagd"].make(1.0, 1.0)
    manual = replay(algo, TABLE["dpagd"].steps)
    runs = accounting.run_length([manual.ledger.event()])
    gaussian = sum(count / (2 * event.noise_multiplier**2) for event, count in runs
                   if isinstance(event, dpa.GaussianDpEvent))
    selection = sum(event.rho * count for event, count in runs if isinstance(event, dpa.ZCDpEvent))
    assert all(isinstance(event, dpa.ZCDpEvent | dpa.GaussianDpEvent) for event, _ in runs)
    assert gaussian > 0 and selection > 0
    assert gaussian + selection == pytest.approx(algo.rho_total, rel=1e-12) and algo.rho_total == 0.5
    assert accounting.guarantee(manual.ledger.event(), algo.planned_event(N, 40)) == dpa.ZCDpEvent(0.5)


@pytest.mark.parametrize(("name", "factor"), [
    ("dpsgd-poisson", 1.0), ("dpsgd-fixed", 2.0), ("dp_gd", 2.0), ("rrpsgd", 1.0)])
def test_dpsgd_noise_is_z_times_sensitivity_divided_by_public_size(name, factor):
    """θ⁺(z) − θ⁺(0) = −η·z·Δ·ξ/b on one batch: Δ = C (add/remove-one) or 2C (replace-one), ξ the
    noise generator's normals, b the sampler's public expected size (rule 2: noise, then scale)."""
    z, clip = 1.7, 0.3
    noisy, clean = TABLE[name].make(z, clip), TABLE[name].make(0.0, clip)
    sampler = noisy.sampler(0, N)
    indices = sampler.sample(torch.Generator().manual_seed(1))
    theta0 = torch.full((DIM,), 0.2, dtype=torch.float64)
    steps = []
    for algo in (noisy, clean):
        state = algo.init(theta0, 5, torch.Generator().manual_seed(0))
        steps.append(algo.step(state, Batch(0, indices, sampler), oracle(), SeededNoise(8)))
    xi = torch.randn(DIM, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    want = -0.5 * z * factor * clip * xi / sampler.expected_size
    assert torch.allclose(steps[0][0].theta - steps[1][0].theta, want, rtol=1e-12, atol=1e-15)
    assert steps[0][1] == sampler.wrap(dpa.GaussianDpEvent(z))


@pytest.mark.parametrize(("name", "factor"), [("dpsrm-poisson", 1.0), ("dpsrm-fixed", 2.0)])
def test_dpsrm_noise_is_z_times_sensitivity_divided_by_public_size(name, factor):
    """Step 0: Δ = C1; steps ≥ 1: Δ = S = γC1 + (1−γ)C2 (times 2 under replace-one)."""
    algo = dataclasses.replace(TABLE[name].make(1.0, 1.0), noise_multiplier0=1.3, noise_multiplier=2.1)
    clean = dataclasses.replace(algo, noise_multiplier0=0.0, noise_multiplier=0.0)
    state = clean.init(torch.zeros(DIM, dtype=torch.float64), 5, torch.Generator().manual_seed(0))
    sample_gen = torch.Generator().manual_seed(2)
    for t, (z, sensitivity) in enumerate([(1.3, algo.clip), (2.1, 0.3 * algo.clip + 0.7 * algo.clip_diff)]):
        sampler = algo.sampler(t, N)
        batch = Batch(t, sampler.sample(sample_gen), sampler)
        noisy_state, event = algo.step(state, batch, oracle(), SeededNoise(8 + t))
        state, _ = clean.step(state, batch, oracle(), SeededNoise(8 + t))
        xi = torch.randn(DIM, generator=torch.Generator().manual_seed(8 + t), dtype=torch.float64)
        want = z * factor * sensitivity * xi / sampler.expected_size
        assert torch.allclose(noisy_state.momentum - state.momentum, want, rtol=1e-12, atol=1e-15)
        assert event == sampler.wrap(dpa.GaussianDpEvent(z))


# ------------------------------------------------------------------ (b) non-private references


def sgd_reference(lr: float, batch_size: int, sampling: str, steps: int, seed: int = SEED,
                  uniform_output: bool = False) -> tuple[list[torch.Tensor], int]:
    """Plain minibatch SGD with autograd on ``oracle.loss``: θ ← θ − η·∇(Σ_{i∈B} f_i(θ))/b, b the
    sampler's expected batch size, batches drawn exactly as dpopt.run draws them."""
    sample_gen, _, _ = train.randomness(seed)
    pick = int(torch.randint(steps, (1,), generator=sample_gen)) if uniform_output else -1
    sampler = dpopt.sampling.by_name(sampling).of(N, batch_size)
    theta = torch.zeros(DIM, dtype=torch.float64)
    thetas = [theta]
    for _ in range(steps):
        indices = sampler.sample(sample_gen)
        point = theta.clone().requires_grad_(True)
        if len(indices):
            (grad,) = torch.autograd.grad(len(indices) * oracle().loss(point, indices), point)
        else:
            grad = torch.zeros_like(theta)
        theta = theta - lr * grad / sampler.expected_size
        thetas.append(theta)
    return thetas, pick


def assert_trajectories_equal(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    assert len(got) == len(want)
    for t, (a, b) in enumerate(zip(got, want)):
        assert torch.allclose(a, b, rtol=0, atol=1e-10), (t, a, b)
    assert float(want[-1].norm()) > 0.1  # the runs went somewhere


@pytest.mark.parametrize(("name", "sampling", "batch"), [
    ("dpsgd-poisson", "poisson", 40), ("dpsgd-fixed", "fixed", 40), ("dp_gd", "full", 40)])
def test_dpsgd_without_noise_or_clipping_is_sgd(name, sampling, batch):
    case = TABLE[name]
    algo = case.make(0.0, INF)
    manual = replay(algo, case.steps)
    want, _ = sgd_reference(0.5, batch, sampling, case.steps)
    assert_trajectories_equal(manual.thetas, want)
    assert torch.allclose(run(algo, case.steps).theta, want[-1], rtol=0, atol=1e-10)
    assert math.isinf(epsilon_of(algo.planned_event(N, case.steps), DELTA, algo.relation()))


def test_rrpsgd_outputs_the_sgd_iterate_at_the_predrawn_round():
    case = TABLE["rrpsgd"]
    algo = case.make(0.0, INF)
    want, pick = sgd_reference(0.5, 40, "poisson", case.steps, uniform_output=True)
    assert 0 < pick < case.steps - 1  # this seed tests a genuinely intermediate round
    history = run(algo, case.steps)
    assert torch.allclose(history.theta, want[pick], rtol=0, atol=1e-10)
    assert not torch.allclose(history.theta, want[-1], rtol=0, atol=1e-6)
    manual = replay(algo, case.steps)
    assert torch.allclose(algo.output(manual.state), want[pick], rtol=0, atol=1e-10)


@pytest.mark.parametrize(("name", "sampling"), [("dpsrm-poisson", Poisson), ("dpsrm-fixed", FixedSize)])
def test_dpsrm_without_noise_or_clipping_is_storm(name, sampling):
    case = TABLE[name]
    algo = case.make(0.0, INF)
    storm = dpopt.Storm(lr=algo.lr, momentum=algo.gamma, step_rule="constant", batch_size0=algo.batch_size0,
                        batch_size=algo.batch_size, sampling=sampling)
    got, want = replay(algo, case.steps), replay(storm, case.steps)
    for a, b in zip(got.batches, want.batches):
        assert torch.equal(a, b)
    assert_trajectories_equal(got.thetas, want.thetas)


def test_dpsrm_with_gamma_one_is_storm_with_momentum_one_is_sgd():
    """γ = 1 is allowed (γ ∈ (0, 1]); then the difference term has weight 0 and C2 = ∞ is harmless."""
    algo = dpopt.DPSRM(lr=0.5, clip=INF, clip_diff=INF, gamma=1.0, noise_multiplier0=0.0, noise_multiplier=0.0,
                       batch_size0=40, batch_size=40)
    want, _ = sgd_reference(0.5, 40, "poisson", 20)
    assert_trajectories_equal(replay(algo, 20).thetas, want)


def test_storm_with_momentum_one_is_sgd():
    storm = dpopt.Storm(lr=0.5, momentum=1.0, batch_size0=40, batch_size=40)
    want, _ = sgd_reference(0.5, 40, "poisson", 30)
    assert_trajectories_equal(replay(storm, 30).thetas, want)


def test_dpagd_without_noise_or_clipping_is_normalised_gd_with_exact_line_search():
    algo = TABLE["dpagd"].make(0.0, INF)
    steps = TABLE["dpagd"].steps
    # Reference: d = ∇F/‖∇F‖; α* = argmin_{α∈Φ} F(θ − αd), Φ = {0, α_max/m, …, α_max};
    # every τ = 5 steps α_max ← min(1.1·max nonzero α chosen in those steps, 2) (kept if none).
    theta, max_step, chosen, thetas = torch.zeros(DIM, dtype=torch.float64), algo.max_step, [], []
    thetas.append(theta)
    for t in range(steps):
        point = theta.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(oracle().loss(point), point)
        direction = grad / grad.norm()
        alphas = torch.linspace(0.0, max_step, algo.num_candidates + 1, dtype=torch.float64)
        values = torch.stack([oracle().loss(theta - a * direction) for a in alphas])
        k = int(torch.argmin(values))
        if k > 0:
            theta = theta - alphas[k] * direction
            chosen.append(float(alphas[k]))
        if (t + 1) % algo.adapt_every == 0:
            if chosen:
                max_step = min((1 + algo.step_growth) * max(chosen), algo.max_step)
            chosen = []
        thetas.append(theta)
    assert_trajectories_equal(replay(algo, steps).thetas, thetas)


def o2nc_reference(algo: Any, steps: int, seed: int = SEED) -> list[torch.Tensor]:
    """Non-private O2NC (Algorithm 2) by hand: s_t, x_t = x_{t−1} + Δ_t, z_t = x_{t−1} + s_tΔ_t;
    g_t = batch mean of estimates at z_t (period start) or g_{t−1} + batch mean of (estimate at z_t −
    estimate at z_{t−1}); Δ_{t+1} = clip(Δ_t − ηg_t, D); output the mean of z over the pre-drawn
    window. First-order estimates by autograd on ``oracle.loss`` one record and one point at a time.
    Random draws in the algorithm's order (the window from the sampling generator; per step s_t
    and the directions or points from the noise source's generator). Returns
    x_0 … x_T and the output."""
    sample_gen, source, _ = train.randomness(seed)
    noise_gen = source.generator
    pick = int(torch.randint(steps // algo.window, (1,), generator=sample_gen))

    def estimates(point: torch.Tensor, indices: torch.Tensor, count: int) -> torch.Tensor:
        if algo.estimator == "zeroth":
            return zo.two_point(oracle(), point, indices, zo.sphere(noise_gen, len(indices), count, DIM), algo.alpha)
        offsets = zo.ball(noise_gen, len(indices), count, DIM, algo.alpha)
        rows = []
        for i, record in enumerate(indices):
            grads = []
            for u in offsets[i]:
                leaf = (point + u).requires_grad_(True)
                grads.append(torch.autograd.grad(oracle().loss(leaf, record[None]), leaf)[0])
            rows.append(torch.stack(grads).mean(dim=0))
        return torch.stack(rows)

    x, delta = torch.zeros(DIM, dtype=torch.float64), torch.zeros(DIM, dtype=torch.float64)
    xs, window, previous, g = [x], torch.zeros(DIM, dtype=torch.float64), x, x
    for t in range(steps):
        indices = algo.sampler(t, N).sample(sample_gen)
        s = float(torch.rand((), generator=noise_gen, dtype=torch.float64))
        z, x = x + s * delta, x + delta
        if t % algo.period == 0:
            g = estimates(z, indices, algo.directions if algo.estimator == "zeroth" else 1).mean(dim=0)
        else:
            g = g + (estimates(z, indices, algo.directions) - estimates(previous, indices, algo.directions)).mean(0)
        step = delta - algo.lr * g
        delta = step * min(1.0, algo.radius / float(step.norm()))
        if t // algo.window == pick:
            window = window + z
        previous = z
        xs.append(x)
    return xs + [window / algo.window]


@pytest.mark.parametrize("name", ["o2nc-zeroth-single", "o2nc-zeroth-multi", "o2nc-first-single"])
def test_o2nc_without_noise_or_clipping_is_o2nc(name):
    case = TABLE[name]
    algo = case.make(0.0, INF)
    want = o2nc_reference(algo, case.steps)
    manual = replay(algo, case.steps)
    assert_trajectories_equal(manual.thetas + [algo.output(manual.state)], want)
    assert manual.state.clipped == 0 and manual.state.records == sum(len(b) for b in manual.batches)
    assert math.isinf(epsilon_of(algo.planned_event(N, case.steps), DELTA, algo.relation()))


def mean_clipping_reference(stages: list[tuple[int, int, float, float]], radius: float,
                            steps: int, seed: int = SEED) -> list[torch.Tensor]:
    """SGD with mean clipping and iterate averaging, by hand with autograd: per stage
    (N_s, m_s, λ_s, γ_s): θ ← Proj_R(θ − γ_s·clip(∇(Σ_{i∈B} f_i)(θ)/m_s, λ_s)); after a stage,
    θ ← the stage's average of θ^1..θ^{N_s}. Returns θ^0..θ^T and appends the output."""
    sample_gen, _, _ = train.randomness(seed)

    def project(theta: torch.Tensor) -> torch.Tensor:
        norm = float(theta.norm())
        return theta * radius / norm if norm > radius else theta

    theta = torch.zeros(DIM, dtype=torch.float64)
    thetas = [theta]
    for count, batch_size, clip, lr in stages:
        sampler = Poisson.of(N, batch_size)
        total = torch.zeros_like(theta)
        for _ in range(count):
            indices = sampler.sample(sample_gen)
            point = theta.clone().requires_grad_(True)
            (grad,) = torch.autograd.grad(len(indices) * oracle().loss(point, indices), point)
            mean = grad / batch_size
            theta = project(theta - lr * mean * min(1.0, clip / float(mean.norm())))
            total = total + theta
            thetas.append(theta)
        theta = total / count
    thetas[-1:] = [thetas[-1], theta]
    assert steps == sum(stage[0] for stage in stages)
    return thetas


@pytest.mark.parametrize(("name", "stages", "radius"), [
    ("aclip", [(30, 40, 0.25, 0.5)], INF),
    ("aclip-projected", [(30, 40, 0.1, 0.5)], 0.3),
    ("aclip-restarted", [(12, 40, 0.25, 0.5), (18, 80, 0.125, 0.25)], INF)])
def test_aclip_without_noise_is_sgd_with_mean_clipping(name, stages, radius):
    """Noise 0 with the clip kept finite: the non-private method is SGD on the clipped batch mean
    (the clip binds here: the trajectories would differ without it), with iterate averaging."""
    case = TABLE[name]
    algo = case.make(0.0, 1.0)
    want = mean_clipping_reference(stages, radius, case.steps)
    manual = replay(algo, case.steps)
    got = manual.thetas
    if name == "aclip-restarted":  # the restart replaces θ at the stage boundary by the stage average
        assert torch.allclose(got[12], sum(want[1:13]) / 12, rtol=0, atol=1e-12)
        got, want = got[:12] + got[13:], want[:12] + want[13:]
    assert_trajectories_equal(got[:-1] + [algo.output(manual.state)], want[:-2] + [want[-1]])
    unclipped = replay(case.make(0.0, INF), case.steps)
    assert not torch.allclose(unclipped.thetas[-1], manual.thetas[-1], rtol=0, atol=1e-3)
    if radius < INF:  # the projection binds too
        assert max(float(theta.norm()) for theta in manual.thetas) == pytest.approx(radius, rel=1e-12)


def test_aclip_noise_is_z_times_two_lambda():
    """θ⁺(z) − θ⁺(0) = −γ·z·2λ·ξ on one batch (the noise is added to the clipped *mean*, with the
    honest sensitivity 2λ); over 5,000 steps × d = 5 the 25,000 normalised draws pass a KS
    test at N(0, 1), and fail it at the scales 2/3 and 3/2 (bounds as in test_mechanisms)."""
    from scipy import stats

    z, clip, lr = 1.7, 0.3, 0.5
    noisy = dpopt.AClip(lr=lr, clip=clip, noise_multiplier=z, batch_size=40)
    clean = dataclasses.replace(noisy, noise_multiplier=0.0)
    sampler = noisy.sampler(0, N)
    batch = Batch(0, sampler.sample(torch.Generator().manual_seed(1)), sampler)
    state = noisy.init(torch.full((DIM,), 0.2, dtype=torch.float64), 5, torch.Generator())
    base, _ = clean.step(state, batch, oracle(), SeededNoise(0))
    source, draws = SeededNoise(8), []
    for _ in range(5_000):
        moved, event = noisy.step(state, batch, oracle(), source)
        draws.append((moved.theta - base.theta) / (-lr * z * 2 * clip))
    samples = torch.cat(draws).numpy()
    assert stats.kstest(samples, "norm").pvalue > 0.01
    for wrong in (2 / 3, 3 / 2):
        assert stats.kstest(samples, "norm", args=(0.0, wrong)).pvalue < 1e-6
    assert event == sampler.wrap(dpa.GaussianDpEvent(z))


# --------------------------------------------------------------------- (c) calibrate, then run


@pytest.mark.parametrize("name", PRIVATE)
def test_calibrate_then_run(name):
    case, target = TABLE[name], 1.0
    algo = accounting.calibrate(case.make(1.0, 1.0), epsilon=target, delta=DELTA, n=N, steps=case.steps)
    history = run(algo, case.steps)
    assert history.final["epsilon"] <= target
    assert history.final["epsilon"] >= 0.99 * target
    assert all(z > 0 for z in accounting.noise_of(algo).values())  # (a wrapper's: its inner algorithm's)


def test_calibrating_a_non_private_method_fails_clearly():
    with pytest.raises(DpoptError, match="no noise multiplier"):
        accounting.calibrate(TABLE["storm"].make(0.0, INF), epsilon=1.0, delta=DELTA, n=N, steps=10)


# ------------------------------------------------------------------- (d) hyper-parameter checks

#: name → (a valid algorithm, [(field, bad value), ...]); each bad value alone must be refused.
BAD_VALUES: dict[str, list[tuple[str, Any]]] = {
    "dpsgd-poisson": [("lr", 0.0), ("lr", -1.0), ("lr", INF), ("lr", math.nan), ("clip", 0.0), ("clip", -2.0),
                      ("clip", math.nan), ("noise_multiplier", -0.5), ("noise_multiplier", INF),
                      ("batch_size", 0), ("batch_size", 2.5), ("batch_size", True), ("sampling", "fixed"),
                      ("output_rule", "best"), ("noise", "torch"), ("noise", dpopt.mechanisms.DISCRETE)],
    "dpsrm-poisson": [("lr", 0.0), ("clip", -1.0), ("clip_diff", 0.0), ("gamma", 0.0), ("gamma", 1.5),
                      ("noise_multiplier0", -1.0), ("noise_multiplier", -1.0), ("batch_size0", 0),
                      ("batch_size", 0), ("sampling", FullBatch), ("step_rule", "adam"), ("zeta", 0.0),
                      ("n0", -1.0), ("smoothness", 0.0), ("output_rule", "best"), ("noise", dpopt.mechanisms.DISCRETE)],
    "storm": [("lr", 0.0), ("momentum", 0.0), ("momentum", 1.5), ("batch_size0", 0), ("batch_size", -3),
              ("sampling", FullBatch), ("step_rule", "adam"), ("k", 0.0), ("w", -1.0), ("c", 0.0)],
    "dpagd": [("noise_multiplier", -1.0), ("clip", 0.0), ("obj_clip", -1.0), ("clip", INF), ("obj_clip", INF),
              ("grad_fraction", 0.0), ("grad_fraction", 1.0), ("select_fraction", 1.5), ("gamma", 0.0),
              ("max_step", 0.0), ("num_candidates", 0), ("adapt_every", 0), ("step_growth", -0.1)],
}
BAD_VALUES["aclip"] = [("lr", 0.0), ("lr", math.nan), ("clip", 0.0), ("clip", -1.0), ("noise_multiplier", -1.0),
                       ("noise_multiplier", INF), ("batch_size", 0), ("batch_size", 1.5), ("radius", 0.0),
                       ("radius", -1.0), ("noise", dpopt.mechanisms.DISCRETE)]
BAD_VALUES["aclip-restarted"] = [("noise_multiplier", -1.0), ("radius", 0.0), ("stages", ()), ("stages", (1, 2))]
BAD_VALUES["o2nc-zeroth-single"] = [
    ("lr", 0.0), ("radius", -1.0), ("window", 0), ("alpha", 0.0), ("period", 0), ("clip0", 0.0), ("clip", -1.0),
    ("noise_multiplier", -1.0), ("estimator", "second"), ("directions", 0), ("batch_size0", 0), ("batch_size", 1.5),
    ("order_seed", -1)]
BAD_VALUES["o2nc-zeroth-multi"] = [("noise_multiplier0", -1.0), ("noise_multiplier", INF)]
BAD_VALUES["diff2-gd"] = [("lr", 0.0), ("clip", 0.0), ("clip_diff", -1.0), ("restart", 0), ("restart", 2.5),
                          ("noise_multiplier1", -1.0), ("noise_multiplier2", INF), ("clients", 4),
                          ("output_rule", "best"), ("noise_ratios", (1.0,)), ("noise_ratios", (1.0, 0.0))]
BAD_VALUES["diff2-bvr"] = [("noise_multiplier3", -1.0), ("noise_multiplier3", None), ("noise_ratios", (1.0, 1.0))]
BAD_VALUES["dpsgd-banded"] = [("bands", 0), ("bands", 2.5), ("bands", True), ("sampling", FixedSize),
                               ("noise", dpopt.mechanisms.DISCRETE), ("clip_quantile", 0.5)]
BAD_VALUES["dpsgd-quantile"] = [("clip_quantile", 0.0), ("clip_quantile", 1.0), ("clip_quantile", math.nan),
                                ("clip_lr", 0.0), ("clip_lr", INF), ("count_noise", 0.0), ("count_noise", -1.0),
                                ("count_noise", 0.4), ("clip", INF), ("sampling", FullBatch)]
BAD_VALUES["dpsgd-adambc"] = [("lr", 0.0), ("lr", INF), ("betas", (0.9, 1.0)), ("betas", (0.9,)), ("eps", -1.0),
                              ("gamma", 0.0), ("inner", dpopt.Storm(lr=0.5, momentum=0.3, batch_size0=80,
                                                                      batch_size=40))]
BAD_VALUES["dpsur"] = [("lr", 0.0), ("clip", 0.0), ("clip", INF), ("noise_multiplier", -1.0),
                       ("val_noise_multiplier", INF), ("batch_size", 0), ("val_rate", 0.0), ("val_rate", 1.5),
                       ("val_clip", -1.0), ("val_clip", INF), ("threshold", math.nan), ("threshold", INF),
                       ("noise_ratios", (1.0,)), ("noise_ratios", (1.0, 0.0)), ("noise", dpopt.mechanisms.DISCRETE)]
BAD_VALUES["dpsgd-fixed"] = BAD_VALUES["dpsgd-poisson"]
BAD_VALUES["dpsrm-fixed"] = BAD_VALUES["dpsrm-poisson"]
BAD_CASES = [(name, field, bad) for name, bads in BAD_VALUES.items() for field, bad in bads]


@pytest.mark.parametrize(("name", "field", "bad"), BAD_CASES)
def test_bad_hyper_parameter_is_named(name, field, bad):
    good = TABLE[name].make(1.0, 1.0)
    with pytest.raises(DpoptError, match=re.escape(f"{field}={bad!r}")):
        dataclasses.replace(good, **{field: bad})


#: The factory functions validate through DPSGD; errors still name their own keyword.
@pytest.mark.parametrize(("factory", "kwargs", "field"), [
    (dpopt.dp_gd, {"lr": -1.0, "clip": 1.0, "noise_multiplier": 1.0}, "lr"),
    (dpopt.dp_gd, {"lr": 0.1, "clip": 0.0, "noise_multiplier": 1.0}, "clip"),
    (dpopt.dp_gd, {"lr": 0.1, "clip": 1.0, "noise_multiplier": -1.0}, "noise_multiplier"),
    (dpopt.dp_gd, {"lr": 0.1, "clip": 1.0, "noise_multiplier": 1.0, "output_rule": "mean"}, "output_rule"),
    (dpopt.rrpsgd, {"lr": 0.0, "clip": 1.0, "noise_multiplier": 1.0, "batch_size": 4}, "lr"),
    (dpopt.rrpsgd, {"lr": 0.1, "clip": 1.0, "noise_multiplier": 1.0, "batch_size": 0}, "batch_size"),
    (dpopt.rrpsgd, {"lr": 0.1, "clip": 1.0, "noise_multiplier": 1.0, "batch_size": 4, "sampling": "x"}, "sampling"),
    (dpopt.rrpsgd, {"lr": 0.1, "clip": 1.0, "noise_multiplier": 1.0, "batch_size": 4, "sampling": FullBatch.of},
     "sampling"),
])
def test_factory_validation(factory, kwargs, field):
    with pytest.raises(DpoptError, match=re.escape(f"{field}={kwargs[field]!r}")):
        factory(**kwargs)


def test_dpagd_budget_fractions_must_fit():
    with pytest.raises(DpoptError, match=r"grad_fraction=0.6 \+ select_fraction=0.6 must be <= 1"):
        dpopt.DPAGD(noise_multiplier=1.0, clip=1.0, obj_clip=1.0, grad_fraction=0.6, select_fraction=0.6)


def test_every_registered_algorithm_has_a_case_and_every_case_a_registered_algorithm():
    """The registry (what the command line, ``Private``, ``tune`` and ``audit`` build by name) and
    this table cover the same algorithms; each registered one builds an object of a class its
    cases check."""
    assert {case.registered for case in TABLE.values()} == set(registry.NAMES)
    for name in registry.NAMES:
        built = registry.build(name, n=N, batch_size=40)
        assert type(built) in {type(case.make(1.0, 1.0)) for case in TABLE.values() if case.registered == name}, name
        assert registry.entry(name).private == all(case.private for case in TABLE.values() if case.registered == name)


def test_the_table_covers_every_exported_algorithm():
    built = {type(case.make(1.0, 1.0)) for case in TABLE.values()}
    assert built == {dpopt.DPSGD, dpopt.DPSRM, dpopt.Storm, dpopt.DPAGD, dpopt.AClip, dpopt.RestartedAClip, dpopt.O2NC,
                     dpopt.O2NCMulti, dpopt.DIFF2, AdamBC, dpopt.DPSUR}
    assert {"rrpsgd", "dp_gd", "diff2-bvr"} <= set(TABLE)
    assert TABLE["rrpsgd"].make(1.0, 1.0).output_rule == "uniform"
    assert TABLE["dp_gd"].make(1.0, 1.0).sampling is FullBatch


@pytest.mark.parametrize("name", NAMES)
def test_every_algorithm_implements_the_protocols(name):
    """Algorithm, its samplers and the noise source are explicit protocols, checked at run time."""
    algo = TABLE[name].make(1.0, 1.0)
    assert isinstance(algo, Algorithm)
    assert all(isinstance(algo.sampler(t, N), Sampler) for t in range(3))
    assert isinstance(oracle(), dpopt.base.Oracle)
    assert isinstance(train.randomness(0)[1], NoiseSource) and isinstance(dpopt.SystemNoise(), NoiseSource)


# ------------------------------------------------------------------------------------- DIFF2


def test_diff2_without_noise_or_clipping_is_gd():
    """ṽ_r = ∇F(x_{r−1}) − ∇F(x_{r−2}) + ṽ_{r−1} telescopes to ∇F(x_{r−1}): plain GD."""
    algo = TABLE["diff2-gd"].make(0.0, INF)
    want, _ = sgd_reference(0.5, N, "full", 20)
    assert_trajectories_equal(replay(algo, 20).thetas, want)


def test_diff2_with_restart_one_is_dp_gd_exactly():
    """T = 1: every round is a restart, ṽ_r = (clipped sum + N(0, (z·2C)²))/n: DP-GD's step,
    the same noise draws and the same ledger (n = mP here)."""
    diff2 = dataclasses.replace(TABLE["diff2-gd"].make(1.3, 0.2), restart=1, output_rule="last")
    dp_gd = dpopt.dp_gd(lr=0.5, clip=0.2, noise_multiplier=1.3)
    got, want = replay(diff2, 20), replay(dp_gd, 20)
    for a, b in zip(got.thetas, want.thetas):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-14)
    noiseless = replay(dataclasses.replace(dp_gd, noise_multiplier=0.0), 20)
    assert float((got.thetas[-1] - noiseless.thetas[-1]).norm()) > 1e-3  # the noise mattered
    assert got.ledger.event() == want.ledger.event()


def test_diff2_noise_is_z_times_two_c_over_m_p():
    """Restart round: θ⁺(z1) − θ⁺(0) = −η·z1·2C1·ξ/(mP); later rounds:
    −η·z2·2·C2‖x_{r−1} − x_{r−2}‖·ξ/(mP)
    (the difference of the estimators, everything else being equal), ξ the noise generator's normals."""
    algo = dataclasses.replace(TABLE["diff2-gd"].make(1.0, 0.3), noise_multiplier1=1.7, noise_multiplier2=0.9)
    clean = dataclasses.replace(algo, noise_multiplier1=0.0, noise_multiplier2=0.0)
    sampler = algo.sampler(0, N)
    state = clean.init(torch.full((DIM,), 0.2, dtype=torch.float64), 5, torch.Generator().manual_seed(0))
    for t, (z, sensitivity) in enumerate([(1.7, 2 * 0.3), (0.9, None)]):
        if sensitivity is None:
            sensitivity = 2 * algo.clip_diff * float((state.theta - state.prev).norm())
        batch = Batch(t, sampler.sample(torch.Generator()), sampler)
        noisy, event = algo.step(state, batch, oracle(), SeededNoise(8 + t))
        state, _ = clean.step(state, batch, oracle(), SeededNoise(8 + t))
        xi = torch.randn(DIM, generator=torch.Generator().manual_seed(8 + t), dtype=torch.float64)
        want = -0.5 * z * sensitivity * xi / (CLIENTS.size * CLIENTS.count)
        assert torch.allclose(noisy.theta - state.theta, want, rtol=1e-10, atol=1e-15)
        assert event == dpa.GaussianDpEvent(z)


def test_diff2_bvr_with_one_local_step_is_diff2_gd():
    base = TABLE["diff2-bvr"].make(1.0, 0.5)
    bvr = dataclasses.replace(base, local=dataclasses.replace(base.local, steps=1))
    gd = TABLE["diff2-gd"].make(1.0, 0.5)
    got, want = replay(bvr, 20), replay(gd, 20)
    for a, b in zip(got.thetas, want.thetas):
        assert torch.equal(a, b)
    assert got.ledger.event() == want.ledger.event()


def test_diff2_bvr_ledger_holds_the_most_exposed_client():
    """P = 4, R = 10, K = 3: client p runs the local routine in rounds r ≡ p (mod 4); the most any
    client has run after r rounds is ⌈r/4⌉, so ⌈10/4⌉ = 3 routines of K − 1 = 2 sampled Gaussians."""
    algo = TABLE["diff2-bvr"].make(1.0, 0.5)
    runs = accounting.run_length([replay(algo, 10).ledger.event()])
    local = dpa.SampledWithoutReplacementDpEvent(100, 20, dpa.GaussianDpEvent(1.0))
    assert sum(count for event, count in runs if event == local) == 3 * 2
    assert sum(count for event, count in runs if event == dpa.GaussianDpEvent(1.0)) == 10
    assert algo.relation() == dpa.NeighboringRelation.REPLACE_ONE


def test_diff2_paper_ratios_give_the_restart_rounds_one_over_u_of_the_budget():
    """Gaussian RDP adds α·k/(2z²) per round kind: ⌈R/T⌉/z1² = (R − ⌈R/T⌉)/((u − 1)·z2²)."""
    from dpopt.algorithms.diff2 import paper_ratios

    z1, z2 = paper_ratios(2000, 20, u=1.25)
    assert z1 == pytest.approx(math.sqrt(0.25 * 100 / 1900), rel=1e-15) and z2 == 1.0
    assert (100 / z1**2) / (1900 / z2**2) == pytest.approx(1 / 0.25, rel=1e-12)
    assert paper_ratios(2000, 1) == (1.0, 1.0)
    with pytest.raises(DpoptError, match=re.escape("u=1.0 must be > 1")):
        paper_ratios(10, 2, u=1.0)
