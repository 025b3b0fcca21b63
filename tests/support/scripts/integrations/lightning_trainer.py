"""A plain Lightning Trainer script (DDP on CPU); one line added: logger=WorkbenchLogger()."""
import sys

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from workbench.integrations.lightning import WorkbenchLogger


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)  # this rank's own value (no sync_dist)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


torch.manual_seed(0)
x = torch.randn(512, 8)
data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=16)
trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=12, logger=WorkbenchLogger(),
                    log_every_n_steps=1, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, default_root_dir=sys.argv[1])
trainer.fit(Regressor(), data)
