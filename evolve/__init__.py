"""evolve: open-ended evolutionary search over programs."""

__version__ = "0.1.0"
