"""PixelCNN with masked convolutions: an autoregressive density model of 8x8 digit images, one softmax over the
intensity levels per pixel (jzbontar/pixelcnn-pytorch `main.py`).

Written after jzbontar/pixelcnn-pytorch `main.py` (read through the `search` tool, code corpus: the file and the
many projects that copy its `MaskedConv2d`): a `MaskedConv2d(nn.Conv2d)` with a registered mask buffer that zeroes
the kernel right of the centre on the centre row and every row below ('A' also zeroes the centre, for the first
layer; 'B' keeps it), re-applied in `forward` with `self.weight.data *= self.mask`; the net is one 'A' layer and
'B' layers, each 7x7 -> BatchNorm2d -> ReLU, then a 1x1 Conv2d to one logit per intensity level; the target is
the image's own intensity levels (`(input.data[:, 0] * 255).long()` there), the loss `F.cross_entropy(net(input),
target)`, Adam with its default lr, and the state dict is saved after every epoch. Here the images are
scikit-learn's 8x8 digits, whose pixels take the 17 levels 0..16: input `x / 16`, target the level, 17 logits
per pixel, 4 masked layers of 32 feature maps (the original: 8 of 64 on 28x28 MNIST, 256 levels), batches of 64,
the first 1300 images for training and the other 497 for validation. A batch is a tuple `(images (B, 1, 8, 8),
levels (B, 8, 8))`. The checkpoint is `net.state_dict()` after each epoch, `pixelcnn_epoch{E}.pt`.

Runs
- healthy (an unusual one: a density model whose loss floor is far from 0): the per-pixel cross-entropy falls
  from ~2.65 (log 17 = 2.83) to ~1.3 nats and flattens there (the digits' own entropy under this small net;
  validation follows at ~1.35); the checkpoint is the epoch-4 state dict of 12 (validation ~1.6), still improving.
- nll_on_raw_logits: the owner replaced `F.cross_entropy` by `F.nll_loss` "because PixelCNN reports an NLL" and
  kept the 1x1 conv's raw logits as its input. `nll_loss` expects log-probabilities; on raw logits it is
  -logit[target], which the net lowers without bound by inflating every logit: the training "loss" goes
  negative and keeps falling (about -7 after 12 epochs; BatchNorm keeps the features bounded, the 1x1 conv grows),
  while the honest per-pixel cross-entropy of the same outputs stays at ~2.1 (healthy: ~1.35). `nll_loss` without `log_softmax` is a recurring forum question ("negative loss with
  NLLLoss", PyTorch forums; the docs say the input is expected to contain log-probabilities). Root cause
  `wrong_loss`: the loss the outputs call for (`F.cross_entropy` on the logits, `cross_entropy`) trains to
  ~1.35. Competing fix a user tries first: lr x0.1 (`lr_1e-4`), which leaves the loss negative (about -1) and the
  honest cross-entropy at ~2.3.
- mask_on_weight_data: the owner rewrote `MaskedConv2d.forward` "without the in-place edit of the weight" as
  `F.conv2d(x, self.weight.data * self.mask, ...)`, keeping the `.data` of the original's
  `self.weight.data *= self.mask`. `.data` is outside autograd: the masked 7x7 kernels get no gradient and stay
  at their random init; only BatchNorm's affine parameters and the 1x1 output conv train on random masked
  features. The loss falls slowly and flattens at ~1.9 nats (healthy ~1.35). `.data` silently cutting the graph
  is what the PyTorch docs and forum threads warn about (".data ... changes are not tracked by autograd"). Root
  cause `no_gradient_flow`: building the masked kernel from the parameter itself (`mask_with_grad`) trains.
  Competing fix a user tries first: a 10x larger lr (`lr_1e-2`), which leaves it at ~1.7.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

try:
    from _program import Program, Run, Trained
except ImportError:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _program import Program, Run, Trained

PROGRAM = Program(
    name="pixelcnn_masked_conv",
    kind="autoregressive image model (PixelCNN)",
    original="jzbontar/pixelcnn-pytorch: main.py (MaskedConv2d 'A'/'B', BatchNorm, per-pixel softmax, Adam)",
    runs={
        "healthy": Run(cause="healthy", story="PixelCNN on 8x8 digits; per-pixel cross-entropy falls from log 17 to "
                       "~1.0 nats and flattens at the data's entropy; checkpoint at epoch 4 of 12."),
        "nll_on_raw_logits": Run(
            cause="wrong_loss",
            story="I switched to F.nll_loss to report the NLL; the loss went negative and keeps falling, and "
                  "samples are garbage. A 10x smaller lr only slowed the fall.",
            fix="cross_entropy", competing=("lr_1e-4",)),
        "mask_on_weight_data": Run(
            cause="no_gradient_flow",
            story="After I rewrote the masked conv to use F.conv2d on the masked weight, the NLL flattens at 1.9 "
                  "nats where it used to reach 1.35. A larger lr did not help.",
            fix="mask_with_grad", competing=("lr_1e-2",)),
    },
)

LEVELS, FM, N_LAYERS, BS, EPOCHS = 17, 32, 4, 64, 12


class MaskedConv2d(nn.Conv2d):
    def __init__(self, mask_type, *args, **kwargs):
        super().__init__(*args, **kwargs)
        assert mask_type in {"A", "B"}
        self.register_buffer("mask", self.weight.data.clone())
        _, _, kh, kw = self.weight.size()
        self.mask.fill_(1)
        self.mask[:, :, kh // 2, kw // 2 + (mask_type == "B"):] = 0
        self.mask[:, :, kh // 2 + 1:] = 0

    def forward(self, x):
        self.weight.data *= self.mask
        return super().forward(x)


class MaskedConv2dFunctional(MaskedConv2d):
    """The owner's rewrite "without the in-place edit of the weight": the masked kernel built from `.data`."""

    def forward(self, x):
        return F.conv2d(x, self.weight.data * self.mask, self.bias, self.stride, self.padding)


