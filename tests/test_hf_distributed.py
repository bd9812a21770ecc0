"""A Hugging Face model in dpopt's data-parallel path: 2 gloo ranks give one process's run.

dpopt shards the records of each batch over the ranks (``dpopt.distributed.Sharded`` around the
model's ``TorchModel``), never the parameters: every rank holds the whole model. A GPT-2
classifier on padded records, DP-SGD with noise, in float64: both ranks end at the same θ, bit for
bit, and that θ is the one process's to 1e-10 (only the order of the all-reduced sums differs).
"""

from __future__ import annotations

import pytest
import torch

tf = pytest.importorskip("transformers")

import dpopt  # noqa: E402
from dpopt.algorithms import DPSGD  # noqa: E402
from dpopt.distributed import Sharded, launch  # noqa: E402
from dpopt.oracles import TorchModel, hf  # noqa: E402

N, T, V, STEPS, SEED = 12, 8, 40, 3, 11


def _oracle() -> TorchModel:
    """A tiny GPT-2 classifier (float64) on N right-padded records of different lengths."""
    torch.manual_seed(0)
    config = tf.GPT2Config(vocab_size=V, n_positions=T, n_embd=16, n_layer=2, n_head=2, num_labels=2, pad_token_id=0,
                           bos_token_id=1, eos_token_id=1)
    model = tf.GPT2ForSequenceClassification(config).double().eval()
    g = torch.Generator().manual_seed(1)
    mask = (torch.arange(T)[None] < torch.randint(2, T + 1, (N,), generator=g)[:, None]).long()
    records = {"input_ids": torch.randint(2, V, (N, T), generator=g).masked_fill(mask == 0, 0),
               "attention_mask": mask, "labels": torch.randint(0, 2, (N,), generator=g)}
    adapted = hf.Adapted(model, ("input_ids", "attention_mask"))
    return TorchModel(adapted, hf.classification_loss, hf.pack(records, adapted.keys), hf.labels_of(records))


def trained(sharded: bool) -> torch.Tensor:
    """θ after STEPS steps of DP-SGD (Poisson batches of expected size 6, C = 0.1, z = 1)."""
    torch.set_num_threads(1)
    oracle = _oracle()
    algorithm = DPSGD(lr=0.5, clip=0.1, noise_multiplier=1.0, batch_size=6)
    history = dpopt.run(algorithm, Sharded(oracle) if sharded else oracle, steps=STEPS, seed=SEED, delta=1e-3,
                        theta0=oracle.flat_params(), log_every=STEPS)
    return history.theta


def test_two_ranks_train_a_gpt2_classifier_as_one_process():
    first, second = launch(trained, 2, True)
    single = trained(False)
    assert torch.equal(first, second)
    assert float((first - single).abs().max()) <= 1e-10
    assert float((single - _oracle().flat_params()).abs().max()) > 1e-3  # it moved


def test_parameters_sharded_by_fsdp_are_refused_in_one_sentence(tmp_path):
    """FSDP2's DTensor parameters (here on one rank) are refused when Private is built. Before: on one
    rank nothing was said; on two, a view of a sharded DTensor failed deep inside torch."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from dpopt._validate import DpoptError

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        model = torch.nn.Sequential(torch.nn.Linear(3, 2)).double()
        fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
        data = (torch.zeros(4, 3, dtype=torch.float64), torch.zeros(4, 2, dtype=torch.float64))
        with pytest.raises(DpoptError, match=r"^module=FSDPSequential has parameters sharded over processes \(DTensor"):
            dpopt.Private(model, lambda out, y: ((out - y) ** 2).sum(1), data, epsilon=1.0, delta=1e-3, steps=1,
                          batch_size=2, allow_large_delta=True)
    finally:
        dist.destroy_process_group()
