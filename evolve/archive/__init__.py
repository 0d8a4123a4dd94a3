"""The archive and who gets in: MAP-Elites grids, noise-aware comparison, re-evaluation and the auditor."""

from evolve.archive.grid import Archive, Elite
from evolve.archive.noise import Calibration, NoiseJudge, make_calibration
from evolve.archive.referee import Auditor, AuditVerdict, ModelReview, Referee, ReviewDiff

__all__ = [
    "Archive",
    "AuditVerdict",
    "Auditor",
    "Calibration",
    "Elite",
    "ModelReview",
    "NoiseJudge",
    "Referee",
    "ReviewDiff",
    "make_calibration",
]
