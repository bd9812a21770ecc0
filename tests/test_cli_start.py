"""The command line starts light: the parser, ``account`` and ``calibrate`` import neither torch
nor matplotlib (the parser not even dp_accounting or numpy), and ``import dpopt`` stays a library whose
public names load on first use.

Each command runs in a fresh interpreter that then reports which heavy modules it imported: a
statement about imports, not about time (the time is in the report of issue 17 and BENCHMARKS.md).
Mutant caught: an eager ``import torch`` at the top of a module of ``dpopt/cli/`` (or of ``dpopt/__init__``,
or of a module they import, e.g. ``dpopt.checkpoint`` through ``dpopt.report``)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

HEAVY = ("torch", "matplotlib", "dp_accounting", "scipy", "numpy")
CALIBRATE = ["calibrate", "--mechanism", "poisson-gaussian", "--epsilon", "1", "--sampling-rate", "0.004",
             "--steps", "5000", "--delta", "1e-5", "--json"]
ACCOUNT_TREE = ["account", "--mechanism", "tree", "--noise-multiplier", "3", "--steps", "100", "--delta", "1e-6",
                "--json"]
ACCOUNT_WOR = ["account", "--mechanism", "wor-gaussian", "--noise-multiplier", "1.3", "--dataset-size", "1000",
               "--batch-size", "10", "--steps", "100", "--delta", "1e-5", "--accountant", "rdp", "--json"]


def _heavy_after(code: str) -> set[str]:
    """The modules of :data:`HEAVY` a fresh interpreter has imported after running ``code``."""
    report = f"\nimport json, sys\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    script = textwrap.dedent(code) + report
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


def _heavy_after_cli(argv: list[str]) -> set[str]:
    return _heavy_after(f"""
        import dpopt.cli
        try:
            assert dpopt.cli.main({argv!r}) == 0
        except SystemExit as done:  # --help
            assert done.code == 0
    """)


def test_help_imports_no_torch_and_no_accounting() -> None:
    assert _heavy_after_cli(["--help"]) == set()
    assert _heavy_after_cli(["run", "--help"]) == set()


@pytest.mark.parametrize("argv", [CALIBRATE, ACCOUNT_TREE, ACCOUNT_WOR],
                         ids=["calibrate", "account-tree", "account-wor"])
def test_accounting_commands_import_no_torch(argv: list[str]) -> None:
    assert _heavy_after_cli(argv) == {"dp_accounting", "scipy", "numpy"}


def test_import_dpopt_is_light_and_its_names_load_on_use() -> None:
    assert _heavy_after("import dpopt") == set()
    assert "torch" in _heavy_after("import dpopt; assert callable(dpopt.run) and dpopt.DPSGD.__name__ == 'DPSGD'")


def test_dpopt_fit_is_the_function_also_after_its_module_is_imported() -> None:
    """``dpopt.fit`` names the function, as ``from dpopt import fit`` does, whichever is imported first."""
    _heavy_after("""
        import dpopt.fit
        import dpopt
        from dpopt.fit import fit
        assert dpopt.fit is fit, dpopt.fit
    """)
