"""Hugging Face transformers and peft models through both per-record engines (dpopt.oracles.hf).

Every per-record gradient is held to autograd on that record alone, unpadded (its own length), to
1e-10 in float64: padding and attention masks cannot move a record's clipped gradient."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch
from torch import nn

tf = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

import dpopt  # noqa: E402
from dpopt._validate import DpoptError  # noqa: E402
from dpopt.algorithms import dp_gd  # noqa: E402
from dpopt.oracles import TorchModel, hf  # noqa: E402

B, T, V, LABELS = 4, 8, 50, 3
LENGTHS = torch.tensor([8, 5, 3, 6])  # right padding to T, records of different lengths
ENGINES = ("ghost", "vmap")
#: The models held exact under full fine-tuning (hf.WHOLE_BATCH names no architecture outside them).
FULL = ("gpt2-cls", "gpt2-lm", "bert", "roberta", "llama-cls", "llama-lm", "mistral-cls", "qwen2-cls", "vit")


def _tiny(kind: str, tied: bool = True) -> nn.Module:
    """A model of a small config with random weights (seeded), float64, dropout off."""
    torch.manual_seed(0)
    common = dict(vocab_size=V, num_labels=LABELS, pad_token_id=0, bos_token_id=1, eos_token_id=1)
    layers = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                  max_position_embeddings=16)
    gpt2 = dict(n_positions=16, n_embd=16, n_layer=2, n_head=2, tie_word_embeddings=tied, **common)
    llama = dict(num_key_value_heads=1, tie_word_embeddings=tied, **layers, **common)
    model = {
        "gpt2-cls": lambda: tf.GPT2ForSequenceClassification(tf.GPT2Config(**gpt2)),
        "gpt2-lm": lambda: tf.GPT2LMHeadModel(tf.GPT2Config(**gpt2)),
        "bert": lambda: tf.BertForSequenceClassification(tf.BertConfig(**layers, **common)),
        "roberta": lambda: tf.RobertaForSequenceClassification(tf.RobertaConfig(**{**layers, **common,
                                                                                   "max_position_embeddings": 20})),
        "llama-cls": lambda: tf.LlamaForSequenceClassification(tf.LlamaConfig(**llama)),
        "llama-lm": lambda: tf.LlamaForCausalLM(tf.LlamaConfig(**llama)),
        "mistral-cls": lambda: tf.MistralForSequenceClassification(tf.MistralConfig(**llama)),
        "qwen2-cls": lambda: tf.Qwen2ForSequenceClassification(tf.Qwen2Config(**llama)),
        "vit": lambda: tf.ViTForImageClassification(tf.ViTConfig(
            image_size=8, patch_size=4, num_channels=1, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
            num_attention_heads=2, num_labels=LABELS)),
    }[kind]()
    return model.double().eval()


LORA_TARGETS = {"gpt2-cls": (["c_attn"], ["score"]), "llama-lm": (["q_proj", "v_proj"], None),
                "bert": (["query", "value"], ["classifier"]), "roberta": (["query", "value"], ["classifier"]),
                "vit": (["q_proj", "v_proj"], ["classifier"])}


def _lora(kind: str) -> nn.Module:
    """peft LoRA (r = 2) on the attention projections; B drawn nonzero so that A has a gradient."""
    targets, save = LORA_TARGETS[kind]
    model = peft.get_peft_model(_tiny(kind), peft.LoraConfig(r=2, lora_alpha=4, target_modules=targets,
                                                             modules_to_save=save))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(generator=torch.Generator().manual_seed(1))
    return model


def _records(kind: str) -> dict[str, torch.Tensor]:
    """B records: tokens right-padded (pad 0) with their mask and labels (-100 at the padding for a
    language model), or images."""
    g = torch.Generator().manual_seed(2)
    if kind == "vit":
        return {"pixel_values": torch.randn(B, 1, 8, 8, generator=g, dtype=torch.float64),
                "labels": torch.randint(0, LABELS, (B,), generator=g)}
    mask = (torch.arange(T)[None] < LENGTHS[:, None]).long()
    ids = torch.randint(2, V, (B, T), generator=g).masked_fill(mask == 0, 0)
    labels = ids.masked_fill(mask == 0, hf.IGNORE) if kind.endswith("-lm") else torch.randint(0, LABELS, (B,),
                                                                                              generator=g)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _loss(kind: str):  # noqa: ANN202
    return hf.causal_lm_loss if kind.endswith("-lm") else hf.classification_loss


def _alone(model: nn.Module, kind: str, records: dict[str, torch.Tensor]) -> torch.Tensor:
    """``[B, d]``: autograd on each record alone, without its padding (no attention mask)."""
    params = [p for p in model.parameters() if p.requires_grad]
    rows = []
    for i in range(B):
        if kind == "vit":
            out, y = model(pixel_values=records["pixel_values"][i:i + 1]).logits, records["labels"][i:i + 1]
        else:
            n = int(LENGTHS[i])
            out = model(input_ids=records["input_ids"][i:i + 1, :n]).logits
            y = records["labels"][i:i + 1, :n] if kind.endswith("-lm") else records["labels"][i:i + 1]
        grads = torch.autograd.grad(_loss(kind)(out, y).sum(), params, allow_unused=True)
        rows.append(torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1)
                               for g, p in zip(grads, params)]))
    return torch.stack(rows)


def _engine_rows(model: nn.Module, kind: str, records: dict[str, torch.Tensor], engine: str
                 ) -> tuple[torch.Tensor, torch.Tensor, TorchModel]:
    """Each record's gradient (the weighted sum with a one-hot weight) and norm, from the engine."""
    adapted = hf.Adapted(model, hf.default_inputs(model))
    oracle = TorchModel(adapted, _loss(kind), hf.pack(records, adapted.keys), hf.labels_of(records), engine=engine)
    rows = oracle.per_record(oracle.flat_params(), torch.arange(B))
    eye = torch.eye(B, dtype=torch.float64)
    return torch.stack([rows.weighted_sum(eye[i]) for i in range(B)]), rows.norms(), oracle


