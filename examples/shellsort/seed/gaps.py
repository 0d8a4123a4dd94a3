"""Prints the gap sequence Shell sort uses for a list of N items (N is the first argument)."""

import json
import sys

# EVOLVE-BLOCK-START
FIRST = 0.5  # the first gap, as a fraction of N
RATIO = 2.0  # each next gap is the previous one divided by this


def gaps(n: int) -> list[int]:
    """Decreasing gaps from about FIRST * N down to 1."""
    sequence = []
    gap = int(n * FIRST)
    while gap > 1:
        sequence.append(gap)
        gap = min(gap - 1, int(gap / RATIO))
    return [*sequence, 1]


# EVOLVE-BLOCK-END

if __name__ == "__main__":
    print(json.dumps(gaps(int(sys.argv[1]))))
