"""pytest setup for every test file: one CPU thread per process. The tests use tiny models, where a
second thread buys nothing, while two processes that each spin two OpenMP threads on two cores (a
test and the train.py it starts, or a neighbouring job) slow each other down many times over."""
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # inherited by the scripts the tests start

import torch  # noqa: E402

torch.set_num_threads(1)
