import torch

# Tests run many small tensor ops: one intra-op thread is much faster and steadier on a 2-core machine.
torch.set_num_threads(1)
