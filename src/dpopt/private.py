"""``dpopt.Private``: your model, your loop, your optimizer; dpopt's private gradient.

    private = dpopt.Private(model, loss_fn, train_set, algorithm="dp-sgd", epsilon=3.0, delta=1e-5,
                            epochs=5, batch_size=256, clip=1.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in private:                  # the planned steps, no more
        private.backward()             # p.grad = the algorithm's private estimate g̃_t
        optimizer.step()
    private.epsilon()                  # the guarantee, from the ledger

Step t draws its batch B_t from the run's secret sampling generator (Poisson, fixed size without
replacement, or the full data, as the algorithm says), reads only those records of the
map-style dataset, and runs the algorithm's ``step`` — the code path of :func:`dpopt.run`, with
the same mechanisms, the same :class:`~dpopt.accounting.Ledger` and the same double entry against
``planned_event`` (:class:`dpopt.train.Stepper`). ``backward`` then writes g̃_t, the algorithm's
noised release after its own post-processing (DP-SGD and DP-GD: (Σ clip(∇f_i, C) + noise)/b;
DP-SRM: its momentum v^t; AClip: clip(batch mean, λ) + noise; RRPSGD as DP-SGD) into each
parameter's ``.grad``. Whatever the optimizer, its momentum, weight decay or learning-rate schedule
make of g̃_t is post-processing of released values and costs no privacy; so is anything the user
does to the parameters between steps. The next step's gradients are taken where the optimizer
left the parameters. ``step()`` instead applies the algorithm's own update (every single-machine
algorithm, O2NC and DP-AGD included; :func:`dpopt.fit` is this loop).

Algorithms whose update is not θ ← θ − η·g̃ are refused by ``backward`` with the reason:
O2NC (its release estimates the gradient at a random point between iterates and drives the
online learner's increment Δ, clipped to a ball, not the parameters), DP-AGD (the step size is
itself a private choice), R-AClip (each stage restarts from an average). Their ``step()`` runs.

Compared with Opacus, opake and optax:

* Opacus ``make_private`` / ``make_private_with_epsilon`` — kept: the user's module, optimizer
  and LR scheduler; calibration of the noise to a target (ε, δ) for a number of epochs; Poisson
  sampling by default. Rejected: wrapping the module in a GradSampleModule with hooks and
  attributes left on it and on its tensors (nothing here outlives a call: the module is read
  with ``torch.func.functional_call``), the DPOptimizer subclass ladder (noise is not the
  optimizer's business: any ``torch.optim`` optimizer consumes ``.grad``), a DataLoader swapped
  for another (the batches are drawn here, by index, from a generator that is secret unless a
  seed is given; a user's DataLoader is kept for what it loads with: its dataset, ``collate_fn``
  and workers, :mod:`dpopt.oracles.loaded`), and an accountant that counts optimizer steps (here
  every release returns its own event, checked against the plan). ``BatchMemoryManager`` — kept: the logical
  (Poisson) batch is processed in physical chunks of ``microbatch_size`` records; rejected: the
  user-visible loop over physical batches and skipped optimizer steps (the chunks are internal,
  the user sees one step per logical batch).
* opake (functional DP on ``torch.func``) — kept: no hooks, explicit state (the algorithm's
  state is a NamedTuple, the randomness explicit generators, checkpointed), clipping and noise as
  functions. Rejected: assembling clip, noise and accounting by hand in the user's loop, where
  a forgotten or doubled event goes unnoticed; here the release and its event come out of one
  mechanism call.
* optax ``chain`` — kept: the private gradient is the first transformation of a chain whose
  later links (the user's optimizer) are pure post-processing, with state of their own.
  Rejected: the privacy-relevant link as a user-composable transformation (optax's
  ``dpsgd`` takes per-example gradients the user computed and leaves sampling and accounting to
  the user); here sampling, clipping, noise and the ledger cannot be separated.

Output classification (:mod:`dpopt.outputs`): everything ``Private`` hands out is private — the
releases g̃_t, the parameters, ε and its ledger, the public plan (``steps``, ``t``) — except
:meth:`Private.diagnostics`, labelled NOT PRIVATE: the last step's mean training loss, a loss to
watch that its gradients were taken of anyway (no second forward). :func:`dpopt.fit` and
:func:`dpopt.run` write diagnostics only when asked, labelled NOT PRIVATE.

What the guarantee covers: the releases of ``Private`` (``backward`` *replaces* ``.grad``, so a
gradient the loop computed itself is discarded) and what is computed from them. It does not cover
anything else the loop computes from the training data (a training loss printed per step, a
non-private backward added to the private gradient, an optimizer's ``step(closure)``: torch's
closure recomputes the loss and writes its exact gradient into ``.grad`` in place of g̃_t, so call
``optimizer.step()`` without one; :class:`dpopt.optim.AdamBC` refuses a closure).

Checkpoints (:meth:`save`, :meth:`Private.resume`) are the run's snapshot (the algorithm's state,
both generators, the step, the ledger, the run's id and its settings) in the checkpoint format of
:func:`dpopt.run` (:mod:`dpopt.snapshot`: no pickle, tagged under the user's checkpoint key); they
are secret, like the seed. The optimizer is
the user's (its state too: ``optimizer.state_dict()``), so a resumed run may take its next
gradient at another θ than the saved run would have: were its noise the saved run's, the two
releases would differ by exactly the unnoised difference of their clipped sums. So a checkpoint
is resumed once, only if it is its run's latest (:func:`dpopt.journal.resume`), and a run
without a seed resumes with generators drawn afresh from the operating system: its noise is
never a draw released before. A seeded run restores the saved generators (reproducible; two runs
or resumes with one seed are the user's to keep apart).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypedDict

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader

from . import _validate, journal, resume, snapshot
from .accounting import Ledger
from .algorithms import registry
from .base import S, Algorithm, Directed, NoiseSource, NoiseVariance
from .building import private_entry
from .oracles import TorchModel, ghost, hf, records
from .oracles.loaded import Loaded
from .outputs import NOT_PRIVATE
from .plan import Plan, plan_for, steps_for_epochs
from .seeding import randomness
from .watched import Watched

class LossToWatch(TypedDict):
    """:meth:`Private.diagnostics`: the last step's mean training loss, labelled NOT PRIVATE."""

    label: str
    step: int
    train_loss: float


