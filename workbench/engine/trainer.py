"""The training loop of one rank.  Reads top to bottom like nanoGPT's train.py:

    micro-steps (no gradient sync on all but the last) -> clip -> step -> zero_grad -> lr -> log
    -> health check -> eval -> early stop -> checkpoint

How the model is held (DDP's replicas or FSDP2's shards) is the strategy's (engine/strategy.py),
chosen once from dist.strategy; the loop is the same for both.

Every call that all ranks must reach together (a collective: if one rank skips it, the others wait
until the process-group timeout) is made from fit() or train_step() and marked "collective" there.
What differs between ranks is decided when the Trainer is built (rank 0's checkpoint writer, the
others' do-nothing one; rank 0 records run-wide findings), not by branches in the loop.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from workbench.config.scaling import effective_batch, scaled, too_small_message
from workbench.config.sections import JobConfig
from workbench.engine.checkpoint import checkpoint_writer, gather_rng_states, load_latest, set_rng_state
from workbench.engine.data import eval_loader, resumable_sampler, start_epoch, to_device, train_loader
from workbench.engine.env import DistEnv
from workbench.engine.health import HealthCheck, check_shards
from workbench.engine.memprobe import FirstStepsMemory
from workbench.engine.monitor import RankMonitor
from workbench.engine.optim import build_optimizer, build_scheduler
from workbench.engine.preempt import PreemptionFlag
from workbench.engine.steplog import StepLogger
from workbench.engine.strategy import build_strategy, clip_grad_norm
from workbench.engine.tasks import Task, forward_loss
from workbench.errors import ConfigError
from workbench.runfolder import events
from workbench.runfolder.layout import RunDir

# A preemption signal is shared across ranks with the losses (steplog), at least this often (steps).
STOP_CHECK_EVERY_STEPS = 10
# glibc malloc: blocks below this come from the heap, and freed heap memory is kept for reuse up to this much.
MMAP_THRESHOLD_BYTES = 32 * 2**20  # the ceiling of glibc's own adaptive threshold on 64-bit
TRIM_THRESHOLD_BYTES = 256 * 2**20
MALLOC_ENV = ("GLIBC_TUNABLES", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "LD_PRELOAD")


def keep_freed_memory() -> bool:
    """Let this process reuse the memory a training step frees instead of returning it to the OS.

    A step allocates and frees the same large temporaries every time (activations, gradients,
    the optimizer's intermediate tensors).  glibc's malloc adapts its thresholds as it goes and,
    depending on the order things were allocated in, ends up either reusing that memory or giving
    it back to the OS at every free and faulting it in again (zeroed) at the next allocation:
    measured on the throughput bench's model, 45 to 400 page faults per rank per step and up to a
    quarter of the step's CPU time, switching from run to run.  Fixed thresholds keep it in the
    first state.  Returns whether they were set: not when the user chose malloc settings or
    another allocator (the environment variables in MALLOC_ENV), nor off glibc."""
    if any(name in os.environ for name in MALLOC_ENV):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to tune here
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    return bool(mallopt(m_mmap_threshold, MMAP_THRESHOLD_BYTES)) and bool(mallopt(m_trim_threshold,
                                                                                 TRIM_THRESHOLD_BYTES))


class Trainer:
    def __init__(self, cfg: JobConfig, task: Task, env: DistEnv, device: str, run: RunDir, monitor: RankMonitor,
                 preempt: PreemptionFlag | None = None, resized: str = ""):
        self.cfg, self.task, self.env, self.device, self.run, self.monitor = cfg, task, env, device, run, monitor
        self.resized = resized  # how the run changed to continue at this world size ("": it did not)
        keep_freed_memory()
        t = cfg.train
        self.accum = t.grad_accum_steps
        self.strategy = build_strategy(cfg, task.model, device)  # DDP(model), or fully_shard per unit
        self.model = self.strategy.model
        self.comm = self.strategy.comm
        self.loader = train_loader(task.train_dataset, cfg.data, t.micro_batch_size, env.rank, env.world_size,
                                   t.seed, device)
        self.val_loader = (eval_loader(task.val_dataset, cfg.data, t.micro_batch_size, env.rank, env.world_size,
                                       device) if task.val_dataset is not None else None)
        self.steps_per_epoch = len(self.loader) // self.accum  # micro-batches per epoch / accum
        if self.steps_per_epoch < 1:
            raise ConfigError([too_small_message(cfg, env.world_size, len(task.train_dataset))])
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
        self.steplog = StepLogger(monitor, env.world_size, device, max_every=STOP_CHECK_EVERY_STEPS)
        self.health = HealthCheck(self.strategy.module, monitor, env, device, cfg.dist.straggler_threshold)
        self.checkpoints = checkpoint_writer(env.is_main, run, t.keep_checkpoints, monitor, self.strategy.sharded)
        self.memory = FirstStepsMemory(cfg.log.measure_memory, device, self.model, self.optimizer,
                                       self.strategy.sharded, monitor)

    # --- the loop --------------------------------------------------------------------------------
    def fit(self) -> dict[str, Any]:
        t, d = self.cfg.train, self.cfg.dist
        self._start_event()
        sampler = resumable_sampler(self.loader)
        check_shards(sampler, self.monitor, self.device)  # collective: all_gather of shard indices
        if self.step >= self.total_steps:  # resumed a run that had already reached its end
            self.stop_reason = "max_steps"
        while not self.stop_reason:
            batches = start_epoch(self.loader, self.epoch, self.samples_in_epoch(), t.seed, self.env.rank)
            while self.micro_in_epoch // self.accum < self.steps_per_epoch and not self.stop_reason:
                self.train_step(batches)  # every few steps a collective: losses + stop-flag all_reduce (async)
                if self.stop_reason == "preempted":
                    self.save()  # collective: all_gather_object of RNG states, then rank 0 writes
                    self.monitor.event(events.PREEMPTED, epoch=self.epoch)
                    break
                if _due(self.step, d.check_every_steps):
                    self.health.check(self.step)  # collective: all_gather of parameter checksums, work times
                if _due(self.step, t.eval_every_steps):
                    self.evaluate()  # collective: all_reduce of the eval sums
                    self.early_stop()  # collective: broadcast of rank 0's decision
                if _due(self.step, t.checkpoint_every_steps):
                    self.save()  # collective: all_gather_object of RNG states, then rank 0 writes
                if self.step >= self.total_steps:
                    self.stop_reason = self.stop_reason or "max_steps"
            if self.stop_reason:
                break
            self.end_epoch()
            if not t.eval_every_steps:
                self.evaluate()  # collective: all_reduce of the eval sums
                self.early_stop()  # collective: broadcast of rank 0's decision
            if not t.checkpoint_every_steps:
                self.save()  # collective: all_gather_object of RNG states, then rank 0 writes
            if self.epoch >= t.epochs:
                self.stop_reason = self.stop_reason or "epochs"
        self.steplog.finish()  # collective: the reduce of the last records (if any are kept)
        if self.step and self.saved_step != self.step:
            self.save()  # collective: every rank ends here with the same step
        return self.summary()

    def train_step(self, batches: Iterator[Any]) -> None:
        if not self.memory.left:  # every step after the measured ones: nothing around it
            self._train_step(batches)
            return
        with self.memory.step():  # the first two steps' peak memory (engine.memprobe)
            self._train_step(batches)

    def _train_step(self, batches: Iterator[Any]) -> None:
        self.steplog.poll()
        t0 = time.perf_counter()
        data_time = 0.0
        loss_sum: torch.Tensor | None = None
        for micro in range(self.accum):
            t_data = time.perf_counter()
            with self.memory.untracked():
                batch = to_device(next(batches), self.device)
            data_time += time.perf_counter() - t_data
            # Gradients are reduced only on the last micro-step (ddp: no_sync(); fsdp2: no reduce-scatter).
            with self.strategy.sync(micro == self.accum - 1):
                with self.autocast():
                    loss = forward_loss(self.model, batch, self.task.loss_fn)[0]
                    if self.accum > 1:
                        loss = loss / self.accum
                self.scaler.scale(loss).backward()
            loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
        assert loss_sum is not None  # grad_accum_steps >= 1
        comm_wait, comm_busy = self.comm.take(time.perf_counter())
        self.micro_in_epoch += self.accum
        if self.cfg.train.grad_clip_norm is not None:
            self.scaler.unscale_(self.optimizer)
            clip_grad_norm(self.strategy.module, self.cfg.train.grad_clip_norm)  # fsdp2: collective (norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        lr = float(self.optimizer.param_groups[0]["lr"])  # the lr this step trained with
        self.scheduler.step()
        self.step += 1
        self.monitor.step = self.step
        step_time = time.perf_counter() - t0
        self.health.record_work_time(step_time - (comm_wait if comm_wait == comm_wait else 0.0))  # NaN: not measured
        record = None
        if self.step % self.cfg.train.log_every_steps == 0:
            record = self.record(lr, {"step_time_s": step_time, "data_time_s": data_time, "comm_wait_s": comm_wait,
                                      "comm_busy_s": comm_busy})
        # collective, every few steps (the same on all ranks, at least every STOP_CHECK_EVERY_STEPS):
        # all_reduce of (losses of the logged steps since the last one, stop flag), awaited at the next
        if self.steplog.end_step(self.step, record, loss_sum, self.preempt.requested):
            self.stop_reason = "preempted"  # some rank was signalled; all ranks see it at this step

    def record(self, lr: float, timings: dict[str, float]) -> dict[str, Any]:
        """A logged step's metrics record; the StepLogger fills in the loss (this rank's and the
        mean over ranks) when it has reduced it, so a logged step costs no host sync on GPU."""
        samples = self.cfg.train.micro_batch_size * self.accum
        return {
            "rank": self.env.rank, "step": self.step, "epoch": self.epoch, "time": time.time(),
            "loss": None, "lr": lr, **timings, "samples_per_s": samples / timings["step_time_s"],
            "mem_mb": self._memory_mb(), "attempt": self.monitor.attempt,
        }

    def end_epoch(self) -> None:
        self.monitor.event(events.EPOCH_END, epoch=self.epoch)
        self.epoch += 1
        self.micro_in_epoch = 0

    # --- evaluation and early stopping -----------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        """Validation loss and metrics over the whole validation set, reduced as sums and counts."""
        if self.val_loader is None:
            return {}
        module = self.strategy.module  # ddp: not the wrapper, shards may differ in batch count
        module.eval()
        names = ["val_loss", *(f"val_{k}" for k in self.task.metrics)]
        sums = torch.zeros(len(names) + 1, dtype=torch.float64, device=self.device)
        with torch.no_grad(), self.autocast():
            for raw, counted in self._eval_batches():
                batch = to_device(raw, self.device)
                loss, out, n = forward_loss(module, batch, self.task.loss_fn)
                if not counted:
                    continue
                truth = batch if isinstance(batch, dict) else batch[1]
                values = [loss, *(fn(out, truth) for fn in self.task.metrics.values())]
                batch_means = [torch.as_tensor(v, dtype=torch.float64, device=self.device) for v in values]
                sums[:-1] += torch.stack(batch_means) * n
                sums[-1] += n
        module.train()
        dist.all_reduce(sums)  # sums and counts: exact for uneven shards
        result = {name: (sums[i] / sums[-1]).item() for i, name in enumerate(names)}
        self.last_eval = result
        self.monitor.event(events.EVAL, epoch=self.epoch, **result)
        return result

    def _eval_batches(self) -> Iterator[tuple[Any, bool]]:
        """(batch, counted) over this rank's validation shard.  Under fsdp2 every forward pass
        all-gathers parameters, so every rank must make as many as the others: a rank with a shorter
        shard repeats a batch, not counted, until all have made the most any rank makes."""
        assert self.val_loader is not None
        if not self.strategy.sharded:
            yield from ((batch, True) for batch in self.val_loader)
            return
        most = torch.tensor([len(self.val_loader)], device=self.device)
        dist.all_reduce(most, op=dist.ReduceOp.MAX)  # collective: the longest shard's batch count
        last = None
        for last in self.val_loader:
            yield last, True
        if last is None:  # an empty shard: any batch of the right shape will do
            last = next(iter(torch.utils.data.DataLoader(self.task.val_dataset, batch_size=1)))
        for _ in range(int(most.item()) - len(self.val_loader)):
            yield last, False

    def early_stop(self) -> None:
        """Every rank judges the (all-reduced, so identical) eval result; rank 0's verdict is then
        broadcast, so that all ranks stop at the same step even if their arithmetic differed."""
        es = self.cfg.train.early_stopping
        if es.patience is None or not self.last_eval:
            return
        decision = torch.tensor([float(self._no_improvement(self.last_eval.get(es.metric)))], device=self.device)
        dist.broadcast(decision, src=0)
        if decision.item():
            self.stop_reason = "early_stop"
            self.monitor.event(events.EARLY_STOP, metric=es.metric, best=self.best, patience=es.patience)

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
        return es.patience is not None and self.bad_evals >= es.patience

    # --- checkpoints -----------------------------------------------------------------------------
    saved_step = -1

    def save(self) -> None:
        rng = gather_rng_states(self.env.world_size)  # every rank's RNG, so a resume is exact
        self.checkpoints.write(self.step, self.epoch, lambda: self._state(rng))
        self.saved_step = self.step

    def _state(self, rng_states: list[Any]) -> dict[str, Any]:
        model, optimizer = self.strategy.state_dicts(self.optimizer)  # fsdp2: this rank's shards
        return {
            "model": model, "optimizer": optimizer,
            "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict(),
            "step": self.step, "epoch": self.epoch, "micro_in_epoch": self.micro_in_epoch,
            "samples_in_epoch": self.samples_in_epoch(), "best": self.best, "bad_evals": self.bad_evals,
            "last_eval": self.last_eval,
            "rng": rng_states, "world_size": self.env.world_size, "strategy": self.strategy.name,
            "config": self.cfg.to_dict(),
        }

    def samples_in_epoch(self) -> int:
        """Samples of this epoch trained on so far, over all ranks: where a resumed run starts."""
        return self.micro_in_epoch * self.cfg.train.micro_batch_size * self.env.world_size

    def resume(self) -> bool:
        """Load the run's latest checkpoint, if any; returns whether one was loaded.  Either kind
        (ddp's step-N.pt, fsdp2's step-N/) loads under either strategy at any world size."""
        found = load_latest(self.run, lambda path, exc: self.monitor.run_event(
            events.CHECKPOINT_SKIPPED, path=str(path), reason=f"{type(exc).__name__}: {str(exc)[:300]}"),
            shards=self._shards_to_fill)  # collective for a sharded checkpoint: DCP reads it together
        if found is None:
            return False
        path, state = found
        restore_weights(self.strategy, self.optimizer, state)
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.step, self.epoch = state["step"], state["epoch"]
        self.best, self.bad_evals, self.saved_step = state["best"], state["bad_evals"], state["step"]
        self.last_eval = dict(state.get("last_eval") or {})  # the summary's, until this segment evaluates
        self.monitor.step = self.step
        old_world = state["world_size"]
        self.micro_in_epoch = self._micro_after(state, old_world)
        if old_world == self.env.world_size:
            set_rng_state(state["rng"][self.env.rank])
        elif self.resized:
            self.monitor.event(events.RESCALE, message=self.resized)
        self._schedule_from_config()
        self.monitor.event(events.RESUME, path=str(path), epoch=self.epoch, from_world_size=old_world,
                           from_strategy=state.get("strategy", "ddp"))
        return True

    def _shards_to_fill(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model, optimizer = get_state_dict(self.model, self.optimizer)  # this rank's part, in its layout
        return {"model": model, "optimizer": optimizer}

    def _micro_after(self, state: dict[str, Any], old_world: int) -> int:
        """This rank's micro-batches into the epoch at the new world size, from the global sample
        count (a checkpoint without one: its own rank's count at its world size), rounded down to
        a whole step: at most one step's samples are seen again when the effective batch changed."""
        old_micro = state["config"]["train"]["micro_batch_size"]
        samples = state.get("samples_in_epoch", state["micro_in_epoch"] * old_micro * old_world)
        step_samples = effective_batch(self.cfg.train.micro_batch_size, self.accum, self.env.world_size)
        return samples // step_samples * self.accum

    def _schedule_from_config(self) -> None:
        """The lr schedule of this config from the resumed step on: its peak lr (rescaled at another
        world size) and its length and warmup (max_steps raised, say).  The checkpoint's optimizer
        holds the lr the old schedule gave the next step (0 at the end of a decay that is now
        longer), so the next step's lr is computed again; a resume with the same config gets the
        same value, bit for bit.  The epoch goes on from its global sample position."""
        scheduler = self.scheduler
        scheduler.base_lrs = [self.scale.lr for _ in self.optimizer.param_groups]
        for group, base, factor in zip(self.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
            group["initial_lr"] = base
            group["lr"] = base * factor(scheduler.last_epoch)

    # --- reporting -------------------------------------------------------------------------------
    def _start_event(self) -> None:
        s = self.scale
        gpu = {"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
               "gpu_name": torch.cuda.get_device_name(self.device)} if self.device.startswith("cuda") else {}
        self.monitor.event(events.START, world_size=self.env.world_size, device=self.device,
                           backend=dist.get_backend(), strategy=self.strategy.name, fsdp_units=self.strategy.units,
                           effective_batch=s.effective_batch, lr=s.lr,
                           warmup_steps=s.warmup_steps, steps_per_epoch=self.steps_per_epoch,
                           total_steps=self.total_steps, samples_per_rank=resumable_sampler(self.loader).num_samples,
                           **gpu)

    def summary(self) -> dict[str, Any]:
        return {"rank": self.env.rank, "steps": self.step, "epochs": self.epoch, "stop_reason": self.stop_reason,
                "last_eval": self.last_eval, "best": self.best, "total_steps": self.total_steps}

    def _memory_mb(self) -> float:
        if self.device.startswith("cuda"):
            return torch.cuda.max_memory_allocated(self.device) / 2**20
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # peak RSS (KiB on Linux)


def restore_weights(strategy: Any, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Model and optimizer state from a checkpoint of either kind into either strategy."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    if not strategy.sharded and "param_groups" in state["optimizer"] and _by_index(state["optimizer"]):
        strategy.module.load_state_dict(state["model"])  # ddp's own checkpoint, as it wrote it
        optimizer.load_state_dict(state["optimizer"])
        return
    model_state, optim_state = state["model"], state["optimizer"]
    whole = not any(_is_dtensor(v) for v in model_state.values())
    if _by_index(optim_state):  # torch's optimizer.state_dict() keys parameters by position: name them
        optim_state = _optimizer_by_name(optim_state, [n for n, p in strategy.module.named_parameters()
                                                       if p.requires_grad])
    set_state_dict(strategy.model, optimizer, model_state_dict=model_state, optim_state_dict=optim_state,
                   options=StateDictOptions(full_state_dict=whole and strategy.sharded))


def _by_index(optim_state: dict[str, Any]) -> bool:
    groups = optim_state.get("param_groups", [])
    return bool(groups) and all(isinstance(i, int) for g in groups for i in g["params"])


def _is_dtensor(value: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(value, DTensor)


def _optimizer_by_name(optim_state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """torch's optimizer state (parameters by position, in the order build_optimizer gave them) keyed
    by parameter name, the form set_state_dict reads."""
    state = {names[i]: v for i, v in optim_state["state"].items()}
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in optim_state["param_groups"]]
    return {"state": state, "param_groups": groups}


def _due(step: int, every: int | None) -> bool:
    """Whether an every-N-steps action is due at `step` (never when N is empty)."""
    return every is not None and step % every == 0
