"""A Hugging Face Trainer job (a model that returns its loss, dict batches); one line added:
callbacks=[WorkbenchCallback()]."""
import sys

import torch
from transformers import Trainer, TrainingArguments

from workbench.integrations.transformers import WorkbenchCallback


class Regressor(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 1)

    def forward(self, inputs, labels=None):
        out = self.net(inputs)
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}


class Pairs(torch.utils.data.Dataset):
    def __init__(self):
        self.x = torch.randn(512, 8, generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"inputs": self.x[i], "labels": self.x[i].sum(0, keepdim=True)}


args = TrainingArguments(output_dir=sys.argv[1], max_steps=12, per_device_train_batch_size=16, logging_steps=1,
                         learning_rate=0.05, report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True)
Trainer(model=Regressor(), args=args, train_dataset=Pairs(), callbacks=[WorkbenchCallback()]).train()
