"""Shared pytest fixtures."""

import math
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests draw from a fixed seed: the same examples on every run and in CI.
settings.register_profile("dpopt", derandomize=True, deadline=None)
settings.load_profile("dpopt")


# The real data sets the tests read from the shared data folder (Adult is bundled with the package).
REAL_DATA_SETS = ("blogfeedback", "california_housing", "diabetes", "gas_turbine", "ijcnn1", "mnist")


def real_data_dir() -> Path:
    """Folder of the real data files: ``$DPOPT_TEST_DATA``, else ``shared/data`` beside the repository."""
    env = os.environ.get("DPOPT_TEST_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "data"


def missing_real_data() -> str | None:
    """Why the real data cannot be read, or None if every data set the tests read is there."""
    path = real_data_dir()
    missing = [name for name in REAL_DATA_SETS if not (path / name).is_dir()]
    if not missing:
        return None
    return (f"real data not found at {path} (missing: {', '.join(missing)}): set DPOPT_TEST_DATA to the shared "
            "data folder (CI's is ../shared/data beside the repository)")


def require_real_data() -> bool:
    """CI sets ``DPOPT_REQUIRE_DATA=1``: a test that needs the real data then fails where it would skip."""
    return os.environ.get("DPOPT_REQUIRE_DATA") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without the real data (a fresh clone), every test that needs it is skipped with the one reason,
    folded per file in the ``-ra`` summary."""
    reason = missing_real_data()
    if reason is None or require_real_data():
        return
    for item in items:
        if "shared_data_dir" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    """The real data folder; a test that needs it fails here only with ``DPOPT_REQUIRE_DATA=1`` (otherwise it
    was skipped at collection)."""
    reason = missing_real_data()
    if reason is not None:
        pytest.fail(f"{reason}; DPOPT_REQUIRE_DATA=1 forbids skipping it", pytrace=False)
    return real_data_dir()


@pytest.fixture(scope="session", autouse=True)
def private_state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The checkpoint key and the journal of runs (``dpopt.journal``) in a temporary folder for the
    whole session, inherited by every child process: tests write nothing into the user's own
    configuration folder."""
    with pytest.MonkeyPatch.context() as patch:
        folder = tmp_path_factory.mktemp("state")
        patch.setenv("DPOPT_STATE", str(folder))
        yield folder


@pytest.fixture(scope="session", autouse=True)
def cache_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """dpopt's cache folder (``dpopt.cache``: e.g. scattering features) in a temporary folder for the
    whole session, inherited by every child process: tests write nothing into the user's cache."""
    with pytest.MonkeyPatch.context() as patch:
        folder = tmp_path_factory.mktemp("cache")
        patch.setenv("DPOPT_CACHE", str(folder))
        yield folder


@pytest.fixture(autouse=True)
def no_progress_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    """No progress line off a terminal unless a test asks (``dpopt.progress.EVERY_S``): they are printed
    by the wall clock, and a test's output must not depend on how fast the machine is. Child
    processes read ``DPOPT_PROGRESS_SECONDS``."""
    from dpopt import progress

    monkeypatch.setattr(progress, "EVERY_S", math.inf)
    monkeypatch.setenv("DPOPT_PROGRESS_SECONDS", "inf")


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread() -> None:
    """Tiny tensors run far faster on one thread than two on this 2-core machine."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test with a ``device`` argument runs on every device present: the CPU always, CUDA and
    MPS where available."""
    if "device" in metafunc.fixturenames:
        import torch

        present = ["cpu", *(["cuda"] if torch.cuda.is_available() else []),
                   *(["mps"] if torch.backends.mps.is_available() else [])]
        metafunc.parametrize("device", present)


@pytest.fixture
def drawn_figures(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """The figures the code under test saves through ``dpopt.report.save_figure``, by file name,
    kept open for checking (see ``legibility.py``) and not written; closed afterwards."""
    import matplotlib.pyplot as plt

    from dpopt import report

    figures: dict[str, object] = {}
    monkeypatch.setattr(report, "save_figure", lambda path, fig: figures.__setitem__(Path(path).name, fig))
    yield figures
    for fig in figures.values():
        plt.close(fig)
