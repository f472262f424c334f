import torch

# The tiny models in these tests run faster on one thread, and CI machines have two cores.
torch.set_num_threads(1)