class Private:
    """Private gradients of ``loss_fn(module(x), y)`` over ``data`` for a loop of one's own.

    ``module``: the user's ``nn.Module`` (trained in place; its parameters are θ). ``loss_fn``:
    one loss per record (``reduction="none"``). ``data``: a map-style dataset of ``(x, y)``
    pairs (``__getitem__``/``__len__``, e.g. a ``torch.utils.data.Dataset``; read lazily, only the
    records of each batch), a ``TensorDataset``, a pair of tensors, or a
    ``torch.utils.data.DataLoader`` over a map-style dataset: each step's batch is then loaded
    through the loader's ``collate_fn`` and worker processes, in chunks of ``microbatch_size``
    records loaded ahead; taken from it are its dataset, ``collate_fn``, ``num_workers``,
    ``prefetch_factor``, ``pin_memory``, ``timeout``, ``worker_init_fn``,
    ``multiprocessing_context`` and ``generator``; ignored are its ``batch_size``, ``shuffle`` and
    ``drop_last`` (the batches are the secret sampler's, of expected size ``batch_size``),
    ``persistent_workers`` and ``in_order``; refused are an iterable-style dataset and a sampler
    or batch sampler of one's own (:mod:`dpopt.oracles.loaded`, which also says why loading ahead
    draws nothing the run would not, and why the loss must ignore a ``collate_fn``'s padding).
    ``split``: with a DataLoader, ``(x, y)`` of a collated batch, tensors with a row per record
    (default: the batch is that pair; e.g. ``split=lambda b: (b["input_ids"], b["label"])``); the
    module runs on x, the loss on its output and y. ``algorithm``: a name of
    :mod:`dpopt.algorithms.registry` (built with ``batch_size``, ``clip`` and ``options``; ``lr``
    matters only to ``step()``) or an algorithm object. ``epsilon``: calibrate the noise to
    (ε, ``delta``) for the planned steps (``epochs`` or ``steps``); None keeps an algorithm
    object's noise multipliers. ``seed``: None draws the sampling and the noise from a seed
    from the operating system (secret), and again on :meth:`resume`; with a seed the run is
    reproducible (:meth:`resume` restores the saved generators) and the guarantee rests on the
    seed staying secret. ``engine``, ``microbatch_size``, ``known_layers``: per-record
    gradients (:class:`~dpopt.oracles.TorchModel`; ``known_layers`` extends the ghost engine's
    registry with your own per-record layers). ``delta`` must be below 1/n for n records unless
    ``allow_large_delta`` (:func:`dpopt._validate.meaningful_delta` says why).

    A Hugging Face model (transformers or peft) is run on its keyword ``inputs`` (default
    ``("input_ids", "attention_mask")``, a vision model's ``("pixel_values",)``) and ``loss_fn`` gets
    its ``logits`` and the batch's ``labels``; ``data`` may then also be a mapping of tensors (a
    tokenizer's ``BatchEncoding`` with ``labels``), and a DataLoader's dict batches need no ``split``
    (:mod:`dpopt.oracles.hf`, with the per-record losses ``causal_lm_loss`` and ``classification_loss``).
    """

    def __init__(self, module: nn.Module, loss_fn: Callable[[Tensor, Tensor], Tensor],
                 data: hf.Data, *, algorithm: str | Algorithm[S] = "dp-sgd", epsilon: float | None, delta: float,
                 epochs: float | None = None, steps: int | None = None, batch_size: int = 256, clip: float = 1.0,
                 lr: float = 0.1,
                 seed: int | None = None, accountant: str = "pld", engine: str = "ghost", microbatch_size: int = 512,
                 known_layers: ghost.Registry = ghost.KNOWN_LAYERS, noise_source: NoiseSource | None = None,
                 allow_large_delta: bool = False, split: Callable[..., tuple[Tensor, Tensor]] | None = None,
                 inputs: tuple[str, ...] | None = None, **options: object) -> None:
        if (epochs is None) == (steps is None):
            raise _validate.DpoptError(f"epochs={epochs!r}, steps={steps!r}: give exactly one of them")
        if split is not None and not isinstance(data, DataLoader):
            raise _validate.DpoptError(f"split= takes (x, y) out of a DataLoader's batches, and data is a "
                                       f"{type(data).__name__}: pass DataLoader(dataset, collate_fn=...) as data")
        if any(type(p).__module__.startswith("torch.distributed.tensor") for p in module.parameters()):
            raise _validate.DpoptError(
                f"module={type(module).__name__} has parameters sharded over processes (DTensor, e.g. by FSDP's "
                "fully_shard), which dpopt cannot compute per-record gradients of: give Private the unsharded module "
                "(dpopt.distributed.Sharded with dpopt.run shards the records of each batch, not the parameters)")
        self.module = module
        if hf.is_hf(module):  # keyword inputs, packed into one tensor per record (dpopt.oracles.hf)
            module, data, split = hf.prepared(module, data, split, inputs)
        elif inputs is not None:
            raise _validate.DpoptError(f"inputs={inputs!r} names the keyword inputs of a Hugging Face model; "
                                       f"module={type(module).__name__} is not one")
        source = Loaded(data, split, microbatch_size) if isinstance(data, DataLoader) else records.of(data)
        self.oracle = TorchModel(module, loss_fn, source, engine=engine, microbatch_size=microbatch_size,
                                 known_layers=known_layers)
        n = self.oracle.n
        if isinstance(algorithm, str):
            entry = private_entry(algorithm, epsilon)
            if epsilon is None:
                raise _validate.DpoptError(f"epsilon=None keeps the noise multipliers of an algorithm object; "
                                           f"algorithm={algorithm!r} by name needs an epsilon to calibrate to")
            algorithm = entry.build(registry.Knobs.of(n, batch_size=batch_size, lr=lr, clip=clip, **options))
        elif options:
            raise _validate.DpoptError(f"options {sorted(options)} build an algorithm by name; algorithm="
                                       f"{type(algorithm).__name__} is already built")
        if steps is None:
            assert epochs is not None  # (exactly one of them: checked above)
            steps = steps_for_epochs(algorithm, n, epochs)
        self.plan: Plan[Any] = plan_for(algorithm, n=n, steps=steps, delta=delta, epsilon=epsilon,
                                        accountant=accountant, allow_large_delta=allow_large_delta)
        self.seed = seed
        self.theta0 = self.oracle.flat_params().to(torch.float64)
        self.stepper = Watched.start(self.plan, self.oracle, theta0=self.theta0, seed=seed, noise_source=noise_source)
        names = set(self.oracle.layout.names)
        self._params = [p for name, p in self.oracle.module.named_parameters() if name in names]
        self._own_update: bool | None = None  # step() (True) or backward() (False), fixed by the first call

    @property
    def algorithm(self) -> Algorithm[object]:
        """The plan's algorithm, its noise calibrated."""
        return self.plan.algorithm

    @property
    def steps(self) -> int:
        """The planned steps."""
        return self.plan.steps

    @property
    def delta(self) -> float:
        return self.plan.delta

    # ------------------------------------------------------------------------------ the loop

    @property
    def t(self) -> int:
        """Steps taken."""
        return self.stepper.t

    @property
    def run_id(self) -> str:
        """The run's id (the journal's name for it; a resumed run takes its checkpoint's)."""
        return self.stepper.run

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[int]:
        """The remaining step numbers t, up to the planned steps; each iteration must take its
        step (``backward()`` or ``step()``)."""
        while self.stepper.t < self.steps:
            t = self.stepper.t
            yield t
            if self.stepper.t == t:
                raise _validate.DpoptError(f"step={t} was not taken: call private.backward() (or private.step()) once "
                                           "in every iteration over private")

    def backward(self) -> None:
        """Step t: draw B_t, release g̃_t (the algorithm's ``step``; its event goes to the ledger)
        and write it into the parameters' ``.grad`` (replacing what was there), at the
        parameters' dtype and device. The gradients are taken at the module's current
        parameters."""
        if not isinstance(self.algorithm, Directed):
            raise _validate.DpoptError(
                f"algorithm={type(self.algorithm).__name__} has no private gradient for an optimizer of your own: its "
                "update is not θ ← θ − η·g (O2NC: its release is the gradient at a random point between iterates and "
                "drives a clipped increment; DP-AGD: the step size is itself a private choice; R-AClip: stages "
                "restart from an average). Use Private.step() (its own update) or dpopt.fit")
        self._mode(own_update=False)
        self.stepper.state = self.algorithm.moved(self.stepper.state, self._theta())
        self._advance()
        direction = self.algorithm.direction(self.stepper.state)
        views = self.oracle.layout.views(direction)
        for name, param in zip(self.oracle.layout.names, self._params):
            param.grad = views[name].to(param.device, param.dtype).clone()

    def step(self) -> None:
        """Step t with the algorithm's own update (as :func:`dpopt.run` takes it); the module's
        parameters then hold the iterate θ_{t+1} (the state keeps it in float64)."""
        self._mode(own_update=True)
        self._advance()
        self.oracle.load(self.stepper.state.theta)

    def _advance(self) -> None:
        if self.stepper.t >= self.steps:
            raise _validate.DpoptError(f"step={self.stepper.t}: the {self.steps} planned steps are done; the noise "
                                       "was calibrated for them and another step would spend more than epsilon")
        self.stepper.step()

    def _mode(self, *, own_update: bool) -> None:
        if self._own_update is None:
            self._own_update = own_update
        elif self._own_update != own_update:
            raise _validate.DpoptError("backward() and step() cannot be mixed in one run: backward() hands the "
                                       "private gradient to your optimizer, step() applies the algorithm's own update")

    def _theta(self) -> Tensor:
        """θ: the module's current parameters, flat, in float64."""
        return self.oracle.flat_params().to(torch.float64)

    # ---------------------------------------------------------------------- what it releases

    @property
    def ledger(self) -> Ledger:
        """The events of the releases so far."""
        return self.stepper.ledger

    def noise_variance(self) -> float:
        """Φ_t: the variance per coordinate of the noise in the last private gradient (what
        ``backward()`` wrote into ``.grad``), for a bias correction such as
        :class:`dpopt.optim.AdamBC`: (z·Δ/b)² for DP-SGD, with banded noise the variance of row t of
        C⁻¹ times that, with adaptive clipping (z_grad·C_t/b)². A public quantity (the
        hyper-parameters, the step and released values): subtracting it is post-processing."""
        if not isinstance(self.algorithm, NoiseVariance):
            raise _validate.DpoptError(f"algorithm={type(self.algorithm).__name__} does not state the noise variance "
                                       "of its private gradient (DP-SGD, DP-GD, RRPSGD and AClip do)")
        if self.stepper.t == 0:
            raise _validate.DpoptError("no private gradient yet: call private.backward() first")
        return self.algorithm.release_variance(self.stepper.state)

    def epsilon(self) -> float:
        """The guarantee ε(δ) of the steps so far (a privacy filter: its total), the ledger
        checked against the planned event."""
        return self.stepper.epsilon()

    def output(self) -> Tensor:
        """The algorithm's output θ (flat, float64): its output rule (last iterate, RRPSGD's
        random iterate, AClip's average) over the iterates so far."""
        if self._own_update is False:
            assert isinstance(self.algorithm, Directed)  # backward() refuses any other
            return self.algorithm.output(self.algorithm.moved(self.stepper.state, self._theta()))
        return self.algorithm.output(self.stepper.state)

    def load_output(self) -> nn.Module:
        """Write :meth:`output` into the module; returns it."""
        return self.oracle.load(self.output())

    def diagnostics(self) -> LossToWatch:
        """NOT PRIVATE: ``{"label": NOT_PRIVATE, "step": t, "train_loss": …}``, a loss to watch.

        ``train_loss`` is the mean of ℓ_i(θ) = ``loss_fn(module(x_i), y_i)`` over the realised batch
        of the last step taken, at the point θ its gradients were taken (the module's parameters
        when ``backward()`` was called): exactly the per-record losses those gradients are of,
        from the forward the engine ran for them, so reading it costs no second forward and
        changes neither θ nor any release. NaN before the first step, for an empty batch, and for
        an algorithm whose step takes no gradient at its iterate (O2NC: at random points). It is
        computed from the training records without noise, and the batch drawn is itself secret:
        no ε covers it. The label goes with the value: keep both, and do not publish it."""
        return {"label": NOT_PRIVATE, "step": self.t, "train_loss": self.stepper.train_loss}

    # ---------------------------------------------------------------------------- checkpoints

    def _described(self) -> dict[str, str]:
        """The settings a checkpoint of this run must match (:func:`dpopt.resume.describe`)."""
        return resume.describe(self.algorithm, self.oracle, steps=self.steps, delta=self.delta,
                               seed="from the operating system" if self.seed is None else self.seed)

    def save(self, path: str | Path) -> None:
        """Write the run's snapshot (secret: it holds the generators) to ``path``, atomically, tagged
        under the user's checkpoint key; the journal records it as the run's latest checkpoint
        (:func:`dpopt.snapshot.write`). After ``backward()`` its θ is the module's parameters."""
        saved = self.stepper.snapshot(self._described())
        if self._own_update is False:
            assert isinstance(self.algorithm, Directed)  # backward() refuses any other
            saved = dataclasses.replace(saved, state=self.algorithm.moved(saved.state, self._theta()))
        snapshot.write(Path(path), saved, journal.key())

    def resume(self, path: str | Path) -> None:
        """Continue from a :meth:`save` of the same run (same algorithm, data, model, steps, δ and
        seed), whose tag verifies under the user's key and whose ledger records exactly what the
        plan spends in its steps; the module gets the saved θ. Refused if that checkpoint was
        resumed before or its run has a later one (:func:`dpopt.snapshot.read`). The generators:
        the saved ones with a seed, else new ones from the operating system."""
        saved = snapshot.read(Path(path), journal.key(), settings=self._described(), plan=self.plan,
                              stop_at=self.steps, once=True, progress=False)
        self.stepper.restore(saved)
        if self.seed is None:
            self._redraw()
        self.oracle.load(saved.theta)

    def _redraw(self) -> None:
        """New secret states of both generators, from the operating system."""
        sample_gen, source, _ = randomness(None)
        self.stepper.sample_gen.set_state(sample_gen.get_state())
        self.stepper.source.generator.set_state(source.generator.get_state())
