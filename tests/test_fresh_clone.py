"""A fresh clone has no real data folder: its tests that need one skip with the one reason that says how
to give it, and CI (``DPOPT_REQUIRE_DATA=1``) fails on them instead of skipping."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# One test that reads ijcnn1 from the real data folder.
REAL_DATA_TEST = "tests/data/test_libsvm.py::test_ijcnn1_train_matches_reference_bit_for_bit"


def pytest_without_data(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Runs the real-data test in a new pytest whose data folder is empty."""
    empty = tmp_path / "no-data"
    empty.mkdir()
    environ = {key: value for key, value in os.environ.items() if key != "DPOPT_REQUIRE_DATA"}
    environ.update(DPOPT_TEST_DATA=str(empty), **env)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", REAL_DATA_TEST],
                          cwd=REPO, env=environ, capture_output=True, text=True, timeout=300)


def test_a_real_data_test_skips_with_the_reason_without_the_data(tmp_path):
    done = pytest_without_data(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 skipped" in done.stdout and "passed" not in done.stdout and "error" not in done.stdout
    assert (f"SKIPPED [1] tests/data/test_libsvm.py: real data not found at {tmp_path / 'no-data'} (missing: "
            "blogfeedback, california_housing, diabetes, gas_turbine, ijcnn1, mnist): set DPOPT_TEST_DATA to the "
            "shared data folder") in done.stdout


def test_ci_fails_a_real_data_test_that_would_skip(tmp_path):
    done = pytest_without_data(tmp_path, DPOPT_REQUIRE_DATA="1")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 error" in done.stdout and "skipped" not in done.stdout
    assert f"real data not found at {tmp_path / 'no-data'}" in done.stdout
    assert "DPOPT_REQUIRE_DATA=1 forbids skipping it" in done.stdout
