"""``python -m evolve [overrides]``: run or resume a search (Hydra entry point)."""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from evolve.cli import check_resume_argument, report
from evolve.config import as_dict


@hydra.main(version_base=None, config_path="pkg://evolve.configs", config_name="config")
def main(cfg: DictConfig) -> None:
    report(
        as_dict(cfg),
        Path(HydraConfig.get().runtime.output_dir),
        list(HydraConfig.get().overrides.task),
    )


if __name__ == "__main__":
    check_resume_argument(sys.argv[1:])
    main()
