"""A plain Lightning Trainer script (DDP on CPU) whose rank 1 hangs in training_step at step 6.

    lightning_hang.py OUT   rank 1 writes the time into OUT/hung_at (bench/failure_latency.py's hang column reads
                            it), then never returns from training_step 6; rank 0 waits for its gradients in
                            DDP's all-reduce
"""
import os
import sys
import time

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from workbench.integrations.lightning import WorkbenchLogger


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        if batch_idx == 6 and self.global_rank == 1:
            os.makedirs(sys.argv[1], exist_ok=True)
            with open(os.path.join(sys.argv[1], "hung_at"), "w") as fh:
                fh.write(repr(time.time()))
            while True:  # a bug that never returns: the other rank waits for its gradients
                time.sleep(0.05)
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


torch.manual_seed(0)
x = torch.randn(512, 8)
data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=16)
trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=1000, logger=WorkbenchLogger(),
                    log_every_n_steps=1, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, default_root_dir=sys.argv[1])
trainer.fit(Regressor(), data)
