"""The search loop: the ask/tell engine, its emitters and checks, and the driver that keeps evaluations in flight."""

from evolve.exports import lazy

__all__, __getattr__, __dir__ = lazy(
    __name__,
    {
        "Engine": "evolve.search.engine",
        "Emitter": "evolve.search.emitters",
        "Driver": "evolve.search.driver",
        "Summary": "evolve.search.driver",
        "Novelty": "evolve.search.novelty",
        "Rejection": "evolve.search.rejections",
    },
)
