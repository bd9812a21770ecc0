"""examples/hf_lora_gpt2.py, run with tiny settings: it spends at most its target ε, writes its
result and loss curve, and its held-out loss goes down."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("matplotlib")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "hf_lora_gpt2.py"


def test_lora_gpt2_example_spends_at_most_its_epsilon_and_its_heldout_loss_falls(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("hf_lora_gpt2", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    out = tmp_path / "run"
    example.main(["--out", str(out), "--records", "256", "--batch-size", "64", "--epochs", "1", "--epsilon", "8",
                  "--evaluate-every", "2", "--seed", "0"])
    result = json.loads((out / "result.json").read_text())
    assert 0 < result["epsilon"] <= result["target_epsilon"] == 8
    assert result["delta"] == pytest.approx(1 / 2560)
    losses = [loss for _, loss in result["heldout_loss"]]
    assert [step for step, _ in result["heldout_loss"]] == [0, *range(2, result["steps"] + 1, 2)]
    assert all(math.isfinite(loss) for loss in losses)
    assert losses[-1] < losses[0] - 0.02  # measured: 3.237, 3.028, 3.196
    assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    assert f"step {result['steps']}/{result['steps']}: held-out loss" in printed and "ε = " in printed
