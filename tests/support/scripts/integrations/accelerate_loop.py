"""An Accelerate loop; one line added: log_with=WorkbenchTracker()."""
import torch
from accelerate import Accelerator

from workbench.integrations.accelerate import WorkbenchTracker

accelerator = Accelerator(cpu=True, log_with=WorkbenchTracker())
accelerator.init_trackers("integration-test")
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
model, optimizer = accelerator.prepare(model, optimizer)
gen = torch.Generator().manual_seed(accelerator.process_index)
for step in range(1, 13):
    x = torch.randn(16, 8, generator=gen)
    loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    optimizer.zero_grad()
    accelerator.backward(loss)
    optimizer.step()
    accelerator.log({"loss": loss.item(), "note": "text is left out"}, step=step)
    accelerator.log({"lr": optimizer.param_groups[0]["lr"]}, step=step)  # a second call at the same step
accelerator.end_training()
