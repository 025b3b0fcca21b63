"""The training loop of one rank.  Reads top to bottom like nanoGPT's train.py:

    lr (scheduler) -> micro-steps (no_sync on all but the last) -> clip -> step -> zero_grad
    -> log -> eval -> checkpoint -> early stop

Everything rank-dependent (who writes checkpoints, who decides early stopping) is decided when
the Trainer is built; the loop itself has no rank branches except the rank-0 checkpoint write.
"""

from __future__ import annotations

import contextlib
import resource
import time
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from workbench.config import JobConfig
from workbench.engine.commtiming import attach as attach_comm_timer
from workbench.engine.checkpoint import load_latest, rng_state, save_checkpoint, set_rng_state
from workbench.engine.data import eval_loader, start_epoch, to_device, train_loader
from workbench.engine.env import DistEnv
from workbench.engine.monitor import RankMonitor
from workbench.engine.optim import build_optimizer, build_scheduler
from workbench.engine.preempt import PreemptionFlag
from workbench.engine.health import HealthCheck, check_shards
from workbench.engine.steplog import StepLogger
from workbench.engine.tasks import Task
from workbench.rundir import RunDir
from workbench.scaling import describe_change, effective_batch, scaled


# A preemption signal is shared across ranks on logged steps, and at least this often.
STOP_CHECK_EVERY_STEPS = 10


