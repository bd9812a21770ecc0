"""dpopt: differentially private optimisers with exact, checked privacy accounting.

Public API (re-exports only): algorithms, the ledger and calibration, the training loop.
"""

from .accounting import Ledger, calibrate, epsilon_of
from .algorithms import DIFF2, DPAGD, DPSGD, DPSRM, O2NC, AClip, O2NCMulti, LocalSteps, RestartedAClip, Stage, Storm, dp_gd, rrpsgd
from .fit import fit
from .mechanisms import SeededNoise, SystemNoise
from .private import Private
from .train import History, run
from .tuning import tune

__all__ = [
    "AClip", "DIFF2", "DPAGD", "DPSGD", "DPSRM", "History", "Ledger", "LocalSteps", "O2NC", "O2NCMulti", "Private",
    "RestartedAClip", "SeededNoise", "Stage", "Storm", "SystemNoise", "calibrate", "dp_gd", "epsilon_of", "fit", "rrpsgd",
    "run", "tune",
]
__version__ = "0.1.0"
