"""Hugging Face classifiers, batch 64 of padded records: dpopt's private step (both engines) against
the plain PyTorch step and Opacus's two modes, full fine-tuning and LoRA, side by side in one process.

Models (transformers, small configs, random weights, float32, dropout off):

* ``LlamaForSequenceClassification``: 4 layers, d = 128, 4 heads, MLP 512, vocabulary 1,000;
* ``GPT2ForSequenceClassification``: 4 layers, d = 128, 4 heads, vocabulary 1,000.

Each fully fine-tuned, and with a peft LoRA adapter (r = 8, α = 8) on the attention projections
(Llama ``q_proj`` and ``v_proj``, GPT-2 ``c_attn``) and the classification head ``score`` trained
too (``modules_to_save``), the rest frozen. Data: 512 records of 64 tokens, right-padded (pad id 0)
to lengths drawn uniformly in [16, 64], with their ``attention_mask``, two classes. One thread.

Contenders, per model and mode (one warm-up step each, then interleaved rounds in a rotated
order, one step per call):

* ``non-private SGD (PyTorch)``: zero_grad, ``model(input_ids=…, attention_mask=…)``, mean
  cross-entropy, backward, ``torch.optim.SGD.step`` on fixed batches of 64 of a random permutation.
* ``dpopt ghost`` and ``dpopt vmap``: ``dpopt.Private(model, classification_loss, batch_dict,
  algorithm=DPSGD(…), engine=…)``; a step is ``private.backward()`` (Poisson batch at q = 64/n, the
  per-record clipped gradients, the noise, the ledger) and ``SGD.step``.
* ``Opacus hooks`` and ``Opacus ghost``: ``PrivacyEngine().make_private`` with Poisson sampling and
  ``grad_sample_mode`` "hooks" / "ghost" on a module that calls the model with the two inputs
  (``_timing.OpacusLoop``). Where Opacus raises, the report gives its error.

Peak memory, after the timed rounds: one more step of each contender, and how far the resident set
rose during it above its level when it began (``VmHWM`` after resetting it,
``_timing.with_peak_rss``), with glibc's mmap threshold fixed at 64 KiB and the heap's free pages
given back to the system (``malloc_trim``) before it: every page the step's tensors touch is then
counted, so the rise is the most memory the step held at once beyond what the model, optimizer and
data already held (not hidden by the allocator's cache of an earlier step). The timed rounds run
with glibc's default allocator settings (a fixed threshold makes every step map and unmap its
tensors, which slows it).

Targets: full fine-tuning, dpopt (ghost, the default engine) / non-private ≤ 1.5× and Opacus's
faster mode / dpopt ≥ 1.2×; LoRA, dpopt / non-private ≤ 1.1×.
"""

from __future__ import annotations

import os
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from _timing import (OpacusLoop, interleaved, load_sentence, mb, measured_in_child, other_processes_share, script,
                     summary, with_peak_rss)
from torch import nn

TITLE = "Hugging Face classifiers (Llama, GPT-2), full fine-tuning and LoRA, batch 64: dpopt vs PyTorch and Opacus"
THREADS, BATCH, N, VOCAB, TOKENS, DIM, LAYERS, HEADS, CLASSES = 1, 64, 512, 1000, 64, 128, 4, 4, 2
RANK, CLIP, NOISE, LR = 8, 1.0, 1.0, 0.1
TARGET_FULL, TARGET_OPACUS, TARGET_LORA = 1.5, 1.2, 1.1
#: glibc's mmap threshold while measuring the peak memory (bytes).
MMAP_THRESHOLD = 65536
PLAIN, GHOST, VMAP, HOOKS, OPACUS_GHOST = ("non-private SGD (PyTorch)", "dpopt ghost", "dpopt vmap", "Opacus hooks",
                                           "Opacus ghost")
MODELS = ("Llama", "GPT-2")
LORA_TARGETS = {"Llama": ["q_proj", "v_proj"], "GPT-2": ["c_attn"]}
MODES = ("full fine-tuning", "LoRA")


