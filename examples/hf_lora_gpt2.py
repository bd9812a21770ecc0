"""Fine-tune a tiny GPT-2 with LoRA, privately, on sentences the script makes up.

    python examples/hf_lora_gpt2.py [--out results/hf_lora_gpt2] [--epsilon 3] [--records 1500] [--epochs 2]

Needs ``pip install -e ".[hf]"`` and matplotlib. Nothing is downloaded: the data are sentences of
a small grammar ("the cat sees a tree today."), drawn with a seed, and tokenized one character per
token by a vocabulary the script builds (0 pads, 1 starts a sentence); the model is a
``GPT2LMHeadModel`` of a small config with random weights, and peft puts LoRA adapters (rank 8) on
its attention and MLP projections; only the adapters are trained, the rest stays frozen.

Training is DP-SGD through :class:`dpopt.Private`: Poisson batches, each record's gradient of its
own next-token loss (:func:`dpopt.oracles.hf.causal_lm_loss`, the padding ignored) clipped to
``--clip``, Gaussian noise calibrated to (``--epsilon``, δ) for the planned epochs, AdamW on the
private gradient. δ is 1/(10 n) for n records.

What is written to ``--out``: ``result.json`` (the ε spent, from dpopt's ledger, the target, δ,
the steps, and the loss curve) and ``loss.png``. The loss curve is the mean next-token loss on
sentences drawn afresh from the grammar, not on the training records: computed from the privately
trained weights and public data only, it is post-processing of private releases and costs no ε.
(A loss on the training records would not be covered by ε; dpopt labels it NOT PRIVATE.)
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

SUBJECTS = ["the cat", "a dog", "the bird", "my friend", "the teacher", "a child", "her brother"]
VERBS = ["sees", "likes", "finds", "chases", "helps", "calls", "paints"]
OBJECTS = ["the ball", "a tree", "the house", "some food", "a book", "the river", "an apple"]
ENDINGS = ["", " today", " again", " at night", " in the park"]
PAD, START = 0, 1


def sentences(count: int, seed: int) -> list[str]:
    """``count`` sentences of the grammar SUBJECT VERB OBJECT [ENDING] ".", drawn with ``seed``."""
    rng = random.Random(seed)
    return [f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}{rng.choice(ENDINGS)}."
            for _ in range(count)]


def vocabulary() -> dict[str, int]:
    """Every character the grammar can write, numbered from 2 (0 pads, 1 starts a sentence)."""
    chars = sorted(set("".join(SUBJECTS + VERBS + OBJECTS + ENDINGS) + " ."))
    return {char: index for index, char in enumerate(chars, start=2)}


def encode(texts: list[str], vocab: dict[str, int], length: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids`` (the start token, then the characters), ``attention_mask``, and
    ``labels``: the ids with -100 at the padding, which the loss skips."""
    ids = torch.full((len(texts), length), PAD, dtype=torch.long)
    for row, text in enumerate(texts):
        tokens = [START] + [vocab[char] for char in text]
        ids[row, :len(tokens)] = torch.tensor(tokens)
    mask = (ids != PAD).long()
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def model_for(vocab_size: int, length: int, rank: int) -> torch.nn.Module:
    """A tiny GPT-2 (2 layers, d = 64, random weights) with LoRA adapters of rank ``rank`` on its
    attention and MLP projections (``c_attn``, ``c_proj``, ``c_fc``)."""
    import peft
    import transformers

    config = transformers.GPT2Config(vocab_size=vocab_size, n_positions=length, n_embd=64, n_layer=2, n_head=2,
                                     pad_token_id=PAD, bos_token_id=START, eos_token_id=START, resid_pdrop=0.0,
                                     embd_pdrop=0.0, attn_pdrop=0.0)
    base = transformers.GPT2LMHeadModel(config)
    lora = peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["c_attn", "c_proj", "c_fc"],
                           fan_in_fan_out=True)  # GPT-2's Conv1D stores its weight [in, out]
    return peft.get_peft_model(base, lora)


def heldout_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> float:
    """The mean per-sentence next-token loss on public (freshly drawn) sentences."""
    from dpopt.oracles.hf import causal_lm_loss

    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        return float(causal_lm_loss(logits, batch["labels"]).mean())


def plot(losses: list[tuple[int, float]], epsilon: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot([step for step, _ in losses], [loss for _, loss in losses], marker="o")
    ax.set(xlabel="step", ylabel="held-out next-token loss", title=f"LoRA GPT-2, DP-SGD, ε = {epsilon:.2f}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/hf_lora_gpt2"), help="output folder")
    parser.add_argument("--epsilon", type=float, default=3.0, help="target ε (default %(default)s)")
    parser.add_argument("--records", type=int, default=1500, help="training sentences (default %(default)s)")
    parser.add_argument("--epochs", type=float, default=2.0, help="epochs (default %(default)s)")
    parser.add_argument("--batch-size", type=int, default=100, help="expected batch size (default %(default)s)")
    parser.add_argument("--clip", type=float, default=1.0, help="per-record clipping norm (default %(default)s)")
    parser.add_argument("--lr", type=float, default=0.02, help="AdamW learning rate (default %(default)s)")
    parser.add_argument("--rank", type=int, default=8, help="LoRA rank (default %(default)s)")
    parser.add_argument("--evaluate-every", type=int, default=5, help="steps between held-out losses")
    parser.add_argument("--seed", type=int, default=None, help="a seed makes the run reproducible (it must then "
                        "stay secret); default: drawn from the operating system")
    args = parser.parse_args(argv)

    import dpopt
    from dpopt.oracles.hf import causal_lm_loss

    torch.manual_seed(0 if args.seed is None else args.seed)  # the model's initial weights: public
    vocab = vocabulary()
    texts = sentences(args.records, seed=1 if args.seed is None else args.seed + 1)
    length = 1 + max(len(f"{s} {v} {o}{e}.") for s in SUBJECTS for v in VERBS for o in OBJECTS for e in ENDINGS)
    train = encode(texts, vocab, length)
    public = encode(sentences(128, seed=-1), vocab, length)  # drawn apart from the training records
    model = model_for(len(vocab) + 2, length, args.rank)
    private = dpopt.Private(model, causal_lm_loss, train, epsilon=args.epsilon, delta=1 / (10 * args.records),
                            epochs=args.epochs, batch_size=args.batch_size, clip=args.clip, seed=args.seed)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr)
    print(f"{args.records} sentences, vocabulary {len(vocab)} characters, {private.steps} steps of expected batch "
          f"{args.batch_size}, target ε = {args.epsilon} at δ = {private.delta:.2g}", flush=True)
    start, losses = time.perf_counter(), [(0, heldout_loss(model, public))]
    for t in private:
        private.backward()
        optimizer.step()
        if (t + 1) % args.evaluate_every == 0 or t + 1 == private.steps:
            losses.append((t + 1, heldout_loss(model, public)))
            print(f"step {t + 1}/{private.steps}: held-out loss {losses[-1][1]:.3f}, ε so far "
                  f"{private.epsilon():.2f} ({time.perf_counter() - start:.0f} s)", flush=True)
    epsilon = private.epsilon()
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, object] = {"epsilon": epsilon, "target_epsilon": args.epsilon, "delta": private.delta,
                                 "steps": private.steps, "heldout_loss": losses}
    (args.out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(losses, epsilon, args.out / "loss.png")
    print(f"ε = {epsilon:.3f} (target {args.epsilon}); held-out loss {losses[0][1]:.3f} -> {losses[-1][1]:.3f}; "
          f"wrote {args.out / 'result.json'} and {args.out / 'loss.png'}", flush=True)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