def _assert_exact(got: torch.Tensor, norms: torch.Tensor, want: torch.Tensor) -> None:
    assert want.norm(dim=1).min() > 1e-3  # every record has a gradient to compare
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    torch.testing.assert_close(norms, want.norm(dim=1), rtol=1e-10, atol=0)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("kind", FULL)
def test_each_record_is_its_own_unpadded_gradient(kind, engine):
    """Full fine-tuning, padded batches with attention masks (before: refused on both engines,
    transformers' mask preparation branches on the mask's values under vmap)."""
    model = _tiny(kind)
    records = _records(kind)
    got, norms, _ = _engine_rows(model, kind, records, engine)
    _assert_exact(got, norms, _alone(model, kind, records))


class _SeesPadding(hf.Adapted):
    """Mutant: the mask keeps only causality, so a bidirectional model's tokens attend to the padding."""

    def _additive(self, mask: torch.Tensor) -> torch.Tensor:
        return super()._additive(torch.ones_like(mask))


def test_padding_exactness_catches_a_mask_that_lets_padding_in():
    """BERT attends both ways: with the padding visible, a record's gradient depends on how far its
    batch padded it, and the comparison with the record alone fails."""
    model, records = _tiny("bert"), _records("bert")
    adapted = _SeesPadding(model, ("input_ids", "attention_mask"))
    oracle = TorchModel(adapted, hf.classification_loss, hf.pack(records, adapted.keys), hf.labels_of(records))
    rows = oracle.per_record(oracle.flat_params(), torch.arange(B))
    got = torch.stack([rows.weighted_sum(row) for row in torch.eye(B, dtype=torch.float64)])
    with pytest.raises(AssertionError):
        _assert_exact(got, rows.norms(), _alone(model, "bert", records))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("kind", sorted(LORA_TARGETS))
def test_lora_records_are_exact_and_only_adapters_are_trained(kind, engine):
    model = _lora(kind)
    records = _records(kind)
    got, norms, oracle = _engine_rows(model, kind, records, engine)
    _assert_exact(got, norms, _alone(model, kind, records))
    trained = [name for name in oracle.layout.names if "lora_" not in name and "modules_to_save" not in name]
    assert trained == []  # frozen weights get no per-record work
    if engine == "ghost":  # peft's adapters are ghost Linear layers inside the vmapped model
        rules = dict(oracle.rules())
        assert {rule for path, rule in rules.items() if "lora_" in path} == {"ghost"}
        assert [s.names for s in oracle.stages if s.kind == "block"] == [()]  # no dense parameter


