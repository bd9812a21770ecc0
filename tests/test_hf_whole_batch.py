"""The ghost engine runs a Hugging Face model of a tested architecture once on the whole batch, as a
non-private step does, with its ghost layers tapped (dpopt.oracles.ghost.blocks.run_block); every
other block stays per record under vmap. Exactness per record is held by tests/test_hf.py."""

from __future__ import annotations

import importlib
import inspect

import pytest
import torch
from torch import nn

pytest.importorskip("transformers")
pytest.importorskip("peft")

from dpopt._validate import DpoptError  # noqa: E402
from dpopt.oracles import TorchModel, ghost, hf  # noqa: E402
from dpopt.oracles.ghost import stages  # noqa: E402
from tests.test_hf import FULL, _engine_rows, _lora, _records, _tiny  # noqa: E402


@pytest.mark.parametrize("kind", ["gpt2-cls", "bert", "llama-cls"])
def test_a_tested_architecture_runs_once_on_the_whole_batch(kind):
    """Before: the model ran record by record under vmap ("vmap"), and Llama's RMSNorm weights were
    dense per-record parameters of that block."""
    _, _, oracle = _engine_rows(_tiny(kind, tied=False), kind, _records(kind), "ghost")
    rules = dict(oracle.rules())
    assert rules["<model>"] == "whole batch"
    assert set(rules.values()) == {"whole batch", "ghost"}
    if kind == "llama-cls":
        assert rules["model.model.norm"] == "ghost"


@pytest.mark.parametrize("kind", ["gpt2-cls", "llama-lm", "bert", "roberta", "vit"])
def test_lora_runs_on_the_whole_batch(kind):
    _, _, oracle = _engine_rows(_lora(kind), kind, _records(kind), "ghost")
    assert dict(oracle.rules())["<model>"] == "whole batch"


def test_whole_batch_names_only_architectures_whose_records_the_tests_hold_exact():
    tested = {_tiny(kind).config.model_type for kind in FULL}
    assert set(hf.WHOLE_BATCH) <= tested


def test_tied_embeddings_and_own_parameters_keep_the_per_record_block():
    """A tied table (one parameter in two layers) and ViT's class token are no ghost layer's: the
    model stays per record, where their gradients are exact."""
    for kind in ("gpt2-lm", "vit"):
        _, _, oracle = _engine_rows(_tiny(kind), kind, _records(kind), "ghost")
        assert dict(oracle.rules())["<model>"] == "vmap"


def test_the_rmsnorm_layers_known_by_name_share_llamas_forward():
    """The "rmsnorm" rule recomputes Llama's x̂; each class it names by qualified name has that forward."""
    reference = inspect.getsource(importlib.import_module(
        "transformers.models.llama.modeling_llama").LlamaRMSNorm.forward)
    for name in stages.RMSNORMS:
        module, _, cls = name.rpartition(".")
        assert inspect.getsource(getattr(importlib.import_module(module), cls).forward) == reference, name


class _Tokens(nn.Module):
    """Per record a Linear over the positions; ``flat`` lays the batch's positions out as one record
    ([1, B·T, p]), so that on the whole batch the Linear's rows are not the records."""

    def __init__(self, flat: bool = False, centred: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear, self.flat, self.centred = nn.Linear(3, 2).double(), flat, centred

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x - x.mean(0, keepdim=True) if self.centred else x  # centred: mixes the records of a batch
        if self.flat:
            return self.linear(h.reshape(1, -1, 3)).reshape(len(x), -1, 2).sum(1)
        return self.linear(h).sum(1)


def _oracle(module: nn.Module, registered: bool) -> TorchModel:
    g = torch.Generator().manual_seed(1)
    X, y = torch.randn(6, 4, 3, generator=g, dtype=torch.float64), torch.randint(0, 2, (6,), generator=g)
    known = ghost.KNOWN_LAYERS.with_per_record(_Tokens) if registered else ghost.KNOWN_LAYERS
    return TorchModel(module, lambda out, t: nn.functional.cross_entropy(out, t, reduction="none"), X, y,
                      known_layers=known)


def test_a_registered_block_whose_layer_rows_are_not_the_records_is_refused():
    oracle = _oracle(_Tokens(flat=True), registered=True)
    with pytest.raises(DpoptError, match=r"layer 'linear' gave an output of shape \(1, 24, 2\) on the whole batch "
                                         r"where each record's was \(1, 4, 2\), so its rows are not the records"):
        oracle.per_record(oracle.flat_params(), torch.arange(6))


def _rows(oracle: TorchModel) -> torch.Tensor:
    rows = oracle.per_record(oracle.flat_params(), torch.arange(6))
    return torch.stack([rows.weighted_sum(w) for w in torch.eye(6, dtype=torch.float64)])


def test_the_whole_batch_is_only_as_true_as_the_registry_catches_a_mixing_block_registered():
    """Unregistered, the centring block runs per record under vmap: record 0's gradient is that of
    record 0 alone. The mutant registers it as acting per record: it runs on the whole batch and
    record 0's gradient then depends on the others (the registry's claim is the guarantee)."""
    honest, mutant = _oracle(_Tokens(centred=True), False), _oracle(_Tokens(centred=True), True)
    assert dict(honest.rules())["<model>"] == "vmap" and dict(mutant.rules())["<model>"] == "whole batch"
    alone = _oracle(_Tokens(centred=True), False)
    alone_rows = torch.stack([_rows_of_one(alone, i) for i in range(6)])
    torch.testing.assert_close(_rows(honest), alone_rows, rtol=0, atol=1e-12)
    assert float((_rows(mutant) - alone_rows).abs().max()) > 1e-2


def _rows_of_one(oracle: TorchModel, i: int) -> torch.Tensor:
    return oracle.per_record(oracle.flat_params(), torch.tensor([i])).weighted_sum(torch.ones(1, dtype=torch.float64))



class _Doubled(nn.Module):
    """Per record a Linear over the positions whose output the forward then doubles in place."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(3, 2).double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear(x)
        h.mul_(2)
        return h.sum(1)


def test_an_output_written_in_place_after_its_call_is_tapped_by_its_probe():
    """On the whole batch a call's gradient is taken at its own output, which is that call's output
    gradient only while nothing writes into it: here the forward doubles it in place, the engine sees
    the version change and runs the block again with probes. The mutant that trusts the output anyway
    takes the gradient of the doubled value: every record's gradient comes out halved."""
    from dpopt.oracles.ghost import blocks

    def doubled(registered: bool) -> TorchModel:
        g = torch.Generator().manual_seed(1)
        X, y = torch.randn(6, 4, 3, generator=g, dtype=torch.float64), torch.randint(0, 2, (6,), generator=g)
        known = ghost.KNOWN_LAYERS.with_per_record(_Doubled) if registered else ghost.KNOWN_LAYERS
        return TorchModel(_Doubled(), lambda out, t: nn.functional.cross_entropy(out, t, reduction="none"), X, y,
                          known_layers=known)

    honest, alone = doubled(True), doubled(False)
    assert dict(honest.rules())["<model>"] == "whole batch" and dict(alone.rules())["<model>"] == "vmap"
    alone_rows = torch.stack([_rows_of_one(alone, i) for i in range(6)])
    torch.testing.assert_close(_rows(honest), alone_rows, rtol=0, atol=1e-12)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(blocks._Tap, "written_in_place", lambda self: False)
        torch.testing.assert_close(_rows(doubled(True)), alone_rows / 2, rtol=0, atol=1e-12)
