"""Ready-made single-node configs for 1, 2, 4 and 8 GPUs.

They follow the "Recommended Configurations" of a common DDP scaling guide: per-GPU batch 16 with
4 accumulation steps, lr 5e-5 and 5000 warmup steps tuned at 1 GPU and scaled linearly; at 8 GPUs
the per-GPU batch drops to 12 and the scaling is capped at x6 (lr 3e-4, warmup 30000, effective
batch 384).  The stored lr and warmup are the 1-GPU values; the scaling rule derives the rest.
"""

from __future__ import annotations

from workbench.config.sections import JobConfig

PRESETS = (1, 2, 4, 8)
"""GPU counts with a preset."""


def preset(gpus: int, base: JobConfig | None = None) -> JobConfig:
    """The preset for `gpus` GPUs on one node, applied on top of `base` (default: JobConfig())."""
    if isinstance(gpus, bool) or gpus not in PRESETS:
        raise ValueError(f"no preset for {gpus!r} GPUs; choose one of {', '.join(map(str, PRESETS))}")
    capped = gpus == 8
    extra = {"scaling__cap": 6.0} if capped else {}
    return (base or JobConfig()).replace(
        train__micro_batch_size=12 if capped else 16,
        train__grad_accum_steps=4,
        train__lr=5e-5,
        train__lr_ref_world_size=1,
        train__warmup_steps=5000,
        train__precision="bf16",
        scaling__rule="capped" if capped else "linear",
        scaling__scale_warmup=True,
        dist__nodes=1,
        dist__procs_per_node=gpus,
        dist__backend="nccl",
        dist__find_unused_parameters=False,
        dist__gradient_as_bucket_view=True,
        data__num_workers=4,
        **extra,
    )
