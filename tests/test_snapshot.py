"""One run state and one checkpoint format: ``Stepper.snapshot()`` and ``Stepper.restore()`` continue
a run bit for bit, ``dpopt.run`` and ``dpopt.Private`` write the same :class:`~dpopt.snapshot.Snapshot`
(each refusing the other's), and a checkpoint of the format before it (a table of keys) is refused
in one line."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch

from dpopt import checkpoint, journal
from dpopt._validate import DpoptError
from dpopt.accounting import Ledger
from dpopt.plan import Plan
from dpopt.snapshot import Snapshot
from dpopt.train import Stepper
from tests.test_checkpoint import STEPS, dpsgd, partial_checkpoint, problem, resumed
from tests.test_private import advance, started

AT = 4  # the step a run is snapshotted at


def stepper(seed: int) -> Stepper:
    return Stepper.start(Plan(dpsgd(), n=200, steps=STEPS, delta=1e-5), problem(), theta0=torch.zeros(4).double(),
                         seed=seed)


def continued(restore: Callable[[Stepper, Snapshot], None]) -> tuple[torch.Tensor, Ledger]:
    """θ and the ledger at the end of a run snapshotted after AT steps and restored by ``restore``
    into a stepper started with another seed."""
    first = stepper(seed=3)
    for _ in range(AT):
        first.step()
    saved = first.snapshot({"seed": "3"})
    first.step()  # DP-SGD steps to a new state: the snapshot taken before is unchanged
    second = stepper(seed=99)
    restore(second, saved)
    assert second.t == AT and second.run == first.run
    while second.t < STEPS:
        second.step()
    return second.state.theta, second.ledger


def uninterrupted() -> tuple[torch.Tensor, Ledger]:
    whole = stepper(seed=3)
    for _ in range(STEPS):
        whole.step()
    return whole.state.theta, whole.ledger


def same(got: tuple[torch.Tensor, Ledger], want: tuple[torch.Tensor, Ledger]) -> bool:
    return torch.equal(got[0], want[0]) and got[1].event() == want[1].event()


def test_a_restored_snapshot_continues_the_run_bit_for_bit():
    assert same(continued(Stepper.restore), uninterrupted())


def leaving_out(part: str) -> Callable[[Stepper, Snapshot], None]:
    """A mutant of :meth:`Stepper.restore` that keeps the stepper's own ``part``."""
    def restore(into: Stepper, saved: Snapshot) -> None:
        own = {"sample_gen": into.sample_gen.get_state(), "noise_gen": into.source.generator.get_state(),
               "ledger": into.ledger.state()}
        Stepper.restore(into, dataclasses.replace(saved, **{part: own[part]}))
    return restore


@pytest.mark.parametrize("part", ["sample_gen", "noise_gen", "ledger"])
def test_the_restore_test_catches_a_restore_that_leaves_out(part):
    """Each part of the snapshot matters: restored without it, the run ends elsewhere (the
    generators: another θ) or with a ledger of only the steps after the restore."""
    assert not same(continued(leaving_out(part)), uninterrupted())


def test_a_snapshot_is_frozen():
    saved = stepper(seed=3).snapshot({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        saved.step = 5  # type: ignore[misc]
    assert torch.equal(saved.theta, saved.state.theta)


def test_run_and_private_write_one_format_and_refuse_each_others(tmp_path):
    path = partial_checkpoint(tmp_path)  # dpopt.run, stopped after 12 steps
    saved = checkpoint.load(path)
    assert isinstance(saved, Snapshot) and saved.step == 12 and saved.progress is not None
    assert len(saved.progress.records) == 3 and Ledger.from_state(saved.ledger).steps == 12
    private, sgd = started(seed=1)
    advance(private, sgd, 2)
    private.save(tmp_path / "private.ckpt")
    kept = checkpoint.load(tmp_path / "private.ckpt")
    assert isinstance(kept, Snapshot) and kept.step == 2 and kept.progress is None and kept.run == private.run_id
    with pytest.raises(DpoptError, match=r"^checkpoint='.*private.ckpt' is a checkpoint of dpopt.Private, not of "
                                         r"dpopt.run; it was not used$"):
        resumed(dpsgd(), problem(), tmp_path / "private.ckpt", STEPS)
    with pytest.raises(DpoptError, match=r"^checkpoint='.*checkpoint.pt' is a checkpoint of dpopt.run, not of "
                                         r"dpopt.Private; it was not used$"):
        started(seed=1)[0].resume(path)


def as_before(saved: Snapshot) -> dict[str, object]:
    """``saved`` in the format before the snapshot: the table of keys ``dpopt.run`` wrote (with
    ``progress``) or ``dpopt.Private`` did (without)."""
    common = {"step": saved.step, "state": saved.state, "sample_gen": saved.sample_gen, "noise_gen": saved.noise_gen,
              "ledger": saved.ledger, "run": saved.run}
    if saved.progress is None:
        return common | {"private": saved.settings}
    return common | {"settings": saved.settings} | {
        field.name: getattr(saved.progress, field.name) for field in dataclasses.fields(saved.progress)}


def test_a_checkpoint_of_the_format_before_is_refused_in_one_line(tmp_path):
    """The format before (tagged under the user's key, every check of its contents passed) resumed;
    it is now refused in one line saying why and what to do, and the file is kept."""
    path = partial_checkpoint(tmp_path)
    checkpoint.save(path, as_before(checkpoint.load(path)), journal.key())
    before = path.read_bytes()
    with pytest.raises(DpoptError) as err:
        resumed(dpsgd(), problem(), path, STEPS)
    assert str(err.value) == (f"checkpoint={str(path)!r} is not a checkpoint of dpopt.run (it holds other data, or was "
                              "written by an earlier dpopt, whose checkpoints are not read); it was not used: start "
                              "the run again in another --out")
    assert path.read_bytes() == before
    private, sgd = started(seed=1)
    advance(private, sgd, 2)
    private.save(tmp_path / "private.ckpt")
    checkpoint.save(tmp_path / "private.ckpt", as_before(checkpoint.load(tmp_path / "private.ckpt")), journal.key())
    with pytest.raises(DpoptError, match=r"^checkpoint='.*private.ckpt' is not a checkpoint of dpopt.Private \(it "
                                         r"holds other data, or was written by an earlier dpopt"):
        started(seed=1)[0].resume(tmp_path / "private.ckpt")
