"""The operators: each turns parents into a proposal, by built-in edits or by asking a model."""

__all__ = [  # modules, each imported where it is used
    "base",
    "builtin",
    "catalog",
    "crossover",
    "edits",
    "llm_catalog",
    "mutate",
    "prompting",
    "search_replace",
]