def _model(name: str, lora: bool) -> nn.Module:
    import transformers as tf

    torch.manual_seed(0)
    if name == "Llama":
        config = tf.LlamaConfig(vocab_size=VOCAB, hidden_size=DIM, intermediate_size=4 * DIM, num_hidden_layers=LAYERS,
                                num_attention_heads=HEADS, num_key_value_heads=HEADS, max_position_embeddings=TOKENS,
                                num_labels=CLASSES, pad_token_id=0, bos_token_id=1, eos_token_id=1)
        model: nn.Module = tf.LlamaForSequenceClassification(config)
    else:
        model = tf.GPT2ForSequenceClassification(tf.GPT2Config(
            vocab_size=VOCAB, n_positions=TOKENS, n_embd=DIM, n_layer=LAYERS, n_head=HEADS, num_labels=CLASSES,
            pad_token_id=0, bos_token_id=1, eos_token_id=1, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    if lora:
        import peft

        model = peft.get_peft_model(model, peft.LoraConfig(r=RANK, lora_alpha=RANK, target_modules=LORA_TARGETS[name],
                                                           modules_to_save=["score"]))
    return model.train()


def _data() -> dict[str, torch.Tensor]:
    """N right-padded records of lengths uniform in [T/4, T], their masks and labels."""
    gen = torch.Generator().manual_seed(3)
    lengths = torch.randint(TOKENS // 4, TOKENS + 1, (N,), generator=gen)
    mask = (torch.arange(TOKENS)[None] < lengths[:, None]).long()
    ids = torch.randint(2, VOCAB, (N, TOKENS), generator=gen).masked_fill(mask == 0, 0)
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.randint(0, CLASSES, (N,), generator=gen)}


def _sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR)


class Plain:
    def __init__(self, name: str, lora: bool, data: dict[str, torch.Tensor]) -> None:
        self.data, self.model = data, _model(name, lora)
        self.optimizer, self.gen = _sgd(self.model), torch.Generator().manual_seed(2)

    def __call__(self) -> dict[str, float]:
        start = time.perf_counter()
        idx = torch.randperm(N, generator=self.gen)[:BATCH]
        self.optimizer.zero_grad()
        inputs = {key: self.data[key][idx] for key in ("input_ids", "attention_mask")}
        logits = self.model(**inputs).logits
        F.cross_entropy(logits, self.data["labels"][idx]).backward()
        self.optimizer.step()
        return {"seconds": time.perf_counter() - start}


class Dpopt:
    def __init__(self, name: str, lora: bool, data: dict[str, torch.Tensor], engine: str) -> None:
        import dpopt
        from dpopt.algorithms import DPSGD
        from dpopt.oracles import hf

        self.model = _model(name, lora)
        self.optimizer = _sgd(self.model)
        self.private = dpopt.Private(self.model, hf.classification_loss, data, engine=engine, epsilon=None, delta=1e-5,
                                     algorithm=DPSGD(lr=LR, clip=CLIP, noise_multiplier=NOISE, batch_size=BATCH),
                                     steps=100, seed=0)

    def __call__(self) -> dict[str, float]:
        start = time.perf_counter()
        self.private.backward()
        self.optimizer.step()
        return {"seconds": time.perf_counter() - start}


class Keywords(nn.Module):
    """The model on ``x = stack([input_ids, attention_mask], 1)``: its logits (for Opacus's loop)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=x[:, 0].contiguous(), attention_mask=x[:, 1].contiguous()).logits


def _opacus(name: str, lora: bool, data: dict[str, torch.Tensor], mode: str) -> Callable[[], dict[str, float]]:
    model = Keywords(_model(name, lora))
    X = torch.stack([data["input_ids"], data["attention_mask"]], 1)
    loop = OpacusLoop(model, _sgd(model), X, data["labels"], batch=BATCH, noise=NOISE, clip=CLIP, mode=mode)
    return lambda: loop(1)


def _runs(make: Callable[[], Callable[[], dict[str, float]]]) -> tuple[Callable[[], dict[str, float]] | None, str]:
    """The contender and "", or None and the error it raised (its type, message and where), once built
    and called once."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            contender = make()
            contender()
        return contender, ""
    except Exception as error:  # noqa: BLE001 - reported in the table
        where = traceback.extract_tb(error.__traceback__)[-1]
        message = str(error).splitlines()[0][:160]
        return None, f"{type(error).__name__}: {message} ({where.filename.split('site-packages/')[-1]}:{where.lineno})"


def _fresh_heap() -> Callable[[], None]:
    """Fix glibc's mmap threshold at :data:`MMAP_THRESHOLD` bytes (every larger allocation is then a
    mapping of its own, given back to the system when freed; ``mallopt(M_MMAP_THRESHOLD)`` also stops
    glibc from raising the threshold as large blocks are freed), and return ``malloc_trim(0)``, which
    gives the free pages of the heap back: a step that then touches memory raises the resident set."""
    import ctypes

    libc = ctypes.CDLL("libc.so.6")
    if not libc.mallopt(-3, MMAP_THRESHOLD):  # -3: M_MMAP_THRESHOLD
        raise RuntimeError("mallopt(M_MMAP_THRESHOLD) failed: the peak memory would not be measured")
    return lambda: libc.malloc_trim(0)


def _peak_rise(contender: Callable[[], dict[str, float]], trim: Callable[[], None]) -> float:
    """How far the resident set rose (MB) during one step of ``contender``, from a trimmed heap."""
    trim()
    return with_peak_rss(contender)["rss_mb"]


def measure(quick: bool) -> dict[str, Any]:
    """Per model and mode: build and warm up each contender (one step; a contender that raises is
    reported), time the rounds, then one more step each for the peak memory."""
    torch.set_num_threads(THREADS)
    data = _data()
    start, load = time.perf_counter(), [os.getloadavg()[0]]
    groups: dict[str, dict[str, Callable[[], dict[str, float]]]] = {}
    errors: dict[str, dict[str, str]] = {}
    for name in MODELS:
        for mode in MODES:
            lora, key = mode == "LoRA", f"{name}, {mode}"
            makers: dict[str, Callable[[], Callable[[], dict[str, float]]]] = {
                PLAIN: lambda: Plain(name, lora, data), GHOST: lambda: Dpopt(name, lora, data, "ghost"),
                VMAP: lambda: Dpopt(name, lora, data, "vmap"), HOOKS: lambda: _opacus(name, lora, data, "hooks"),
                OPACUS_GHOST: lambda: _opacus(name, lora, data, "ghost")}
            groups[key], errors[key] = {}, {}
            for contender, make in makers.items():
                built, error = _runs(make)
                if built is None:
                    errors[key][contender] = error
                else:
                    groups[key][contender] = built
    rounds = 1 if quick else 7
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        timed, others = other_processes_share(lambda: {key: interleaved(contenders, (rounds, rounds), 0.0, warm=False)
                                                       for key, contenders in groups.items()})
        trim = _fresh_heap()
        memory = {key: {name: _peak_rise(contender, trim) for name, contender in contenders.items()}
                  for key, contenders in groups.items()}
    load.append(os.getloadavg()[0])
    return {"timed": timed, "memory": memory, "errors": errors, "others": others, "load": load, "rounds": rounds,
            "seconds": time.perf_counter() - start, "threads": torch.get_num_threads()}


def _check(name: str, value: float, target: float, above: bool) -> dict[str, Any]:
    passed = value >= target if above else value <= target
    return {"name": name, "value": value, "target": f"{'≥' if above else '≤'} {target}×", "passed": passed}


def _slower(med: dict[str, float], memory: dict[str, float]) -> str:
    """A sentence: which contenders took less time per step than dpopt ghost, and its memory against
    the non-private step's."""
    faster = [f"{name} (dpopt ghost takes {med[GHOST] / med[name]:.2f}× its time)" for name in med if name != GHOST and
              med[name] < med[GHOST]]
    where = f"dpopt ghost is slower than {', '.join(faster)}" if faster else "no contender is faster than dpopt ghost"
    return (f"- Here {where}; its peak memory rise is {memory[GHOST] / memory[PLAIN]:.2f}× the non-private "
            "step's.")


def report(data: dict[str, Any], how: str) -> dict[str, Any]:
    busy = load_sentence(data["others"], "the ratios, measured side by side, are the meaningful numbers")
    md = [f"d = {DIM}, {LAYERS} layers, {HEADS} heads, {TOKENS} tokens (records right-padded from lengths "
          f"{TOKENS // 4}–{TOKENS}), vocabulary {VOCAB}, batch {BATCH} (Poisson for dpopt and Opacus), float32, "
          f"{data['threads']} thread, C = {CLIP:g}, z = {NOISE:g}; LoRA r = {RANK} on Llama's q_proj, v_proj and "
          f"GPT-2's c_attn, head trained. One warm-up step and {data['rounds']} interleaved rounds of one step per "
          f"contender, then one step each for the memory ({data['seconds']:.0f} s in all), in a child process with "
          f"{how}. {busy} Load average (1 min) {data['load'][0]:.1f} before, {data['load'][1]:.1f} after, on "
          f"{os.cpu_count()} CPUs.",
          "",
          "Peak memory: how far the resident set rose during one step above its level when the step began, with "
          f"glibc's mmap threshold fixed at {MMAP_THRESHOLD // 1024} KiB (every tensor larger than that is mapped on "
          "its own and given back when freed) and the heap's free pages given back first (`malloc_trim`): the most "
          "the step's own tensors held at once beyond the model, optimizer and data.", ""]
    checks = []
    for key, results in data["timed"].items():
        med = {name: summary(rows)["median"] for name, rows in results.items()}
        plain, full = med[PLAIN], not key.endswith("LoRA")
        md += [f"### {key}", "", "| contender | median s/step | min | this / non-private | peak memory rise |",
               "|---|---:|---:|---:|---:|"]
        for name in (PLAIN, GHOST, VMAP, HOOKS, OPACUS_GHOST):
            if name in med:
                md.append(f"| {name} | {med[name]:.3f} | {summary(results[name])['min']:.3f} | "
                          f"{med[name] / plain:.2f}× | {mb(data['memory'][key][name])} |")
            else:
                md.append(f"| {name} | raised: {data['errors'][key][name]} | — | — | — |")
        dp_ratio, target = med[GHOST] / plain, TARGET_FULL if full else TARGET_LORA
        fastest = summary(results[GHOST])["min"] / summary(results[PLAIN])["min"]
        checks.append(_check(f"dpopt ghost / non-private step, {key}", dp_ratio, target, above=False))
        md += ["", f"- dpopt ghost (the default engine) / non-private = **{dp_ratio:.2f}×** (target ≤ {target}×: "
                   f"**{'PASS' if dp_ratio <= target else 'FAIL'}**; the ratio of the fastest rounds {fastest:.2f}×); "
                   f"dpopt vmap / non-private = {med[VMAP] / plain:.2f}×."]
        opacus = [med[name] for name in (HOOKS, OPACUS_GHOST) if name in med]
        if not opacus:
            md.append("- Opacus raised in both modes: there is no Opacus time to compare with (no check).")
        elif full:
            ratio = min(opacus) / med[GHOST]
            checks.append(_check(f"Opacus (faster mode) / dpopt ghost step, {key}", ratio, TARGET_OPACUS, above=True))
            md.append(f"- Opacus's faster mode / dpopt ghost = **{ratio:.2f}×** (target ≥ {TARGET_OPACUS}×: "
                      f"**{'PASS' if ratio >= TARGET_OPACUS else 'FAIL'}**).")
        else:
            md.append(f"- Opacus's faster mode / dpopt ghost = {min(opacus) / med[GHOST]:.2f}× (no target).")
        md += [_slower(med, data["memory"][key]), ""]
    return {"title": TITLE, "markdown": "\n".join(md), "checks": checks,
            "data": {"timed": {key: {name: summary(rows) for name, rows in results.items()}
                               for key, results in data["timed"].items()},
                     "memory_mb": data["memory"], "errors": data["errors"], "load": data["load"],
                     "other_processes_cpu_share": data["others"], "wait_policy": how}}


run = measured_in_child(__file__, report)


if __name__ == "__main__":
    script(measure, run)
