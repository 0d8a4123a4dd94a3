"""Parameters the traced test fitness scores (it reads, never runs, them)."""

# EVOLVE-BLOCK-START
A = 1.0
B = 4
C = 0.5
# EVOLVE-BLOCK-END
