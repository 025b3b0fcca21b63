"""A script swept by `workbench.sweep(cfg, space, payload=Script("train.py", *args))` (or a module,
`module="package.train"`, as python -m runs it): each trial runs it as `workbench.submit_script` /
`workbench launch` does (torchrun's environment on every rank),
with its args.* fields written into the base arguments in their style (sweeps.space.script_argv).
The script reports its metric with `workbench.log(step=..., val_loss=...)`, read from the trial's run
folder as any other trial's.  Kept in sweep.json, so `Sweep.load(folder)` runs the same script."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.config.sections import JobConfig
from workbench.errors import ConfigError
from workbench.runfolder.layout import safe_name
from workbench.sweeps import space as sp

if TYPE_CHECKING:
    from workbench.launch.pool import Pool
    from workbench.launch.run import Run


@dataclass(frozen=True)
class SweptScript:
    path: str
    """The script, resolved when the sweep was made (a resume from another folder finds it), or the
    module's name."""
    args: tuple[str, ...] = ()
    """Its base arguments; each trial's args.* fields replace or follow them."""
    cwd: str = ""
    """The ranks' working folder: where the sweep was made, as submit_script's default."""
    module: bool = False
    """`path` is a module, run as python -m runs it (from `cwd`)."""

    @classmethod
    def given(cls, script: str | Path | None, args: Sequence[str] | None, module: str | None = None) -> SweptScript:
        """The script (or module) and its base arguments, checked: one ConfigError line naming what is wrong."""
        if isinstance(args, (str, bytes)) or not all(isinstance(a, str) for a in args or ()):
            raise ConfigError([f"script_args: {args!r} is not a list of strings; write the script's arguments "
                               "as its command line has them, e.g. ['--epochs', '1']"])
        cwd = Path.cwd()
        if module is not None:
            if script is not None:
                raise ConfigError([f"module: {module!r} and script: {str(script)!r} given; sweep one of them"])
            if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", str(module)):
                raise ConfigError([f"module: {module!r} is not a module name; write it as python -m takes it, "
                                   "e.g. module='package.train'"])
            return cls(str(module), tuple(args or ()), str(cwd), module=True)
        path = (cwd / Path(script or "")).resolve()
        if not path.is_file():
            raise ConfigError([f"script: {script} does not exist (no file {path}); give the path of the "
                               "torchrun-style script to sweep, e.g. script='train.py'"])
        return cls(str(path), tuple(args or ()), str(cwd))

    def base_config(self, cfg: JobConfig) -> JobConfig:
        """cfg as submit_script runs the script (task.name "<script NAME>", the run named after it)."""
        name = self.path.rsplit(".", 1)[-1] if self.module else Path(self.path).stem
        return cfg.replace(task__name=f"<script {name}>",
                           **({} if cfg.launch.name else {"launch__name": safe_name(name)}))

    def submit(self, cfg: JobConfig, params: Mapping[str, Any], run_dir: Path, pool: Pool | None,
               stop_with_caller: bool) -> Run:
        """One trial's run: the script with this trial's arguments, in fresh ranks or the pool's."""
        from workbench.launch.submit import submit_script

        argv = sp.script_argv(self.args, params)
        script, module = (None, self.path) if self.module else (self.path, None)
        if pool is not None:
            return pool.submit_script(script, argv, cfg=cfg, run_dir=run_dir, module=module, cwd=self.cwd)
        return submit_script(script, argv, cfg, run_dir=run_dir, module=module, cwd=self.cwd,
                             stop_with_caller=stop_with_caller)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "args": list(self.args), "cwd": self.cwd, "module": self.module}

    @classmethod
    def from_json(cls, data: Any) -> SweptScript | None:
        if not isinstance(data, Mapping) or not isinstance(data.get("path"), str):
            return None
        return cls(data["path"], tuple(str(a) for a in data.get("args") or ()), str(data.get("cwd") or ""),
                   module=data.get("module") is True)
