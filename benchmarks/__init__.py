"""Benchmarks shipped with evolve: each a seed program, a harness and a task statement."""