class Trainer:
    def __init__(self, cfg: JobConfig, task: Task, env: DistEnv, device: str, run: RunDir, monitor: RankMonitor,
                 preempt: PreemptionFlag | None = None):
        self.cfg, self.task, self.env, self.device, self.run, self.monitor = cfg, task, env, device, run, monitor
        t = cfg.train
        self.accum = t.grad_accum_steps
        self.model = DDP(task.model.to(device), device_ids=[device] if device.startswith("cuda") else None,
                         find_unused_parameters=cfg.dist.find_unused_parameters,
                         gradient_as_bucket_view=cfg.dist.gradient_as_bucket_view,
                         static_graph=cfg.dist.static_graph, bucket_cap_mb=cfg.dist.bucket_cap_mb)
        self.comm = attach_comm_timer(self.model, cfg.dist.comm_hook, cfg.dist.measure_comm)
        self.loader = train_loader(task.train_dataset, cfg.data, t.micro_batch_size, env.rank, env.world_size,
                                   t.seed, device)
        self.val_loader = (eval_loader(task.val_dataset, cfg.data, t.micro_batch_size, env.rank, env.world_size,
                                       device) if task.val_dataset is not None else None)
        self.steps_per_epoch = len(self.loader) // self.accum  # micro-batches per epoch / accum
        if self.steps_per_epoch < 1:
            raise ValueError(_too_small_message(cfg, env.world_size, len(task.train_dataset)))
        self.total_steps = min(t.max_steps or 10**12, t.epochs * self.steps_per_epoch)
        self.scale = scaled(cfg, env.world_size)
        self.optimizer = build_optimizer(self.model, t, self.scale.lr)
        self.scheduler = build_scheduler(self.optimizer, t, self.scale.warmup_steps, self.total_steps)
        device_type = device.split(":")[0]
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(t.precision)
        self.autocast = (lambda: torch.autocast(device_type, dtype=dtype)) if dtype else contextlib.nullcontext
        self.scaler = torch.amp.GradScaler(device_type, enabled=t.precision == "fp16")
        self.step = self.epoch = self.micro_in_epoch = 0
        self.best: float | None = None
        self.bad_evals = 0
        self.stop_reason = ""
        self.last_eval: dict[str, float] = {}
        self.preempt = preempt or PreemptionFlag()
        self.steplog = StepLogger(monitor, env.world_size, device)
        self.health = HealthCheck(self.model.module, monitor, env, device, cfg.dist.straggler_threshold)

    # --- the loop --------------------------------------------------------------------------------
    def fit(self) -> dict[str, Any]:
        self._start_event()
        check_shards(self.loader.sampler, self.monitor, self.env.is_main, self.device)
        if self.step >= self.total_steps:  # resumed a run that had already reached its end
            self.stop_reason = "max_steps"
        while not self.stop_reason:
            batches = start_epoch(self.loader, self.epoch, self.micro_in_epoch * self.cfg.train.micro_batch_size,
                                  self.cfg.train.seed, self.env.rank)
            while self.micro_in_epoch // self.accum < self.steps_per_epoch and not self.stop_reason:
                self.train_step(batches)
                self.after_step()
            if not self.stop_reason:
                self.end_epoch()
        self.steplog.flush()  # the last step's record
        if self.step and self.saved_step != self.step:
            self.save()
        return self.summary()

    def train_step(self, batches: Iterator[Any]) -> None:
        self.steplog.poll()
        t0 = time.perf_counter()
        data_time = 0.0
        loss_sum = torch.zeros((), device=self.device)
        for micro in range(self.accum):
            t_data = time.perf_counter()
            inputs, target = to_device(next(batches), self.device)
            data_time += time.perf_counter() - t_data
            # Gradients are all-reduced only on the last micro-step: no_sync() skips the others.
            sync = contextlib.nullcontext() if micro == self.accum - 1 else self.model.no_sync()
            with sync:
                with self.autocast():
                    loss = self.task.loss_fn(self.model(inputs), target) / self.accum
                self.scaler.scale(loss).backward()
            loss_sum += loss.detach()
        comm_wait, comm_busy = self.comm.take(time.perf_counter())
        self.micro_in_epoch += self.accum
        if self.cfg.train.grad_clip_norm is not None:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.train.grad_clip_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        lr = self.scheduler.get_last_lr()[0]
        self.scheduler.step()
        self.step += 1
        self.monitor.step = self.step
        step_time = time.perf_counter() - t0
        self.health.record_work_time(step_time - (comm_wait if comm_wait == comm_wait else 0.0))  # NaN: not measured
        logged = self.step % self.cfg.train.log_every_steps == 0
        if logged or self.step % STOP_CHECK_EVERY_STEPS == 0:
            timings = {"step_time_s": step_time, "data_time_s": data_time, "comm_wait_s": comm_wait,
                       "comm_busy_s": comm_busy}
            record = self.record(loss_sum, lr, timings) if logged else None
            if self.steplog.log(record, loss_sum, self.preempt.requested):
                self.stop_reason = "preempted"  # some rank was signalled; all ranks see it at this step

    def record(self, loss_sum: torch.Tensor, lr: float, timings: dict[str, float]) -> dict[str, Any]:
        samples = self.cfg.train.micro_batch_size * self.accum
        return {
            "rank": self.env.rank, "step": self.step, "epoch": self.epoch, "time": time.time(),
            "loss": loss_sum.item(), "lr": lr,  # .item() is a host sync point on GPU
            **timings, "samples_per_s": samples / timings["step_time_s"],
            "mem_mb": self._memory_mb(), "attempt": self.monitor.attempt,
        }

    def after_step(self) -> None:
        t = self.cfg.train
        if self.stop_reason == "preempted":
            self.save()
            self.monitor.event("preempted", epoch=self.epoch)
            return
        if self.cfg.dist.check_every_steps and self.step % self.cfg.dist.check_every_steps == 0:
            self.health.check(self.step)
        if t.eval_every_steps and self.step % t.eval_every_steps == 0:
            self.evaluate()
        if t.checkpoint_every_steps and self.step % t.checkpoint_every_steps == 0:
            self.save()
        if self.step >= self.total_steps:
            self.stop_reason = self.stop_reason or "max_steps"

    def end_epoch(self) -> None:
        self.monitor.event("epoch_end", epoch=self.epoch)
        self.epoch += 1
        self.micro_in_epoch = 0
        if not self.cfg.train.eval_every_steps:
            self.evaluate()
        if not self.cfg.train.checkpoint_every_steps:
            self.save()
        if self.epoch >= self.cfg.train.epochs:
            self.stop_reason = self.stop_reason or "epochs"

    # --- evaluation and early stopping -----------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        if self.val_loader is None:
            return {}
        module = self.model.module  # not the DDP wrapper: shards may differ in batch count
        module.eval()
        names = ["val_loss", *(f"val_{k}" for k in self.task.metrics)]
        sums = torch.zeros(len(names) + 1, dtype=torch.float64, device=self.device)
        with torch.no_grad(), self.autocast():
            for batch in self.val_loader:
                inputs, target = to_device(batch, self.device)
                out = module(inputs)
                n = len(target)
                values = [self.task.loss_fn(out, target), *(fn(out, target) for fn in self.task.metrics.values())]
                sums[:-1] += torch.stack([torch.as_tensor(v, dtype=torch.float64, device=self.device) for v in values]) * n
                sums[-1] += n
        module.train()
        dist.all_reduce(sums)  # sums and counts: exact for uneven shards
        result = {name: (sums[i] / sums[-1]).item() for i, name in enumerate(names)}
        self.last_eval = result
        self.monitor.event("eval", epoch=self.epoch, **result)
        self._early_stop(result)
        return result

    def _early_stop(self, result: dict[str, float]) -> None:
        es = self.cfg.train.early_stopping
        if es.patience is None:
            return
        decision = torch.zeros(1, device=self.device)
        if self.env.is_main:
            decision[0] = float(self._no_improvement(result[es.metric] if es.metric in result else None))
        dist.broadcast(decision, src=0)  # rank 0 decides; every rank stops at the same step
        if decision.item():
            self.stop_reason = "early_stop"
            self.monitor.event("early_stop", metric=es.metric, best=self.best, patience=es.patience)

    def _no_improvement(self, value: float | None) -> bool:
        es = self.cfg.train.early_stopping
        if value is None:
            raise KeyError(f"train.early_stopping.metric: {es.metric!r} is not a validation metric; "
                           f"choose one of {sorted(self.last_eval)}")
        better = self.best is None or (value < self.best - es.min_delta if es.mode == "min"
                                       else value > self.best + es.min_delta)
        if better:
            self.best, self.bad_evals = value, 0
        else:
            self.bad_evals += 1
        return self.bad_evals >= es.patience

    # --- checkpoints -----------------------------------------------------------------------------
    saved_step = -1

    def save(self) -> None:
        states: list[Any] = [None] * self.env.world_size
        dist.all_gather_object(states, rng_state())  # every rank's RNG, so resume is exact
        if self.env.is_main:
            with self.monitor.saving:
                path = save_checkpoint(self.run, self.step, self._state(states), self.cfg.train.keep_checkpoints)
            self.monitor.event("checkpoint", path=str(path), epoch=self.epoch)
        self.saved_step = self.step

    def _state(self, rng_states: list[Any]) -> dict[str, Any]:
        return {
            "model": self.model.module.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict(),
            "step": self.step, "epoch": self.epoch, "micro_in_epoch": self.micro_in_epoch,
            "best": self.best, "bad_evals": self.bad_evals, "rng": rng_states,
            "world_size": self.env.world_size, "config": self.cfg.to_dict(),
        }

    def resume(self) -> bool:
        """Load the run's latest checkpoint, if any; returns whether one was loaded."""
        found = load_latest(self.run)
        if found is None:
            return False
        path, state = found
        self.model.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.step, self.epoch, self.micro_in_epoch = state["step"], state["epoch"], state["micro_in_epoch"]
        self.best, self.bad_evals, self.saved_step = state["best"], state["bad_evals"], state["step"]
        self.monitor.step = self.step
        old_world = state["world_size"]
        if old_world == self.env.world_size:
            set_rng_state(state["rng"][self.env.rank])
        else:
            self._rescale_after_resume(old_world)
        self.monitor.event("resume", path=str(path), epoch=self.epoch, from_world_size=old_world)
        return True

    def _rescale_after_resume(self, old_world: int) -> None:
        """A different world size: new lr and warmup under the scaling rule, epoch restarts its shard."""
        for group in self.optimizer.param_groups:
            group["initial_lr"] = self.scale.lr
        self.scheduler.base_lrs = [self.scale.lr for _ in self.optimizer.param_groups]
        self.micro_in_epoch = 0
        self.monitor.event("rescale", message=describe_change(self.cfg, old_world, self.env.world_size))

    # --- reporting -------------------------------------------------------------------------------
    def _start_event(self) -> None:
        s = self.scale
        self.monitor.event("start", world_size=self.env.world_size, device=self.device,
                           effective_batch=s.effective_batch, lr=s.lr, warmup_steps=s.warmup_steps,
                           steps_per_epoch=self.steps_per_epoch, total_steps=self.total_steps,
                           samples_per_rank=self.loader.sampler.num_samples)

    def summary(self) -> dict[str, Any]:
        return {"rank": self.env.rank, "steps": self.step, "epochs": self.epoch, "stop_reason": self.stop_reason,
                "last_eval": self.last_eval, "best": self.best, "total_steps": self.total_steps}

    def _memory_mb(self) -> float:
        if self.device.startswith("cuda"):
            return torch.cuda.max_memory_allocated(self.device) / 2**20
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # peak RSS (KiB on Linux)


def _too_small_message(cfg: JobConfig, world: int, n: int) -> str:
    per_step = effective_batch(cfg.train.micro_batch_size, cfg.train.grad_accum_steps, world)
    return (f"train.micro_batch_size: the training set has {n} samples but one optimizer step needs "
            f"{per_step} (micro_batch_size x grad_accum_steps x world_size); lower micro_batch_size "
            f"or grad_accum_steps, or use fewer ranks")
