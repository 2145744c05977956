import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests import the tiny-model helpers in tiny.py

# Tiny models run fastest on one thread, and a busy 2-core machine makes multi-threaded kernels crawl.
torch.set_num_threads(1)
