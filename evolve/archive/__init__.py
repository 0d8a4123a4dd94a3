"""The archive and who gets in: MAP-Elites grids, noise-aware comparison and its statistics, the referee."""

from evolve.exports import lazy

__all__, __getattr__, __dir__ = lazy(
    __name__,
    {
        "Archive": "evolve.archive.grid",
        "Elite": "evolve.archive.grid",
        "describe_cell": "evolve.archive.grid",
        "NoiseJudge": "evolve.archive.noise",
        "Calibration": "evolve.archive.noise",
        "Samples": "evolve.archive.statistics",
        "improvement_pvalue": "evolve.archive.statistics",
        "one_sided_pvalue": "evolve.archive.statistics",
        **dict.fromkeys(
            ("Referee", "Auditor", "AuditVerdict", "ModelReview", "ReviewDiff"),
            "evolve.archive.referee",
        ),
    },
)
