import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests import the tiny-model helpers in tiny.py

# Tiny models run fastest on one thread, and a busy 2-core machine makes multi-threaded kernels crawl.
torch.set_num_threads(1)

# Models, int8 caches, measured cost curves and auto's kept estimates go to a cache of the tests' own, made anew for
# each run (subprocesses inherit it): never the user's ~/.cache/paradecode, whose contents would both change what
# the tests see and be changed by them. The real model is converted and quantized once per run there.
os.environ["PARADECODE_CACHE"] = tempfile.mkdtemp(prefix="paradecode-test-cache-")
atexit.register(shutil.rmtree, os.environ["PARADECODE_CACHE"], ignore_errors=True)
