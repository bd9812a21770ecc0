"""Mixed precision: a bf16 ``torch.autocast`` around the private step of a Hugging Face model.

The model's forward and backward run in bf16 where autocast says; the rows' norms and sums and the
clipped sums are made with autocast off (``dpopt.clipping.exact``), the norms in float64, so that
no record adds more than C."""

from __future__ import annotations

import copy

import pytest
import torch
from dp_accounting import NeighboringRelation

tf = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

import dpopt  # noqa: E402
from dpopt import clipping  # noqa: E402
from dpopt.algorithms import dp_gd  # noqa: E402
from dpopt.oracles import TorchModel, hf  # noqa: E402

B, T, V = 8, 16, 50
#: How far (relative) a bf16-autocast step's per-record norms may be from the float64 ones on this
#: model: the gradients themselves are computed with 8-bit mantissas (measured 0.2 – 0.5 %).
NORM_TOLERANCE = 0.02
#: How far above C a clipped record's float64 norm may be: the float64 evaluation of that norm.
CLIP_TOLERANCE = 1e-12


def _gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    config = tf.GPT2Config(vocab_size=V, n_positions=T, n_embd=32, n_layer=2, n_head=2, pad_token_id=0,
                           bos_token_id=1, eos_token_id=1, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                           tie_word_embeddings=False)
    return tf.GPT2LMHeadModel(config).eval()


def _records() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    lengths = torch.randint(4, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    ids = torch.randint(2, V, (B, T), generator=g).masked_fill(mask == 0, 0)
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, hf.IGNORE)}


def _oracle(model: torch.nn.Module, engine: str) -> TorchModel:
    adapted, records = hf.Adapted(model, ("input_ids", "attention_mask")), _records()
    return TorchModel(adapted, hf.causal_lm_loss, hf.pack(records, adapted.keys), hf.labels_of(records),
                      engine=engine)


def _clipped_excess(oracle: TorchModel, clip: float, clip_sum=clipping.clip_sum) -> float:  # noqa: ANN001
    """The largest ‖record's clipped contribution‖ / C − 1 over the records, each clipped alone
    under a bf16 autocast, its norm in float64."""
    theta, excess = oracle.flat_params(), []
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for i in range(B):
            bounded, _ = clip_sum([clipping.Term(1.0, oracle.per_record(theta, torch.tensor([i])), clip)],
                                  NeighboringRelation.ADD_OR_REMOVE_ONE)
            excess.append(float(bounded.value.double().norm()) / clip - 1)
    return max(excess)


@pytest.mark.parametrize("engine", ["ghost", "vmap"])
def test_bf16_autocast_norms_are_near_float64_and_no_record_exceeds_c_catches_autocast_in_clipping(
        engine, monkeypatch):
    """Before: the ghost engine raised under autocast (a Linear's input float32, its output
    gradient bf16, in one product), and the vmap engine's clipped sum was a bf16 product, so a
    clipped record added up to 0.23 % more than C. The mutant (clip_sum without ``exact``, the
    old code, where the rows' sum ran under the caller's autocast) is caught on the vmap engine."""
    model = _gpt2()
    want = _oracle(copy.deepcopy(model).double(), engine)
    exact_norms = want.per_record(want.flat_params(), torch.arange(B)).norms()
    oracle = _oracle(model, engine)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        rows = oracle.per_record(oracle.flat_params(), torch.arange(B))
        norms = rows.norms()
    assert norms.dtype == torch.float64
    relative = ((norms - exact_norms) / exact_norms).abs()
    assert 0 < relative.max() < NORM_TOLERANCE  # bf16 moved the gradients, a little
    clip = float(exact_norms.min()) / 2  # every record is clipped
    assert _clipped_excess(oracle, clip) <= CLIP_TOLERANCE
    if engine == "vmap":  # the mutant: the old code, autocast left on in clip_sum and in the rows' sum
        monkeypatch.setattr(clipping.Dense, "weighted_sum", clipping.Dense.weighted_sum.__wrapped__)
        assert _clipped_excess(oracle, clip, clipping.clip_sum.__wrapped__) > 1e-4  # it lets records past C


def test_private_step_under_bf16_autocast_is_the_clipped_mean_of_the_bf16_gradients():
    """Through Private (LoRA, noise 0): the .grad written under autocast is float32, finite, and the
    clipped mean of the records' gradients the engine computed under the same autocast."""
    model = peft.get_peft_model(_gpt2(), peft.LoraConfig(r=2, lora_alpha=4, target_modules=["c_attn"]))
    clip = 1e-3
    private = dpopt.Private(model, hf.causal_lm_loss, _records(), algorithm=dp_gd(lr=0.1, clip=clip,
                            noise_multiplier=0.0), epsilon=None, delta=1e-3, steps=1, allow_large_delta=True, seed=0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        rows = private.oracle.per_record(private.oracle.flat_params(), torch.arange(B))
        private.backward()
    want = rows.weighted_sum(clipping.clip_weights(rows.norms(), clip)).double() / B  # the sum in float32
    got = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.requires_grad])
    assert got.dtype == torch.float32 and bool(got.isfinite().all())
    assert (rows.norms() > clip).all()
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-12)
