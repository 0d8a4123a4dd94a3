"""Entry point of ``python -m evolve.browse``."""

from evolve.browse.cli import main

if __name__ == "__main__":
    main()
