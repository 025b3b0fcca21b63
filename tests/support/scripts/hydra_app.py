"""A Hydra app run as a torchrun-style script, as pytorch/examples' minGPT-ddp is: its settings come as
overrides (optimizer_config.learning_rate=0.1), never as --options.  It logs score = 1000 x the
learning rate its ranks all-reduced, so a swept trial says which value it got."""

from dataclasses import dataclass, field

import hydra
import torch
import torch.distributed as dist
from hydra.core.config_store import ConfigStore

import workbench


@dataclass
class OptimizerConfig:
    learning_rate: float = 0.5


@dataclass
class TrainerConfig:
    max_epochs: int = 2


@dataclass
class Config:
    optimizer_config: OptimizerConfig = field(default_factory=OptimizerConfig)
    trainer_config: TrainerConfig = field(default_factory=TrainerConfig)


ConfigStore.instance().store(name="config", node=Config)


@hydra.main(version_base=None, config_name="config")
def main(cfg: Config) -> None:
    dist.init_process_group("gloo")
    for step in range(1, cfg.trainer_config.max_epochs + 1):
        lr = torch.tensor([float(cfg.optimizer_config.learning_rate)])
        dist.all_reduce(lr)
        workbench.log(step=step, score=1000 * lr.item() / dist.get_world_size())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
