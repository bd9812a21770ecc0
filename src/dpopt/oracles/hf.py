"""Hugging Face ``transformers`` and ``peft`` models through dpopt's per-record engines.

A Hugging Face model takes keyword inputs (``input_ids``, ``attention_mask``, ``pixel_values``, …)
and returns a ``ModelOutput``; dpopt's oracle runs a module on one tensor per record. :class:`Adapted`
is the bridge: an ``nn.Module`` whose forward takes the inputs packed into one tensor (:func:`pack`:
the named inputs stacked along dim 1, or the one input as it is) and returns the output's
``logits``. The model is its only child, so its parameters (trainable or frozen, a LoRA adapter's
too) are the model's own, under the prefix ``model.``. Nothing is imported from transformers or
peft: a model is recognised by the package its class comes from (:func:`is_hf`).

**Per record, exactly.** The vmap engine runs the model on each record alone under
``torch.func.vmap``. The ghost engine treats it as one block whose Linear, ``Conv1D``, Embedding,
LayerNorm and RMSNorm layers keep their ghost rules (:mod:`dpopt.oracles.ghost`); for an architecture
in :data:`WHOLE_BATCH` whose every trainable parameter is in such a layer (full fine-tuning without
tied embeddings or extra parameters such as ViT's class token; LoRA, whose adapters are Linear
layers), it runs the model once on the whole batch, as a non-private step does (fused attention
kernel included), its ghost layers tapped; otherwise per record under vmap. The whole-batch run is
exact because these architectures never combine two rows of a batch (each row's attention is
masked within the row, below) — which ``tests/test_hf.py`` holds for each of them: every record's
gradient equals autograd on the record alone, unpadded, to 1e-10 in float64. A layer call whose
output rows are not the batch's records is refused (``blocks._Tap``).

Where transformers' code would branch on tensor values
(its mask preparation asks whether a 2-D ``attention_mask`` is all ones), :class:`Adapted` passes
instead a 4-D additive mask built from the record's own mask with tensor operations only: key j is
visible to query i iff ``mask[j] = 1`` (and ``j ≤ i`` for a causal model), else the score gets
``finfo.min`` (weight exactly 0 after the softmax, as transformers' eager masks do; a query row with
no visible key stays finite). transformers returns a 4-D mask as it is given, for its "sdpa" and
"eager" attention, the two accepted. So a right-padded record's outputs at its real tokens are
those of the record without padding (positions count from its first token), whatever the length
it was padded to: a record's result cannot depend on the others in its batch. Left padding is
refused (:func:`pack`): GPT-2, BERT and Llama number the positions from the first column, pad or
not, so a left-padded record would be computed at other positions than alone. Whether attention is
causal is read from transformers' attention modules (their ``is_causal``); a model that mixes both
kinds (an encoder-decoder) is refused with an attention mask.

**Losses.** :func:`causal_lm_loss` (the mean over a record's predicted tokens of the next-token
cross-entropy, labels ``-100`` ignored: padding and anything not to be learned) and
:func:`classification_loss`; both are ``[B]`` per-record losses, as dpopt's ``loss_fn`` must be.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.data import DataLoader, Dataset

from .. import _validate

#: The packages whose models :class:`Adapted` wraps.
PACKAGES = ("transformers", "peft")
#: The label key of a batch, in the order looked for (transformers' collators write ``labels``).
LABELS = ("labels", "label")
#: The attention implementations whose 4-D masks are used as given.
ATTENTION = ("sdpa", "eager")
#: Labels with this value are ignored by :func:`causal_lm_loss` (transformers' convention).
IGNORE = -100
#: The architectures (``config.model_type``) whose records are held independent on the whole batch by
#: dpopt's tests (``tests/test_hf.py``: each record's gradient equals autograd on it alone, unpadded):
#: the ghost engine runs them as a non-private step does (see the module's docstring).
WHOLE_BATCH = ("gpt2", "llama", "bert", "roberta", "vit", "mistral", "qwen2")


def is_hf(module: object) -> bool:
    """Whether ``module`` is a transformers or peft model (by its class's package; nothing imported)."""
    return type(module).__module__.split(".")[0] in PACKAGES


def _causal(model: nn.Module) -> bool | None:
    """Whether the model's attention is causal, from its attention modules' ``is_causal`` (None: it has
    none). Refuses a model with both kinds."""
    kinds = {bool(m.is_causal) for m in model.modules()
             if isinstance(getattr(m, "is_causal", None), bool)}
    if len(kinds) > 1:
        raise _validate.DpoptError(f"model={type(model).__name__} has both causal and bidirectional attention (an "
                                   "encoder-decoder), which dpopt cannot mask per record: use an encoder-only or a "
                                   "decoder-only model")
    return kinds.pop() if kinds else None


class Adapted(nn.Module):
    """``model`` on inputs packed into one tensor: ``forward(x)`` is ``model(**inputs).logits`` with
    ``inputs = dict(zip(keys, x.unbind(1)))`` (or ``{keys[0]: x}`` for one key) and the
    ``attention_mask`` given as a 4-D additive mask built per record (see the module's docstring)."""

    def __init__(self, model: nn.Module, keys: tuple[str, ...], output: str = "logits") -> None:
        super().__init__()
        if not keys:
            raise _validate.DpoptError("inputs=() must name at least one input of the model")
        implementation = getattr(getattr(model, "config", None), "_attn_implementation", None)
        if "attention_mask" in keys and implementation not in (*ATTENTION, None):
            raise _validate.DpoptError(
                f"model={type(model).__name__} uses attn_implementation={implementation!r}, which dpopt cannot mask "
                f"per record: build it with attn_implementation in {ATTENTION}")
        self.causal = _causal(model) if "attention_mask" in keys else None
        if "attention_mask" in keys and self.causal is None:
            raise _validate.DpoptError(f"model={type(model).__name__} takes an attention_mask but dpopt cannot tell "
                                       "whether its attention is causal (no attention module states is_causal)")
        self.model, self.keys, self.output = model, keys, output
        self.whole_batch = getattr(getattr(model, "config", None), "model_type", None) in WHOLE_BATCH

    def forward(self, x: Tensor) -> Tensor:
        inputs = dict(zip(self.keys, x.unbind(1))) if len(self.keys) > 1 else {self.keys[0]: x}
        if (mask := inputs.pop("attention_mask", None)) is not None:
            inputs["attention_mask"] = self._additive(mask)
        if torch._C._functorch.peek_interpreter_stack() is not None:  # under vmap: the kernel it batches (the fused
            with sdpa_kernel(SDPBackend.MATH):       # CPU one would run record by record)
                out = self.model(**inputs)
        else:
            out = self.model(**inputs)
        return out if isinstance(out, Tensor) else getattr(out, self.output)

    def _additive(self, mask: Tensor) -> Tensor:
        """``[B, 1, T, T]``: 0 where query i may see key j (``mask[j] = 1``, and ``j ≤ i`` if causal),
        ``finfo.min`` elsewhere, in the model's floating dtype."""
        dtype = next((p.dtype for p in self.model.parameters() if p.is_floating_point()), torch.float32)
        visible = (mask != 0)[:, None, None, :].expand(-1, 1, mask.shape[-1], -1)
        if self.causal:
            visible = visible & torch.ones(mask.shape[-1], mask.shape[-1], dtype=torch.bool, device=mask.device).tril()
        return torch.where(visible, torch.zeros((), dtype=dtype, device=mask.device), torch.finfo(dtype).min)


def labels_of(batch: Mapping[str, Tensor]) -> Tensor:
    """The batch's labels (``labels``, else ``label``)."""
    for key in LABELS:
        if key in batch:
            return torch.as_tensor(batch[key])
    raise _validate.DpoptError(f"the batch has keys {sorted(batch)} and no labels: give them as 'labels' (for a "
                               "causal language model, the input_ids with -100 at the padding)")


def pack(batch: Mapping[str, Tensor], keys: tuple[str, ...]) -> Tensor:
    """The inputs ``keys`` of a batch as one tensor (stacked along dim 1; one key: as it is), after a
    check that the attention mask pads on the right (a record's first token in column 0)."""
    missing = [key for key in keys if key not in batch]
    if missing:
        raise _validate.DpoptError(f"inputs={keys} names {missing}, which the batch (keys {sorted(batch)}) lacks")
    parts = [torch.as_tensor(batch[key]) for key in keys]
    if "attention_mask" in keys:
        mask = parts[keys.index("attention_mask")]
        if bool((mask[:, 1:] > mask[:, :-1]).any()):
            raise _validate.DpoptError(
                "attention_mask pads on the left, which dpopt refuses: the models number positions from the first "
                "column, so a left-padded record would be computed at other positions than on its own; pad on the "
                "right (tokenizer.padding_side = 'right')")
    if len(parts) == 1:
        return parts[0]
    if len({(p.shape, p.dtype) for p in parts}) > 1:
        raise _validate.DpoptError(f"inputs={keys} must share one shape and dtype to be packed per record, got "
                                   f"{[(tuple(p.shape), p.dtype) for p in parts]}")
    return torch.stack(parts, dim=1)


class Split:
    """``split`` of a DataLoader's dict batches: ``(pack(batch, keys), labels_of(batch))``."""

    def __init__(self, keys: tuple[str, ...]) -> None:
        self.keys = keys

    def __call__(self, batch: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]:
        return pack(batch, self.keys), labels_of(batch)

    def __repr__(self) -> str:
        return f"Split({self.keys!r})"


def default_inputs(model: nn.Module) -> tuple[str, ...]:
    """``("pixel_values",)`` for a vision model (its ``main_input_name``), else ``("input_ids", "attention_mask")``."""
    name = getattr(model, "main_input_name", None) or getattr(getattr(model, "base_model", None), "main_input_name",
                                                               None)
    return ("pixel_values",) if name == "pixel_values" else ("input_ids", "attention_mask")


Data = Dataset | DataLoader | tuple[Tensor, Tensor] | Mapping[str, Tensor]
SplitFn = Callable[..., tuple[Tensor, Tensor]]


def prepared(model: nn.Module, data: Data, split: SplitFn | None, inputs: tuple[str, ...] | None
             ) -> tuple[Adapted, Dataset | DataLoader | tuple[Tensor, Tensor], SplitFn | None]:
    """What :class:`dpopt.Private` runs for a Hugging Face ``model``: the :class:`Adapted` model, the data
    (a mapping of tensors, such as a tokenizer's ``BatchEncoding`` with labels, becomes the pair
    ``(pack(data), labels)``) and the DataLoader's ``split`` (default :class:`Split`)."""
    keys = tuple(inputs) if inputs is not None else default_inputs(model)
    if isinstance(data, Mapping):
        return Adapted(model, keys), (pack(data, keys), labels_of(data)), split
    if split is None and isinstance(data, DataLoader):
        split = Split(keys)
    return Adapted(model, keys), data, split


def causal_lm_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """``[B]``: record i's mean next-token cross-entropy, ``mean over t with labels[t+1] ≠ -100 of
    −log softmax(logits[t])[labels[t+1]]`` (the shift: position t predicts token t + 1); 0 for a record
    with no such token. Padding must carry the label -100."""
    shifted, targets = logits[:, :-1], labels[:, 1:]
    kept = targets != IGNORE
    token = F.cross_entropy(shifted.reshape(-1, shifted.shape[-1]), targets.masked_fill(~kept, 0).reshape(-1),
                            reduction="none").view(targets.shape)
    return torch.where(kept, token, token.new_zeros(())).sum(1) / kept.sum(1).clamp(min=1)


def classification_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """``[B]``: the cross-entropy of each record's logits ``[B, C]`` against its label."""
    return F.cross_entropy(logits, labels, reduction="none")
