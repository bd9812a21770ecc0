"""Checkpoints: loading runs no code, any corruption is a one-line refusal, resuming checks the
ledger against the plan and the settings (data included) against the run, and every algorithm's
state survives a checkpoint bit for bit."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import math
import os
import pickle
import shutil
import stat
from pathlib import Path

import dp_accounting as dpa
import pytest
import torch

import dpopt
from dpopt import checkpoint, codec, journal
from dpopt._validate import DpoptError
from dpopt.accounting import Ledger
from dpopt.cli import main
from dpopt.snapshot import Snapshot
from tests.contracts.test_algorithms import NAMES, TABLE, oracle

STEPS, EVERY = 30, 4


def problem(seed: int = 0) -> dpopt.oracles.Logistic:
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(200, 4, generator=gen, dtype=torch.float64)
    return dpopt.oracles.Logistic(X, torch.where(X[:, 0] > 0, 1.0, -1.0))


def dpsgd(lr: float = 0.5) -> dpopt.DPSGD:
    return dpopt.DPSGD(lr=lr, clip=1.0, noise_multiplier=1.0, batch_size=20)


class Stop(Exception):
    """A run interrupted half-way."""


def interrupted(algo, data, path: Path, steps: int, at: int, **settings) -> None:
    """Run until the ``at``-th log point (log and checkpoint every EVERY steps), then stop: the last
    checkpoint is of step (at - 1)·EVERY."""
    def stop(theta: torch.Tensor) -> float:
        stop.calls += 1
        if stop.calls == at:
            raise Stop
        return 0.0

    stop.calls = 0
    with pytest.raises(Stop):
        dpopt.run(algo, data, steps=steps, log_every=EVERY, checkpoint_path=path, checkpoint_every=EVERY,
                  test_error=stop, **settings)


def resumed(algo, data, path: Path, steps: int, **settings) -> dpopt.History:
    return dpopt.run(algo, data, steps=steps, log_every=EVERY, checkpoint_path=path, checkpoint_every=EVERY,
                     **settings)


def partial_checkpoint(tmp_path: Path) -> Path:
    """A DP-SGD checkpoint after 12 of STEPS steps."""
    path = tmp_path / "checkpoint.pt"
    interrupted(dpsgd(), problem(), path, STEPS, at=4)
    assert checkpoint.load(path).step == 12
    return path


# ------------------------------------------------------------------ every algorithm, bit for bit


@pytest.mark.parametrize("name", NAMES)
def test_every_algorithm_resumes_to_the_uninterrupted_run(tmp_path, name):
    case = TABLE[name]
    algo, path = case.make(1.0, 1.0), tmp_path / "checkpoint.pt"
    interrupted(algo, oracle(), path, case.steps, at=case.steps // (2 * EVERY) + 1, seed=3)
    assert 0 < checkpoint.load(path).step < case.steps
    got = resumed(algo, oracle(), path, case.steps, seed=3)
    want = dpopt.run(algo, oracle(), steps=case.steps, log_every=EVERY, seed=3)
    assert torch.equal(got.theta, want.theta)
    assert [r["epsilon"] for r in got.records] == [r["epsilon"] for r in want.records]
    assert got.final["epsilon"] == want.final["epsilon"]


# ------------------------------------------------------------------ finding 1: no code runs on load


class Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("writer", ["torch.save", "pickle"])
def test_a_pickle_in_the_checkpoint_runs_no_code(tmp_path, writer):
    marker, path = tmp_path / "pwned", tmp_path / "checkpoint.pt"
    buffer = io.BytesIO()
    torch.save({"step": Evil(marker)}, buffer) if writer == "torch.save" else pickle.dump(Evil(marker), buffer)
    path.write_bytes(buffer.getvalue())
    with pytest.raises(DpoptError, match=r"^checkpoint='.*checkpoint.pt' is not a dpopt checkpoint of format 1 or 2 "
                                         r"\(checkpoints of earlier versions were pickles, which are not loaded"):
        resumed(dpsgd(), problem(), path, STEPS)
    assert not marker.exists()


def test_the_command_line_refuses_a_pickle_checkpoint_in_one_line(tmp_path, capsys):
    marker, out = tmp_path / "pwned", tmp_path / "out"
    out.mkdir()
    (out / "checkpoint.pt").write_bytes(pickle.dumps(Evil(marker)))
    argv = ["run", "--algorithm", "dp-sgd", "--dataset", "adult", "--epsilon", "1", "--steps", "5", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("dpopt: error: checkpoint=") and "is not a dpopt checkpoint" in err
    assert err.count("\n") == 1 and not marker.exists()


def test_decoding_builds_only_dpopt_records_and_dp_accounting_events():
    for node in ({"object": ["os", "system", {"command": "true"}]},
                 {"object": ["dpopt.checkpoint", "os", {}]},       # a module, not a dpopt class
                 {"object": ["dpopt.train", "Path", {}]},          # imported into dpopt, defined elsewhere
                 {"object": ["dpopt._validate", "DpoptError", {}]},  # a dpopt class, neither NamedTuple nor dataclass
                 {"event": ["PrivacyAccountant", {}]},
                 {"event": ["os.system", {}]},
                 {"tensor": "t9"}, {"float": "1e400"}, {"set": []}, {"tuple": [], "dict": {}}):
        with pytest.raises(codec.CodecError):
            codec.decode(node, {})


def test_the_codec_round_trips_what_a_state_holds():
    shared = torch.arange(3.0)
    value = {"floats": (math.inf, -math.inf, 0.1, -0.0, 1e-310), "ints": [0, -1, 2**62, True, None], "s": "é",
             "shared": (shared, shared), "gen": torch.Generator().manual_seed(5).get_state(),
             "event": dpa.ComposedDpEvent([dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(1.5), 3),
                                           dpa.SingleEpochTreeAggregationDpEvent(0.7, [3, 4])]),
             "state": dpopt.algorithms.dp_agd.DPAGDState(torch.ones(2), math.inf, 0.25, 1.0, (0.5,), False)}
    data, tensors = codec.encode(value)
    back = codec.decode(json.loads(json.dumps(data, allow_nan=False)), tensors)
    assert back["floats"] == value["floats"] and math.copysign(1, back["floats"][3]) == -1
    assert back["ints"] == value["ints"] and back["s"] == "é" and back["event"] == value["event"]
    assert back["shared"][0] is back["shared"][1] and torch.equal(back["shared"][0], shared)
    assert torch.equal(back["gen"], value["gen"]) and back["gen"].dtype == torch.uint8
    assert type(back["state"]) is type(value["state"]) and back["state"].chosen == (0.5,)
    assert math.isnan(codec.decode(*codec.encode(math.nan)))
    with pytest.raises(codec.CodecError, match="cannot hold a value of type builtins.set"):
        codec.encode({1, 2})


# ------------------------------------------------------------------ finding 2: corruption, tampering


def flipped(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("where", [0, 25, 100, 0.5, 0.9, -1])
def test_a_flipped_bit_anywhere_is_a_one_line_refusal(tmp_path, where):
    path = partial_checkpoint(tmp_path)
    size = path.stat().st_size
    flipped(path, where if isinstance(where, int) else int(where * size))
    with pytest.raises(DpoptError, match=r"^checkpoint='.*' is (corrupt or truncated|not a dpopt checkpoint)") as err:
        resumed(dpsgd(), problem(), path, STEPS)
    assert "\n" not in str(err.value) and "delete" not in str(err.value)


def test_a_flipped_bit_in_the_ledger_count_no_longer_lowers_epsilon(tmp_path):
    """The reproduction: one bit of the ledger's step count (12 -> 4) flipped inside the file."""
    path = partial_checkpoint(tmp_path)
    data = path.read_bytes()
    at = data.index(b'"GaussianDpEvent"')
    at = data.index(b"},12]}", at) + 2  # the count of the ledger's one run
    flipped(path, at)                    # "12" -> "02"
    with pytest.raises(DpoptError, match="is corrupt or truncated"):
        resumed(dpsgd(), problem(), path, STEPS)


