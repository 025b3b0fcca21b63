"""The job config: typed sections with a docstring per field (`sections`), field types and
overrides (`types`), safe and bounded YAML reading (`yamlfile`), the checks that need the target
machine (`validate`), the scaling rules (`scaling`), presets and the target's devices.

A config is valid by construction: every way of making one raises one ConfigError listing every
problem."""

from workbench.config.sections import (
    DataConfig,
    DistConfig,
    EarlyStoppingConfig,
    JobConfig,
    LaunchConfig,
    LogConfig,
    ScalingConfig,
    SlurmConfig,
    TaskConfig,
    TrainConfig,
)
from workbench.errors import ConfigError, ConfigFileError

__all__ = ["ConfigError", "ConfigFileError", "DataConfig", "DistConfig", "EarlyStoppingConfig", "JobConfig",
           "LaunchConfig", "LogConfig", "ScalingConfig", "SlurmConfig", "TaskConfig", "TrainConfig"]
