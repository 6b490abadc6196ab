import torch

# Tiny models run several times faster on one thread than on two contended ones.
torch.set_num_threads(1)
