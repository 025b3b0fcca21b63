"""A Lightning Fabric loop; one line added: loggers=[WorkbenchLogger()]."""
import lightning as L
import torch

from workbench.integrations.lightning import WorkbenchLogger

fabric = L.Fabric(accelerator="cpu", devices=2, strategy="ddp", loggers=[WorkbenchLogger()])
fabric.launch()
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
model, optimizer = fabric.setup(model, optimizer)
gen = torch.Generator().manual_seed(fabric.global_rank)
for step in range(1, 13):
    x = torch.randn(16, 8, generator=gen)
    loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    optimizer.zero_grad()
    fabric.backward(loss)
    optimizer.step()
    fabric.log_dict({"loss": loss.item()}, step=step)
