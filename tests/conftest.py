"""Shared pytest fixtures."""

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests draw from a fixed seed: the same examples on every run and in CI.
settings.register_profile("dpopt", derandomize=True, deadline=None)
settings.load_profile("dpopt")


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    """Folder of the real data files: ``$DPOPT_TEST_DATA`` or ``shared/data`` beside the repo."""
    env = os.environ.get("DPOPT_TEST_DATA")
    path = Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "data"
    if not path.is_dir():
        pytest.fail(f"real data not found at {path}: set DPOPT_TEST_DATA to the shared data folder")
    return path


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
