"""A wider Task: models that compute their own loss (nanoGPT's GPT(idx, targets)) and dict batches
(Hugging Face's model(**batch) with labels) train in the engine unchanged, and train exactly like
the same model with a separate loss_fn.  Real 2-rank gloo runs; unit checks of the loss rules."""
from __future__ import annotations

import pytest
import torch

from tests.support.tasks_for_tests import Output
from workbench.engine.tasks import model_loss

pytestmark = pytest.mark.timeout(180)






# --- the loss rules (no processes) ---------------------------------------------------------------
def test_the_loss_is_found_in_every_shape_models_return():
    loss = torch.tensor(0.5)
    logits = torch.zeros(2, 3)
    assert model_loss(loss) is loss
    assert model_loss((logits, loss)) is loss
    assert model_loss({"logits": logits, "loss": loss}) is loss
    assert model_loss(Output(loss, logits)) is loss



def test_an_output_without_a_loss_says_how_to_fix_it():
    with pytest.raises(TypeError, match="return a scalar loss, \\(logits, loss\\), a dict with 'loss'.*loss_fn"):
        model_loss(torch.zeros(2, 3))
    with pytest.raises(TypeError, match="holds no loss"):
        model_loss((torch.zeros(2, 3), torch.zeros(2)))



@pytest.mark.parametrize("d_model", [32, 768])
def test_the_builtin_charlm_starts_near_log_vocab_at_any_width(d_model):
    """Its head is tied to the embedding: an N(0, 1) embedding made the first loss grow with the width (191 at
    GPT-2 small's 768, and bf16 training on a GPU diverged from there)."""
    import math

    from workbench.engine.builtin_tasks import char_lm, lm_loss

    torch.manual_seed(0)
    task = char_lm(block_size=16, d_model=d_model, n_head=4, n_layer=1)
    x, y = next(iter(torch.utils.data.DataLoader(task.train_dataset, batch_size=8)))
    vocab = task.model.tok.num_embeddings
    assert abs(lm_loss(task.model(x), y).item() - math.log(vocab)) < 1.0
