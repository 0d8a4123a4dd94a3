"""The search loop: the ask/tell engine, its emitters and checks, and the driver that keeps evaluations in flight."""

from evolve.search.driver import Driver, Summary
from evolve.search.emitters import Emitter
from evolve.search.engine import Engine
from evolve.search.novelty import Novelty
from evolve.search.rejections import Rejection

__all__ = ["Driver", "Emitter", "Engine", "Novelty", "Rejection", "Summary"]