@pytest.mark.parametrize("keep", [0, 10, 84, 0.5, -1])
def test_a_truncated_checkpoint_is_a_one_line_refusal(tmp_path, keep):
    path = partial_checkpoint(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[:keep if isinstance(keep, int) else int(keep * len(data))])
    with pytest.raises(DpoptError, match=r"^checkpoint='.*' is (corrupt or truncated|not a dpopt checkpoint)"):
        resumed(dpsgd(), problem(), path, STEPS)


def rewritten(path: Path, change) -> None:
    """``path`` with its snapshot replaced by ``change(saved)``, its digest recomputed and tagged
    under the user's key: a forgery by someone holding the key, which the content checks behind
    the tag still refuse."""
    checkpoint.save(path, change(checkpoint.load(path)), journal.key())


def test_a_ledger_below_the_plan_is_refused_even_with_a_valid_digest(tmp_path):
    path = partial_checkpoint(tmp_path)

    def fewer(saved):
        ledger = Ledger.from_state(saved.ledger)
        (event, count), = ledger.state()["runs"]
        return dataclasses.replace(saved, ledger=ledger.state() | {"runs": [(event, count - 8)]})

    rewritten(path, fewer)
    with pytest.raises(DpoptError, match=r"records a ledger of 4 events after 12 steps that is not what the plan "
                                         r"spends in those steps; it was not used$"):
        resumed(dpsgd(), problem(), path, STEPS)