@pytest.mark.parametrize("positions", [4, None])
def test_conv1d_is_a_ghost_layer_exactly_also_at_two_points(positions):
    """transformers' Conv1D (weight [in, out]) has the Linear rule transposed (before: no ghost rule,
    per-record vmap). On the whole batch in a Sequential, and the difference of two points: T = 4
    positions (direct rows), and one position, where the second layer's difference takes the stacked
    Gram form and the first layer's (the data as input) the one-layer form."""
    from transformers.pytorch_utils import Conv1D

    torch.manual_seed(0)
    width = 3 if positions else 8
    net = nn.Sequential(Conv1D(5 if positions else 8, width), nn.Tanh(), Conv1D(2, 5 if positions else 8)).double()
    shape = (6, positions) if positions else (6,)
    X, y = torch.randn(*shape, width, dtype=torch.float64), torch.randn(*shape, 2, dtype=torch.float64)

    def loss(out, target):
        return ((out - target) ** 2).reshape(len(out), -1).sum(1)

    oracle = TorchModel(net, loss, X, y)
    assert [s.kind for s in oracle.stages] == ["linear_t", "plain", "linear_t"]
    theta, other = oracle.flat_params(), oracle.flat_params() + 0.1
    dense = TorchModel(net, loss, X, y, engine="vmap")
    eye = torch.eye(6, dtype=torch.float64)
    for rows, want in [(oracle.per_record(theta, torch.arange(6)), dense.per_record(theta, torch.arange(6))),
                       (oracle.per_record(theta, torch.arange(6)) - oracle.per_record(other, torch.arange(6)),
                        dense.per_record(theta, torch.arange(6)) - dense.per_record(other, torch.arange(6)))]:
        got = torch.stack([rows.weighted_sum(eye[i]) for i in range(6)])
        torch.testing.assert_close(got, want.rows, rtol=0, atol=1e-12)
        torch.testing.assert_close(rows.norms(), want.rows.norm(dim=1), rtol=1e-10, atol=0)
    model = _tiny("gpt2-cls")
    _, _, gpt2 = _engine_rows(model, "gpt2-cls", _records("gpt2-cls"), "ghost")
    assert dict(gpt2.rules())["model.transformer.h.0.attn.c_attn"] == "ghost"


