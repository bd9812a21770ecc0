"""The "ghost" engine: per-record gradient norms and clipped sums without a ``[B, d]`` matrix.

For a layer ``s_t = W a_t + b`` applied at positions t = 1..T of one record (T = 1 for an MLP,
the sequence length for a Linear on ``[B, T, p]``, the number of output pixels for a
convolution seen on its unfolded patches), the record's gradient is ``∇_W ℓ_i = Σ_t g_t a_tᵀ``
and ``∇_b ℓ_i = Σ_t g_t`` with ``g_t = ∂ℓ_i/∂s_t``. Both are known from the layer's input
``a`` and output gradient ``g`` of one ordinary forward/backward, so (Li et al. 2022, "Large
language models can be strong differentially private learners", arXiv:2110.05679; Bu et al.
2022, "Scalable and efficient training of large convolutional neural networks with
differential privacy", arXiv:2205.10683, §4, the "mixed ghost norm"):

* ``‖∇_W ℓ_i‖² = ⟨a aᵀ, g gᵀ⟩`` (two T×T Gram matrices, formed in float64) when 2T² < p·q
  (and, below float64, when the rows would also outweigh the float64 copies of ``a`` and ``g``
  the Gram form makes: :func:`use_gram`), else ``‖Σ_t g_t a_tᵀ‖²`` with the ``[q, p]`` layer
  gradient of that record built directly (one batched matmul ``g_i [q, T] @ unfold(a_i)
  [T, p]``); for T = 1 it is ``‖a‖²‖g‖²`` (on the patch, per group, for a convolution). Conv2d
  is the Linear rule on ``unfold(a)`` (im2col, one ``gather``), per group. Where ``a`` is the
  data itself (augmentation multiplicity's views into the first layer), ``a aᵀ`` of each record is
  formed once and kept by the oracle by record index (:class:`InputGrams`): a step forms ``g gᵀ``,
  so the layer takes the Gram form wherever the kept matrices fit (:func:`~.grams.kept_shape`),
  also beyond :func:`use_gram`'s choice, which prices ``a aᵀ`` formed at every step; and the
  records are read in place from their tensor, a block at a time, by the layer's forward and
  again by its sum, the chunk never gathered whole (:mod:`.in_place`).
* the clipped sum ``Σ_i w_i ∇ℓ_i`` is book-keeping (Bu et al. 2023, "Differentially private
  optimization on large model at small cost", arXiv:2210.00038): the weight-gradient products
  of a backward pass, ``Σ_i w_i g_iᵀ a_i`` per layer (``conv2d_weight`` for convolutions),
  from the stored ``a`` and ``g``; for a layer whose records' gradients were built for the
  norms (direct form) it is ``w @ rows`` of those rows ("BK-MixOpt" in Bu et al. 2023), so those
  layers cost one per-record product for norms and sum together. A Linear layer whose input
  comes back call after call (a full-batch method's data) keeps it transposed for that product
  (:attr:`Layer.input_t`). It equals the reweighted backward of
  ``Σ_i w_i ℓ_i`` (the
  second pass of ghost clipping) without running it: no second backprop through the network,
  no retained graph, and records with ``w_i = 0`` are left out exactly (a record whose
  gradient is NaN cannot poison the sum), with the same forward as the norms (dropout masks
  agree).
* the difference of two such batches at θ and θ′ (DP-SRM) has, per layer,
  ``Σ_t g_t a_tᵀ − g′_t a′_tᵀ = Σ_t (g_t − g′_t) a_tᵀ + g′_t (a_t − a′_t)ᵀ``: the Linear rule on
  the 2T stacked positions ``[a; a − a′]`` and ``[g − g′; g′]`` (Gram form, chosen by 2·(2T)² <
  p·q, and for a convolution only if its rows at both points, 2·p·q, outweigh the patches the
  stacked form holds, 3·T·p, for a Linear layer at one position only if they outweigh its
  3·(p + q) inputs and output gradients: :func:`~.layers.use_gram_difference`), whose weighted sum is the
  book-keeping product of the same two stacked pieces (:class:`~.layers.Stacked`); or the two records'
  layer gradients built and subtracted (direct form; rows built once per point and shared with
  the norms and the book-keeping sums at that point), whose weighted sum is ``w @ (rows −
  rows′)``. Either way norm and sum are of the same difference, and avoid the cancellation of
  ``‖A‖² + ‖A′‖² − 2⟨A, A′⟩``, which loses every digit when θ′ ≈ θ (every stacked term is
  already of the size of the difference). A layer that saw the same input at both points (a
  first layer, whose input is the data, when the oracle reuses the records' chunk) has
  a′ = a: its difference is the one layer ``(a, g − g′)``, which costs what one point does.

Other layers (the rows are the records' gradients, so norm and sum are those of the same rows):

* Embedding: record i's gradient is ``Σ_t e_{idx_t} g_tᵀ``: one row ``Σ_{t: idx_t = v} g_t`` per
  distinct index v of the record (at most T rows, no ``[B, V, D]`` rows), summed in float64 for
  the norms, and the sum scatters ``w_i g_t`` into the table's rows (:class:`~.layers.Embedding`); the
  padding index gets no gradient.
* LayerNorm / GroupNorm: ``y = x̂ ⊙ γ + β`` with x̂ normalised within the record, so the rows
  ``Σ g ⊙ x̂`` and ``Σ g`` (over positions, or spatial dims) are as small as γ: built directly,
  from x̂ recomputed from the input (``backward._norm_rows``).
* Conv1d: a Conv2d of kernel (1, k) on ``[B, C, 1, L]`` (:func:`geometry`).
* transformers' ``Conv1D`` (GPT-2's layers, known by name: dpopt does not import transformers):
  ``y = x W + b`` with W stored ``[in, out]``, the Linear rule with the rows and the book-keeping
  product transposed into W's layout (kind ``"linear_t"``; the norms are the Linear rule's).
* transformers' RMSNorm (Llama's and the copies of its forward, known by name, kind ``"rmsnorm"``):
  ``y = w ⊙ x̂`` with ``x̂ = x / sqrt(mean(x²) + ε)`` computed as the layer does (in float32, cast
  back), so the rows are ``Σ_t g_t ⊙ x̂_t``, recomputed from the input.

Rounding: a norm is never below the norm of what the sum adds for that record, so no clipped
record adds more than C, in float32 as in float64 (:mod:`.rounding`).

How layers are found, and what runs on the whole batch: :mod:`.stages`.

Per-record independence: ghost norms are the norms of the records' gradients only if record i's
output depends on record i alone; otherwise one record moves every other record's gradient and
clipping no longer bounds its influence (e.g. ``x - x.mean(0)``, BatchNorm in training mode,
attention across dim 0). It is enforced, not assumed: what runs on the whole batch is only (a) a
registered layer type whose forward is the registered class's and whose condition holds, with
the check of a ghost layer's input rank (``functional._functional``), (b) the opened ``nn.Sequential``'s own forward
(children in order, one tensor passed along), and (c) a block registered as acting on each record
on its own (``Registry.with_per_record``, or dpopt's Hugging Face bridge for the architectures its
tests hold exact) whose every trainable parameter is in a tapped ghost layer: it runs once on the
batch, and each tapped call's output must have the records along dim 0 (``[B, …]`` where a record
alone gave ``[1, …]``, or ``[1, …]`` from an input all records share, such as position ids), else
it is refused; every other piece of code, in particular every
custom ``forward`` with whatever it calls (``torch`` functions, parameter-free modules, user
hooks), runs under ``vmap``, whose semantics is the function applied to each record on its
own. Inside a block the hooks only read inputs and add zeros, and the ghost layers there run
under the same vmap. What the hooks cannot see is found when a block is first run on records
of a new shape (``blocks._discover``, on one record, with every tapped output cut from
its layer's parameters): a layer whose parameters reach the output outside its calls (e.g.
``nn.MultiheadAttention``'s ``out_proj``) joins the block's own parameters (vmap; ``rules()``
shows the plan before that), and a different sequence of calls later (data-dependent
branching) is refused by name. A layer called several times in
one forward is one layer whose record gradient is the sum over its calls (``backward._calls``).
Assumed: the registry's entries are true (registering a mixing layer with ``with_per_record``
breaks the guarantee; the tests include that mutant), and torch's kernels and vmap rules are
correct.

Limits: module hooks registered by the user are not run for ghost stages nor for opened
Sequentials (a plain module with hooks is run per record; a ghost layer with hooks inside a
block is part of the block's vmap). A parameter used by two stages (tied weights) is refused
(use ``engine="vmap"``); inside a block, layers sharing a parameter stay in its vmap. A block's
convolution or GroupNorm must receive each record as one sample. BatchNorm and torch's
recurrent layers are refused by the oracle. Squared norms are formed without rescaling, so a
record whose gradient norm exceeds ~1e19 (float32) overflows to ∞ and is dropped by clipping
like a NaN record, where the dense engine would clip it.

Where each part lives (each module imports only modules above it in this list):

* :mod:`.stages`: the plan of a module's forward: its stages (:class:`Stage`), the :class:`Registry` of
  known layer types (:data:`KNOWN_LAYERS`), :func:`plan` and :func:`describe`; how layers are found;
* :mod:`.rounding`: the float64 norm bounds and their rounding (Higham's γ_n, Gram norms);
* :mod:`.conv`: a convolution's geometry, im2col patches and the channels-last layout;
* :mod:`.blocks`: a module run on each record alone under ``vmap``, its ghost layers tapped;
* :mod:`.functional`: the functional forward of the stages (:func:`forward`);
* :mod:`.layers`: one layer's records of one chunk (``a`` and ``g``, or dense rows): their norm
  bounds, weighted sums and differences at two points, and the Gram or direct form's choice;
* :mod:`.grams`: the input Gram matrices of a layer that takes the data itself, kept by record
  (:class:`InputGrams`);
* :mod:`.in_place`: such a layer with the records read in place, its forward (:func:`forward_in_place`)
  and its records of one chunk (the records' indices and ``g``);
* :mod:`.backward`: one backward to every tap, giving the layers' records (:func:`capture`);
* :mod:`.rows`: :class:`GhostRows`, the per-record gradients of one batch.
"""

from .backward import capture, layer_from
from .conv import channels_last, geometry, hwc, unfold
from .functional import forward, run_plain
from .grams import InputGrams
from .in_place import forward_in_place, reads_in_place, unread
from .layers import Layer, difference, use_gram
from .rounding import gram_sq_norms
from .rows import GhostRows, reuse_inputs
from .stages import KNOWN_LAYERS, Registry, Stage, describe, parameter_names, plan

# what the rest of dpopt (plan, forward, capture, GhostRows, reuse_inputs, the registry) and the
# engine's tests (the parts they check one by one) use
__all__ = [
    "KNOWN_LAYERS", "GhostRows", "InputGrams", "Layer", "Registry", "Stage", "capture", "channels_last", "describe",
    "difference", "forward", "forward_in_place", "geometry", "gram_sq_norms", "hwc", "layer_from", "parameter_names",
    "plan", "reads_in_place", "reuse_inputs", "run_plain", "unfold", "unread", "use_gram",
]