def test_a_ledger_of_other_events_is_refused(tmp_path):
    path = partial_checkpoint(tmp_path)

    def weaker(saved):
        (event, count), = saved.ledger["runs"]
        noisier = dpa.PoissonSampledDpEvent(event.sampling_probability, dpa.GaussianDpEvent(50.0))
        return dataclasses.replace(saved, ledger=saved.ledger | {"runs": [(noisier, count)]})

    rewritten(path, weaker)
    with pytest.raises(DpoptError, match="is not what the plan spends"):
        resumed(dpsgd(), problem(), path, STEPS)


def test_a_budget_ledger_above_its_budget_is_refused(tmp_path):
    """DP-AGD's plan is a privacy filter's total: its ledger may spend less, never more."""
    case, path = TABLE["dpagd"], tmp_path / "checkpoint.pt"
    algo = case.make(1.0, 1.0)
    interrupted(algo, oracle(), path, case.steps, at=case.steps // (2 * EVERY) + 1)

    def overspent(saved):
        return dataclasses.replace(saved, ledger=saved.ledger | {
            "runs": saved.ledger["runs"] + [(dpa.ZCDpEvent(algo.rho_total), 1)]})

    rewritten(path, overspent)
    with pytest.raises(DpoptError, match=r"the run spent rho=.* of a zCDP filter of rho=0.5; it was not used"):
        resumed(algo, oracle(), path, case.steps)


def test_a_step_outside_the_run_is_refused(tmp_path):
    path = partial_checkpoint(tmp_path)
    rewritten(path, lambda saved: dataclasses.replace(saved, step=STEPS + 1))
    with pytest.raises(DpoptError, match=rf"records step={STEPS + 1}, not a step in \[0, {STEPS}\] of this run"):
        resumed(dpsgd(), problem(), path, STEPS)


# ----------------------------------------- issue 28, finding 8: checkpoints are authenticated and never rewound


def rewound(saved: Snapshot) -> Snapshot:
    """Step 12 rewound to step 4 together with its ledger: a checkpoint every check of its
    contents accepts, of a run whose data then passes through 12 + 26 noised steps, 30 counted."""
    (event, count), = saved.ledger["runs"]
    return dataclasses.replace(saved, step=4, ledger=saved.ledger | {"runs": [(event, 4)]})


@pytest.mark.parametrize("key, reason", [
    (None, "it carries no tag"),  # the format before the tag, its digest recomputed
    (journal.Key(bytes(32), Path("another")), "its tag does not verify under the checkpoint key '.*checkpoint.key', "
                                              "so it was edited after it was written, or written under another key")])
def test_a_checkpoint_rewound_with_its_ledger_is_refused(tmp_path, key, reason):
    """The reproduction: step and ledger rewound together, the digest recomputed."""
    path = partial_checkpoint(tmp_path)
    checkpoint.save(path, rewound(checkpoint.load(path)), key)
    with pytest.raises(DpoptError, match=rf"^checkpoint='.*checkpoint.pt' is not authenticated: {reason}"):
        resumed(dpsgd(), problem(), path, STEPS)


def test_a_rewind_by_a_holder_of_the_key_is_refused_by_the_journal(tmp_path):
    """Behind the tag, the journal: the run already checkpointed step 12."""
    path = partial_checkpoint(tmp_path)
    rewritten(path, rewound)
    with pytest.raises(DpoptError, match=r"holds step 4 of run [0-9a-f]{32}, which already checkpointed or resumed "
                                         r"step 12: resuming it would rewind the run"):
        resumed(dpsgd(), problem(), path, STEPS)


def test_the_rewind_tests_catch_a_resume_without_tag_and_journal(tmp_path, monkeypatch):
    """The mutant (the code before): neither the tag nor the journal checked. The rewound
    checkpoint is resumed, and its run ends with a ledger of 30 steps after 12 + 26 noised ones."""
    monkeypatch.setattr(journal, "resume", lambda *args, **kwargs: None)
    path = partial_checkpoint(tmp_path)
    checkpoint.save(path, rewound(checkpoint.load(path)), journal.key())  # as if the tag were not checked
    assert resumed(dpsgd(), problem(), path, STEPS).steps_done == STEPS
    assert Ledger.from_state(checkpoint.load(path).ledger).steps == STEPS


@pytest.mark.parametrize("mutant", [False, True])
def test_an_older_copy_of_a_run_checkpoint_is_refused(tmp_path, monkeypatch, mutant):
    """A copy of step 12's checkpoint, kept while the run went on to step 30, is not resumed (the
    mutant without the journal check resumes it); the latest checkpoint resumes, to the same run."""
    if mutant:
        monkeypatch.setattr(journal, "resume", lambda *args, **kwargs: None)
    path, copy = partial_checkpoint(tmp_path), tmp_path / "copy.pt"
    shutil.copy(path, copy)
    whole = resumed(dpsgd(), problem(), path, STEPS)
    if mutant:
        assert resumed(dpsgd(), problem(), copy, STEPS).steps_done == STEPS
        return
    with pytest.raises(DpoptError, match=r"^checkpoint='.*copy.pt' holds step 12 of run [0-9a-f]{32}, which already "
                                         r"checkpointed or resumed step 30: resuming it would rewind the run \(the "
                                         r"data would pass through more noised steps than its ε counts\); it was "
                                         r"not used. Resume the run's latest checkpoint, or start a new run in "
                                         r"another --out$"):
        resumed(dpsgd(), problem(), copy, STEPS)
    assert torch.equal(resumed(dpsgd(), problem(), path, STEPS).theta, whole.theta)


def test_what_the_journal_cannot_stop_a_user_who_deletes_its_entry(tmp_path):
    """Not protected (SECURITY.md): the journal is the user's own file. With the run's entry
    deleted, the older copy resumes; with the whole state folder gone, nothing does (new key)."""
    path, copy = partial_checkpoint(tmp_path), tmp_path / "copy.pt"
    shutil.copy(path, copy)
    resumed(dpsgd(), problem(), path, STEPS)
    (journal.folder() / "runs" / f"{checkpoint.load(copy).run}.json").unlink()
    assert resumed(dpsgd(), problem(), copy, STEPS).steps_done == STEPS


def test_the_command_line_refuses_a_checkpoint_of_another_key_in_one_line(tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    argv = ["run", "--algorithm", "dp-sgd", "--dataset", "adult", "--epsilon", "1", "--steps", "5", "--out", str(out)]
    assert main(argv) == 0
    (out / "history.json").unlink()  # an interrupted run: its checkpoint is what the next run resumes
    monkeypatch.setenv("DPOPT_STATE", str(tmp_path / "another user"))
    capsys.readouterr()
    assert main(argv) == 2
    err, other = capsys.readouterr().err, tmp_path / "another user" / "checkpoint.key"
    assert err.startswith(f"dpopt: error: checkpoint={str(out / 'checkpoint.pt')!r} is not authenticated: its tag "
                          f"does not verify under the checkpoint key {str(other)!r}")
    assert err.count("\n") == 1


def test_the_key_is_made_once_private_and_outside_out(tmp_path, monkeypatch):
    monkeypatch.setenv("DPOPT_STATE", str(tmp_path / "state"))
    key = journal.key()
    assert key == journal.key() and len(key.secret) == 32 and key.path == tmp_path / "state" / "checkpoint.key"
    assert stat.S_IMODE(key.path.stat().st_mode) == 0o600 and stat.S_IMODE(key.path.parent.stat().st_mode) == 0o700
    assert key.secret.hex() not in repr(key) and "secret" not in repr(key)
    assert sorted(p.name for p in key.path.parent.iterdir()) == ["checkpoint.key"]  # no temporary file left


RUN = ["run", "--algorithm", "dp-sgd", "--dataset", "adult", "--epsilon", "1", "--steps", "3"]


def refused(capsys, argv: list[str]) -> str:
    """The one line ``dpopt argv`` exits 2 with."""
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    return err.removeprefix("dpopt: error: ").rstrip("\n")


@pytest.mark.parametrize("command", ["run", "bench", "reproduce"])
def test_a_state_folder_inside_out_is_refused_by_every_command_that_writes_out(tmp_path, capsys, monkeypatch,
                                                                                command):
    """Finding: DPOPT_STATE inside --out was used, so the checkpoint key and the journal travelled
    (and were published) with the outputs, and whoever could write --out could replace them.
    run, bench and reproduce (the commands that write --out and use the state; tune writes no
    checkpoint) refuse it before any work, in one line saying how to fix it; a state folder beside
    --out is used."""
    from dpopt import experiments
    from tests.experiments.test_reproduce import _toy
    from tests.test_bench import TINY

    (tmp_path / "problems.toml").write_text(TINY.replace("seeds = 2", "seeds = 1").replace("[0.5, 2.0]", "[2.0]"))
    monkeypatch.setitem(experiments.EXPERIMENTS, "toy", _toy())
    argv = {"run": RUN, "bench": ["bench", "--file", str(tmp_path / "problems.toml"), "--workers", "1"],
            "reproduce": ["reproduce", "toy", "--seeds", "1", "--workers", "1"]}[command]
    out = tmp_path / "out"
    monkeypatch.setenv("DPOPT_STATE", str(out / "state"))
    assert refused(capsys, [*argv, "--out", str(out)]) == (
        f"the state folder {str(out / 'state')!r} (DPOPT_STATE) is inside out={str(out)!r}: the checkpoint key and "
        "the journal would travel with the outputs; set DPOPT_STATE to a folder outside --out")
    assert not (out / "state").exists() and not (out / "runs").exists() and not (out / "checkpoint.pt").exists()
    monkeypatch.setenv("DPOPT_STATE", str(tmp_path / "state"))
    assert main([*argv, "--out", str(out)]) == 0


def test_a_state_folder_open_to_others_is_refused_with_the_command_that_fixes_it(tmp_path, capsys, monkeypatch):
    """Finding: a state folder of mode 0777 (anyone may plant a key in it or rewind the journal) was
    used silently. It is refused, not repaired, in one line naming its mode and the fix; fixed, it
    is used."""
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o777)
    monkeypatch.setenv("DPOPT_STATE", str(state))
    line = (f"the state folder {str(state)!r} is open to other users (mode 0777): anyone who can read it knows the "
            "checkpoint key, anyone who can write it can plant one or rewind the journal; it was not used. Fix: chmod "
            f"700 {str(state)!r}, or set DPOPT_STATE to a new folder of your own")
    assert refused(capsys, [*RUN, "--out", str(tmp_path / "out")]) == line
    with pytest.raises(DpoptError, match=r"\(mode 0750\)"):
        state.chmod(0o750)  # readable by the group: it would know the key
        journal.key()
    state.chmod(0o700)
    assert main([*RUN, "--out", str(tmp_path / "out")]) == 0


def test_a_planted_key_open_to_others_is_refused(tmp_path, capsys, monkeypatch):
    """Finding: a checkpoint.key of mode 0644 holding chosen bytes was used, so a checkpoint verified
    under a key someone else knows. A key file group or others may read or write is refused, naming
    the fix; the key dpopt makes (0600) is used."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    planted = state / "checkpoint.key"
    planted.write_bytes(b"k" * 32)
    planted.chmod(0o644)
    monkeypatch.setenv("DPOPT_STATE", str(state))
    assert refused(capsys, [*RUN, "--out", str(tmp_path / "out")]) == (
        f"the checkpoint key {str(planted)!r} is open to other users (mode 0644): anyone who can read it knows the "
        "checkpoint key, anyone who can write it can plant one or rewind the journal; it was not used. Fix: delete it "
        "(dpopt makes a new key; checkpoints tagged under this one are then refused), or, if no one else ever had "
        f"access, chmod 600 {str(planted)!r}")
    assert not (tmp_path / "out" / "checkpoint.pt").exists()
    planted.unlink()
    assert main([*RUN, "--out", str(tmp_path / "out")]) == 0
    assert journal.key().secret != b"k" * 32


@pytest.mark.skipif(os.getuid() != 0, reason="giving a file to another user needs root (CI runs as root)")
def test_a_key_or_state_folder_of_another_user_is_refused(tmp_path, monkeypatch):
    state = tmp_path / "state"
    monkeypatch.setenv("DPOPT_STATE", str(state))
    key = journal.key()
    os.chown(key.path, 65534, -1)
    with pytest.raises(DpoptError, match=rf"^the checkpoint key '{key.path}' belongs to another user \(uid 65534, not "
                                         r"0\): what is in it may have been planted; it was not used. Fix: delete it"):
        journal.key()
    key.path.unlink()
    os.chown(state, 65534, -1)
    with pytest.raises(DpoptError, match=rf"^the state folder '{state}' belongs to another user \(uid 65534, not 0\)"):
        journal.key()


def test_a_journal_entry_not_written_by_dpopt_refuses_its_run(tmp_path):
    path = partial_checkpoint(tmp_path)
    run = checkpoint.load(path).run
    (journal.folder() / "runs" / f"{run}.json").write_text('{"latest": 0}')
    with pytest.raises(DpoptError, match=rf"^the journal entry '.*{run}.json' is not one dpopt wrote; without it no "
                                         r"checkpoint of its run is resumed \(start a new run in another --out\)$"):
        resumed(dpsgd(), problem(), path, STEPS)


# ------------------------------------------------------------------ finding 9: which run it belongs to


def test_the_refusal_names_the_first_differing_setting_and_keeps_the_checkpoint(tmp_path):
    path = partial_checkpoint(tmp_path)
    before = path.read_bytes()
    with pytest.raises(DpoptError) as err:
        resumed(dpsgd(), problem(), path, STEPS, seed=1)
    assert str(err.value) == (f"checkpoint={str(path)!r} belongs to another run: its seed is 'from the operating "
                              "system', this run's is 1; "
                              "resume with the same settings, or use another --out for a new run (keep the "
                              "checkpoint: it records the ε already spent)")
    with pytest.raises(DpoptError, match="its algorithm.noise_multiplier is 1.0, this run's is 2.0;"):
        resumed(dpopt.DPSGD(lr=0.5, clip=1.0, noise_multiplier=2.0, batch_size=20), problem(), path, STEPS)
    assert path.read_bytes() == before


def test_other_data_of_the_same_shape_is_another_run(tmp_path):
    path = partial_checkpoint(tmp_path)
    other = problem(seed=1)
    assert (other.n, other.dim) == (problem().n, problem().dim)
    with pytest.raises(DpoptError, match=rf"its data is {problem().data_digest}, this run's is "
                                         rf"{other.data_digest};"):
        resumed(dpsgd(), other, path, STEPS)


def test_the_data_digest_is_the_sha256_of_the_training_data():
    data = problem()
    want = hashlib.sha256()
    for tensor in (data.X, data.y):
        want.update(f"torch.float64{tuple(tensor.shape)};".encode() + tensor.numpy().tobytes())
    assert data.data_digest == want.hexdigest()
    model = dpopt.oracles.TorchModel(torch.nn.Linear(4, 1).double(), lambda out, y: (out[:, 0] - y) ** 2,
                                     data.X, data.y)
    assert model.data_digest == data.data_digest


def test_results_without_their_checkpoint_are_not_overwritten(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["run", "--algorithm", "dp-sgd", "--dataset", "adult", "--epsilon", "1", "--steps", "5", "--out", str(out)]
    assert main(argv) == 0
    (out / "checkpoint.pt").unlink()
    results = (out / "history.json").read_bytes()
    capsys.readouterr()
    assert main(argv) == 2
    assert capsys.readouterr().err == (f"dpopt: error: out={str(out)!r} holds the results of a run (history.json) "
                                       "but not its checkpoint.pt, so it cannot be resumed; use another --out for a "
                                       "new run\n")
    assert (out / "history.json").read_bytes() == results


def test_the_command_line_refuses_a_truncated_checkpoint_in_one_line(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["run", "--algorithm", "dp-sgd", "--dataset", "adult", "--epsilon", "1", "--steps", "5", "--out", str(out)]
    assert main(argv) == 0
    (out / "history.json").unlink()  # an interrupted run: its checkpoint is what the next run resumes
    data = (out / "checkpoint.pt").read_bytes()
    (out / "checkpoint.pt").write_bytes(data[:len(data) // 2])
    capsys.readouterr()
    assert main(argv) == 2
    assert capsys.readouterr().err == (f"dpopt: error: checkpoint={str(out / 'checkpoint.pt')!r} is corrupt or "
                                       "truncated (its sha256 does not match its contents); it was not used\n")


def test_a_checkpoint_is_read_in_a_process_that_has_not_imported_its_algorithm(tmp_path):
    """The algorithms are imported on first use: a checkpoint of DP-SRM's state is read by a fresh
    interpreter that has imported nothing but dpopt.checkpoint (a module outside dpopt is never
    imported: the codec test above refuses one)."""
    import subprocess
    import sys

    from dpopt.algorithms.dp_srm import DPSRMState
    from dpopt.algorithms._common import Output

    state = DPSRMState(torch.zeros(2), torch.ones(2), torch.zeros(2), Output(-1, torch.zeros(2)))
    checkpoint.save(tmp_path / "state.ckpt", {"state": state})
    code = (f"from dpopt import checkpoint; s = checkpoint.load({str(tmp_path / 'state.ckpt')!r})['state']; "
            "print(type(s).__name__, s.theta_prev.tolist())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "DPSRMState [1.0, 1.0]"


def test_a_loaded_checkpoint_is_freed_when_dropped_without_waiting_for_the_garbage_collector(tmp_path):
    """Reading builds no reference cycle around the tensors (a recursive closure in the decoder did:
    five cached feature files of 0.95 GB read one after another held 4.7 GB more than needed,
    until the collector ran, and the mnist-sota workers ran out of memory)."""
    import gc
    import weakref

    path = tmp_path / "value.ckpt"
    checkpoint.save(path, {"features": torch.zeros(1000, 10), "events": (1, [2.0, None])})
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        value = checkpoint.load(path)
        features = weakref.ref(value["features"])
        assert value["events"] == (1, [2.0, None])
        del value
        assert features() is None
    finally:
        if was_enabled:
            gc.enable()
