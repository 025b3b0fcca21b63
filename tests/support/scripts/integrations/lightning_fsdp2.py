"""A Lightning Trainer with FSDP2 (ModelParallelStrategy: the LightningModule calls fully_shard itself
in configure_model) on CPU; one line added: logger=WorkbenchLogger().  Each rank writes what it holds
to OUT/rank{R}.json; the checkpoint is saved distributed, a shard per rank."""
import json
import sys
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, TensorDataset

from workbench.integrations.lightning import WorkbenchLogger


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16),
                                       torch.nn.Tanh(), torch.nn.Linear(16, 2))

    def configure_model(self):
        mesh = self.device_mesh["data_parallel"]
        for layer in self.net:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(self.net, mesh=mesh)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)  # this rank's own value (no sync_dist)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


out = Path(sys.argv[1])
torch.manual_seed(0)
x = torch.randn(512, 8)
data = DataLoader(TensorDataset(x, torch.stack([x.sum(1), x[:, 0]], 1)), batch_size=16)
fsdp2 = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)  # "auto" would give 2-way tensor parallel
trainer = L.Trainer(accelerator="cpu", devices=2, strategy=fsdp2,
                    max_steps=12, logger=WorkbenchLogger(), log_every_n_steps=1, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, default_root_dir=out)
model = Regressor()
trainer.fit(model, data)
trainer.save_checkpoint(out / "last.ckpt")
held = {name: [type(p).__name__, p.numel(), p.to_local().numel()] for name, p in model.named_parameters()}
(out / f"rank{trainer.global_rank}.json").write_text(json.dumps(held))
