"""Maps the repository's top-level configs/ and benchmarks/ into the installed package."""

from setuptools import find_namespace_packages, setup

MAPPED = {"evolve.configs": "configs", "evolve.benchmarks": "benchmarks"}


def packages() -> list[str]:
    found = find_namespace_packages(include=["evolve", "evolve.*"])
    for name, folder in MAPPED.items():
        found.append(name)
        found += [f"{name}.{sub}" for sub in find_namespace_packages(where=folder, exclude=["*__pycache__*"])]
    return found


setup(packages=packages(), package_dir={"evolve": "evolve", **MAPPED})
