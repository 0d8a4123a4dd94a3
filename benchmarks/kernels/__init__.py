"""Kernel benchmark: GPU kernels scored by SOL-ExecBench's speed-of-light score."""
