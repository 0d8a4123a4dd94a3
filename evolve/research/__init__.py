"""What a run learns and shows: the research notebook, its model summaries, the auditor's model review, lineage and plots."""

from evolve.research.lineage import Lineage, ancestry
from evolve.research.notebook import Notebook
from evolve.research.plots import write_plots
from evolve.research.review import Reviewer
from evolve.research.summary import NotebookFeed, Summariser

__all__ = [
    "Lineage",
    "Notebook",
    "NotebookFeed",
    "Reviewer",
    "Summariser",
    "ancestry",
    "write_plots",
]
