"""nanochat: train a small language model for a fixed time budget; the harness scores val bits per byte."""