def make_net(conv=MaskedConv2d):
    layers = [conv("A", 1, FM, 7, 1, 3, bias=False), nn.BatchNorm2d(FM), nn.ReLU(True)]
    for _ in range(N_LAYERS - 1):
        layers += [conv("B", FM, FM, 7, 1, 3, bias=False), nn.BatchNorm2d(FM), nn.ReLU(True)]
    layers.append(nn.Conv2d(FM, LEVELS, 1))
    return nn.Sequential(*layers)


def make_data(seed):
    from sklearn.datasets import load_digits

    levels = torch.tensor(load_digits().data, dtype=torch.long).reshape(-1, 8, 8)
    perm = torch.randperm(len(levels), generator=torch.Generator().manual_seed(200 + seed))
    tr, va = levels[perm[:1300]], levels[perm[1300:]]

    def batches(lv, bs):
        return [(lv[i:i + bs].unsqueeze(1).float() / 16.0, lv[i:i + bs]) for i in range(0, len(lv), bs)]

    return tr, batches(va, 128)


def ce_loss(net, batch):
    x, target = batch
    return F.cross_entropy(net(x), target)


def nll_raw_loss(net, batch):
    x, target = batch
    return F.nll_loss(net(x), target)


def config(run, variant):
    lr = 1e-4 if variant == "lr_1e-4" else 1e-3
    if variant == "lr_1e-2":
        lr = 1e-2
    loss = nll_raw_loss if run == "nll_on_raw_logits" and variant != "cross_entropy" else ce_loss
    conv = MaskedConv2dFunctional if run == "mask_on_weight_data" and variant != "mask_with_grad" else MaskedConv2d
    return lr, loss, conv


def build(run, variant, seed=0):
    lr, loss, conv = config(run, variant)
    torch.manual_seed(seed)
    net = make_net(conv)
    return net, torch.optim.Adam(net.parameters(), lr=lr), loss


@torch.no_grad()
def honest_ce(net, batches):
    net.eval()
    out = float(np.mean([ce_loss(net, b).item() for b in batches]))
    net.train()
    return out


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    tr, val = make_data(seed)
    net, opt, loss_fn = build(run, variant, seed)
    g = torch.Generator().manual_seed(seed)
    ckpt_epoch = 4 if run == "healthy" else EPOCHS
    ckpt = None
    losses, vals, train_ce = [], [], []
    for epoch in range(1, EPOCHS + 1):
        net.train()
        perm = torch.randperm(len(tr), generator=g)
        for i in range(0, len(tr) - BS + 1, BS):
            lv = tr[perm[i:i + BS]]
            batch = (lv.unsqueeze(1).float() / 16.0, lv)
            loss = loss_fn(net, batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        vals.append(honest_ce(net, val))
        train_ce.append(honest_ce(net, [(tr[:256].unsqueeze(1).float() / 16.0, tr[:256])]))
        if epoch == ckpt_epoch:
            ckpt = Path(out_dir) / f"pixelcnn_epoch{epoch}.pt"
            torch.save(net.state_dict(), ckpt)
    return Trained(checkpoint=ckpt, train_losses=losses, val_losses=vals,
                   metrics={"first": float(np.mean(losses[:5])), "last": float(np.mean(losses[-20:])),
                            "val_ce": float(np.mean(vals[-2:])), "train_ce": train_ce[-1]})


def symptom(run: str, trained: Trained) -> str | None:
    m = trained.metrics
    if m["last"] < 0 or m["val_ce"] > 1.55:
        return (f"training loss {m['first']:.2f} -> {m['last']:.2f} over {EPOCHS} epochs; the per-pixel "
                f"cross-entropy of the same outputs is {m['train_ce']:.2f} on training images and {m['val_ce']:.2f} "
                f"on validation (log 17 = 2.83; a healthy run reaches ~1.35)")
    return None


def _setup(run):
    import triage

    tr, val = make_data(0)
    net, opt, loss_fn = build(run, None, 0)
    g = torch.Generator().manual_seed(0)
    batches = []
    while len(batches) < 40:
        perm = torch.randperm(len(tr), generator=g)
        for i in range(0, len(tr) - BS + 1, BS):
            lv = tr[perm[i:i + BS]]
            batches.append((lv.unsqueeze(1).float() / 16.0, lv))
    return triage.Setup(model=net, optimizer=opt, loss_fn=loss_fn, batches=batches, val_batches=val)


def setup_healthy():
    return _setup("healthy")


def setup_nll_on_raw_logits():
    return _setup("nll_on_raw_logits")


def setup_mask_on_weight_data():
    return _setup("mask_on_weight_data")
