"""A torchrun-style script whose main is wrapped in torch's @record: it prints the torchelastic
variables it was given, then rank 1 raises and leaves without a word of its own (os._exit), so only
@record's error file says what happened.  Rank 1 raises once rank 0 has printed (marks beside this
file), so rank 0's line is not lost with it.  Tests copy it into their own folder first."""

import json
import os
import time

from torch.distributed.elastic.multiprocessing.errors import record

HERE = os.path.dirname(os.path.abspath(__file__))


@record
def main():
    names = ("TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_SIGNALS_TO_HANDLE", "TORCH_NCCL_ASYNC_ERROR_HANDLING")
    print(json.dumps({name: os.environ.get(name) for name in names}))
    printed = os.path.join(HERE, "printed-" + os.environ["RANK"])
    open(printed, "w").close()
    if os.environ["RANK"] == "1":
        while not os.path.exists(printed[:-1] + "0"):  # rank 0 has printed: its line is not lost with it
            time.sleep(0.01)
        raise KeyError("from a recorded main")


try:
    main()
except KeyError:
    os._exit(3)  # gone without a word of its own: only @record's error file says what happened
