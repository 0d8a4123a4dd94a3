"""The NanoGPT speedrun as a fitness: time to a target validation loss, proven over seeds."""
