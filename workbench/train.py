"""``python -m workbench.train``: the engine under plain torchrun (the code is workbench.engine.torchrun).

    torchrun --nproc_per_node=2 -m workbench.train CONFIG.yaml [--run-dir DIR] [--set train.lr=1e-3 ...]
"""

import sys

from workbench.engine.torchrun import main

if __name__ == "__main__":
    sys.exit(main())