def _uses_apart(model: nn.Module, records: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Each record's gradient of the tied table through each use alone: the input embedding and
    the LM head (the table passed under two names, untied)."""
    table = model.transformer.wte.weight
    rows_a, rows_b = [], []
    for i in range(B):
        n = int(LENGTHS[i])
        a, b = table.detach().clone().requires_grad_(), table.detach().clone().requires_grad_()
        out = torch.func.functional_call(model, {"transformer.wte.weight": a, "lm_head.weight": b},
                                         kwargs={"input_ids": records["input_ids"][i:i + 1, :n]}, tie_weights=False)
        ga, gb = torch.autograd.grad(hf.causal_lm_loss(out.logits, records["labels"][i:i + 1, :n]).sum(), (a, b))
        rows_a.append(ga.reshape(-1))
        rows_b.append(gb.reshape(-1))
    return torch.stack(rows_a), torch.stack(rows_b)


def _table_norm_is_exact(norms: torch.Tensor, want: torch.Tensor) -> bool:
    return torch.allclose(norms, want, rtol=1e-10, atol=0)


def test_tied_embedding_norm_has_the_cross_term_catches_sum_of_norms():
    """GPT-2's input embedding and LM head share one table: a record's gradient is the sum of both
    uses, ‖G_a + G_b‖² = ‖G_a‖² + ‖G_b‖² + 2⟨G_a, G_b⟩. The ghost engine keeps a shared parameter
    out of its ghost layers (dense per-record rows inside the vmapped block), so the cross term is
    there. Mutant: the two uses' norms added (no cross term) under-counts, and is caught."""
    model = _tiny("gpt2-lm", tied=True)
    assert model.lm_head.weight is model.transformer.wte.weight
    records = _records("gpt2-lm")
    _, _, oracle = _engine_rows(model, "gpt2-lm", records, "ghost")
    place = oracle.layout.place("model.transformer.wte.weight")
    rows = oracle.per_record(oracle.flat_params(), torch.arange(B))
    eye = torch.eye(B, dtype=torch.float64)
    engine_table = torch.stack([rows.weighted_sum(eye[i])[place] for i in range(B)])
    uses_a, uses_b = _uses_apart(model, records)
    true_norms = (uses_a + uses_b).norm(dim=1)
    assert _table_norm_is_exact(engine_table.norm(dim=1), true_norms)
    mutant = (uses_a.norm(dim=1) ** 2 + uses_b.norm(dim=1) ** 2).sqrt()
    assert not _table_norm_is_exact(mutant, true_norms)
    assert (mutant < true_norms * (1 - 1e-3)).any()  # the cross term is positive for some record: under-counted


def test_left_padding_and_unknown_inputs_are_refused_in_one_sentence():
    records = _records("gpt2-cls")
    left = {**records, "attention_mask": records["attention_mask"].flip(1)}
    with pytest.raises(DpoptError, match=r"attention_mask pads on the left.*tokenizer.padding_side = 'right'"):
        hf.pack(left, ("input_ids", "attention_mask"))
    with pytest.raises(DpoptError, match=r"inputs=\('input_ids', 'token_type_ids'\) names \['token_type_ids'\]"):
        hf.pack(records, ("input_ids", "token_type_ids"))
    with pytest.raises(DpoptError, match="no labels"):
        hf.labels_of({"input_ids": records["input_ids"]})
    with pytest.raises(DpoptError, match="inputs=.*is not one"):
        dpopt.Private(nn.Linear(2, 1), hf.classification_loss, (torch.zeros(4, 2), torch.zeros(4, dtype=torch.long)),
                      epsilon=1.0, delta=1e-5, steps=1, inputs=("x",))


def test_causal_lm_loss_shifts_and_averages_a_records_own_tokens():
    logits = torch.randn(2, 4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([[1, 2, 3, hf.IGNORE], [4, hf.IGNORE, hf.IGNORE, hf.IGNORE]])
    want0 = torch.nn.functional.cross_entropy(logits[0, :2], labels[0, 1:3])
    torch.testing.assert_close(hf.causal_lm_loss(logits, labels), torch.stack([want0, want0.new_zeros(())]))


def _private(model: nn.Module, records: dict[str, torch.Tensor], loss, **kw) -> dpopt.Private:  # noqa: ANN001
    return dpopt.Private(model, loss, records, delta=1e-3, steps=2, allow_large_delta=True, seed=5, **kw)


def test_private_lora_step_is_the_clipped_mean_plus_the_runs_noise_and_frozen_stay_bitwise():
    """A DP-GD step through Private on a peft LoRA GPT-2 classifier, from a dict of tensors: the
    adapters' .grad is (Σ_i clip(∇ℓ_i, C) + noise)/n, with ∇ℓ_i from autograd on each record alone
    and the noise the one the run drew (recovered from a twin run of the same seed whose loss is 0);
    with noise 0 it is the clipped mean. Frozen weights are never given a gradient, and stay bit for
    bit what they were after the optimizer's step."""
    clip = 0.05
    model, records = _lora("gpt2-cls"), _records("gpt2-cls")
    per_record = _alone(model, "gpt2-cls", records)
    clipped_mean = (per_record * (clip / per_record.norm(dim=1, keepdim=True)).clamp(max=1)[:, :]).mean(0)
    assert (per_record.norm(dim=1) > clip).all()  # every record is clipped

    def released(net: nn.Module, loss, **kw) -> torch.Tensor:  # noqa: ANN001
        frozen = {name: p.clone() for name, p in net.named_parameters() if not p.requires_grad}
        private = _private(net, records, loss, **kw)
        private.backward()
        torch.optim.SGD(net.parameters(), lr=0.5).step()
        assert all(p.grad is None and torch.equal(p, frozen[name])
                   for name, p in net.named_parameters() if not p.requires_grad)
        return torch.cat([p.grad.reshape(-1) for p in net.parameters() if p.requires_grad])

    noiseless = released(copy.deepcopy(model), hf.classification_loss,
                         algorithm=dp_gd(lr=0.5, clip=clip, noise_multiplier=0.0), epsilon=None)
    torch.testing.assert_close(noiseless, clipped_mean, rtol=0, atol=1e-12)
    noisy = released(copy.deepcopy(model), hf.classification_loss, algorithm="dp-gd", epsilon=1.0, clip=clip)
    noise = released(copy.deepcopy(model), lambda logits, y: 0 * logits.sum(1), algorithm="dp-gd", epsilon=1.0,
                     clip=clip)
    assert noise.abs().min() > 0
    torch.testing.assert_close(noisy, clipped_mean + noise, rtol=0, atol=1e-12)


def test_private_loads_dict_batches_through_a_dataloader():
    """A DataLoader of dict records, collated with right padding per chunk: no split needed, and the
    release is the one of the same records given as padded tensors (padding lengths do not matter)."""
    records = _records("bert")
    rows = [{key: value[i] for key, value in records.items()} for i in range(B)]

    def collate(batch: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        n = max(int(r["attention_mask"].sum()) for r in batch)  # pad to the chunk's longest record
        return {"input_ids": torch.stack([r["input_ids"][:n] for r in batch]),
                "attention_mask": torch.stack([r["attention_mask"][:n] for r in batch]),
                "labels": torch.stack([r["labels"] for r in batch])}

    def release(data) -> torch.Tensor:  # noqa: ANN001
        net = _tiny("bert")
        private = _private(net, data, hf.classification_loss, algorithm=dp_gd(lr=0.1, clip=0.1, noise_multiplier=0.0),
                           epsilon=None, microbatch_size=2)
        private.backward()
        return torch.cat([p.grad.reshape(-1) for p in net.parameters()])

    loader = torch.utils.data.DataLoader(rows, collate_fn=collate)
    torch.testing.assert_close(release(loader), release(records), rtol=0, atol=1e-12)


def test_importing_dpopt_does_not_import_transformers():
    code = ("import sys, dpopt, dpopt.private, dpopt.oracles.hf; "
            "print(sorted(m for m in ('transformers', 'peft') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
