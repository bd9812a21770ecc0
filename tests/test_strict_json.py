"""Every JSON dpopt writes or prints is strict (no NaN / Infinity tokens): NaN is null, ±∞ is
"inf" / "-inf"; figures leave out what they cannot draw instead of crashing."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch

import dpopt
from dpopt import report


def strict(text: str) -> object:
    """``json.loads`` that refuses the NaN / Infinity extensions of Python's json module."""
    def refuse(token: str) -> None:
        raise AssertionError(f"{token} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_non_finite_numbers_become_null_or_inf_strings() -> None:
    payload = {"nan": math.nan, "inf": math.inf, "list": [1.5, -math.inf], "numpy": np.float32("nan"),
               "array": np.array([1.0, np.inf]), "tensor": torch.tensor([math.nan, 2.0]), "tuple": (math.nan,),
               "int": 3, "text": "nan", "none": None, "path": Path("a")}
    assert strict(report.to_json(payload)) == {
        "nan": None, "inf": "inf", "list": [1.5, "-inf"], "numpy": None, "array": [1.0, "inf"],
        "tensor": [None, 2.0], "tuple": [None], "int": 3, "text": "nan", "none": None, "path": "a"}


def test_a_written_json_file_is_strict(tmp_path: Path) -> None:
    report.write_json(tmp_path / "x.json", {"epsilon": math.inf, "std": math.nan})
    assert strict((tmp_path / "x.json").read_text()) == {"epsilon": "inf", "std": None}


def test_a_non_private_run_writes_strict_json(tmp_path: Path) -> None:
    """Finding: ε = ∞ of a non-private run was printed and written as the token Infinity. (The CLI
    now refuses a non-private method at an ε target; the Python run still reports ε = ∞.)"""
    X = torch.randn(40, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    history = dpopt.run(dpopt.Storm(lr=0.1, momentum=0.5, batch_size0=8, batch_size=4),
                        dpopt.oracles.Ridge(X, X[:, 0].clone()), steps=5, seed=0)
    report.write_json(tmp_path / "history.json", history.to_dict())
    written = strict((tmp_path / "history.json").read_text())
    assert written["final"]["epsilon"] == "inf" and {r["epsilon"] for r in written["records"]} == {"inf"}
    assert strict(report.to_json(history.to_dict()))["final"]["epsilon"] == "inf"


def test_figures_leave_out_what_they_cannot_draw(tmp_path: Path) -> None:
    """Finding: a diverged run's curves raised OverflowError in matplotlib (huge and infinite values)."""
    x = np.arange(1.0, 7.0)
    y = np.array([1.0, 1e50, 1e270, math.inf, math.nan, 0.0])
    left_out = report.curves_figure(tmp_path / "curves.png", {"objective": {"a": (x, y)}, "again": {"a": (x, y)}},
                                    xlabel="passes", title="ε = 1, δ = 1e-5")
    assert left_out == 2 * 4  # 1e270, ∞, NaN, and 0 on the log axis, in each panel
    assert (tmp_path / "curves.png").read_bytes().startswith(b"\x89PNG")
    assert report.curves_figure(tmp_path / "lin.png", {"o": {"a": (x, y)}}, xlabel="passes", title="ε, δ",
                                log_y=False) == 3
