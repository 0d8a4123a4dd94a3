"""What a run learns and shows: the research notebook, its model summaries, the auditor's model review, lineage, plots."""

from evolve.exports import lazy

__all__, __getattr__, __dir__ = lazy(
    __name__,
    {
        "Notebook": "evolve.research.notebook",
        "NotebookFeed": "evolve.research.summary",
        "Summariser": "evolve.research.summary",
        "Reviewer": "evolve.research.review",
        "Lineage": "evolve.research.lineage",
        "write_plots": "evolve.research.plots",
    },
)
