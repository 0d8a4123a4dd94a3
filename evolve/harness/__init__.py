"""Harness layer: what every benchmark's harness shares and candidates never see."""
