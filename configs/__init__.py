"""Configuration of evolve (Hydra YAML groups), shipped inside the package."""
