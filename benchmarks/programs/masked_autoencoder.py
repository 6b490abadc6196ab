"""MAE pretraining of a tiny ViT on small images made in code.

Follows facebookresearch/mae: `main_pretrain.py` (AdamW with betas (0.9, 0.95) over two param groups, weight
decay 0.05 on the weight matrices and none on biases, norms, tokens -- timm's `param_groups_weight_decay` /
`add_weight_decay`; `lr = blr * eff_batch_size / 256`; the LR set by hand every iteration by
`util/lr_sched.adjust_learning_rate(optimizer, data_iter_step / len(data_loader) + epoch, args)`: linear
warmup over `warmup_epochs`, then half-cycle cosine to `min_lr`; a checkpoint `{'model', 'optimizer',
'epoch', 'scaler', 'args'}` written by `misc.save_model` at an epoch's end, resumed with `--resume`) and
`models_mae.py` (`patchify`, `random_masking` per sample by argsort of uniform noise and `ids_restore`, a cls
token, fixed 2-D sin-cos position embeddings held as parameters with `requires_grad=False`, a narrower
decoder with a mask token, and `forward_loss`: the MSE per patch, averaged over the masked patches only, with
`norm_pix_loss` normalising every target patch by its own mean and variance: `(target - mean) / (var +
1e-6) ** .5`). Read: models_mae.forward_loss / random_masking and main_pretrain's optimizer and loop (and
several reimplementations of the same loss found with the code search).

Images: 3x16x16 gratings and blobs with noise, normalised per channel as MAE's transform does; patch 4, so a
sequence of 16 patches of 48 values, 75% masked.

Runs:
- healthy: pretraining with norm_pix_loss on a mix of full frames and letterboxed frames (zero rows added after
  normalisation). The loss has a floor far above 0 (a masked patch's normalised pixels are partly
  unpredictable) and falls slowly; the checkpoint is the end of epoch 3 of 20
  (just past the warmup), while it still falls.
- norm_pix_no_eps: the owner rewrote `forward_loss` with `target = (target - mean) / var.sqrt()`, leaving out
  MAE's `+ 1e-6`. On the first shard (every patch textured) it trained fine for 5 epochs and saved its epoch
  checkpoint; the new shard it then resumed on holds letterboxed frames, whose padded patches are constant:
  var == 0, 0/0 = NaN in the target, and `(loss * mask).sum()` is NaN (NaN * 0 is NaN) at the first iteration
  after the resume, at a LR that had been fine. The MAE-NaN reports (open-mmlab/mmpretrain#1632 "The MAE
  training loss becomes nan after one iteration"; the eps that every copy of forward_loss keeps) are this
  kind of failure. Root cause `numerical_instability`: a division whose denominator reaches 0 in fp32, at a
  sane LR; the fix is the eps (variant `eps`). Lowering the LR (`lr_low`, blr x0.1) or clipping at 1.0
  (`clip`) leave the NaN: the NaN is in the target, not in the weights' trajectory.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _program import Program, Run, Trained  # noqa: E402

PROGRAM = Program(
    name="masked_autoencoder",
    kind="self-supervised masked image modeling",
    original="facebookresearch/mae: main_pretrain.py, models_mae.py, util/lr_sched.py",
    runs={
        "healthy": Run(cause="healthy", story=(
            "Tiny MAE pretraining with norm_pix_loss on full and letterboxed frames; the masked-patch loss "
            "falls from ~1.3 towards a floor near 0.7; checkpoint at the end of epoch 3 of 20.")),
        "norm_pix_no_eps": Run(
            cause="numerical_instability",
            story=("I rewrote MAE's forward_loss with target = (target - mean) / var.sqrt() (no eps). Five epochs "
                   "on the first shard were fine; after resuming from the epoch-5 checkpoint on the new shard, "
                   "which has letterboxed frames, the loss is NaN at the very first iteration."),
            fix="eps", competing=("lr_low", "clip")),
    },
)

IMG, PATCH, CH = 16, 4, 3
MASK_RATIO = 0.75
BATCH = 64
N_IMAGES = 768                  # 12 iterations an epoch
STEPS_PER_EPOCH = N_IMAGES // BATCH
EPOCHS = 20
WARMUP_EPOCHS = 2
BLR = 5e-3                      # base LR for the tiny model; lr = blr * eff_batch_size / 256
MIN_LR = 0.0
NOISE = 0.01
WEIGHT_DECAY = 0.05
RESUME_EPOCH = 5                # the fault: the epoch checkpoint it resumed from (5 epochs done)
HEALTHY_CKPT_EPOCH = 3          # healthy: the epoch checkpoint after 3 epochs, while the loss still falls
MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


# ----------------------------------------------------------------------------------------------------- data
def make_images(n: int, seed: int, letterbox_frac: float) -> torch.Tensor:
    """Normalised 3x16x16 images: oriented gratings plus a blob plus noise; some letterboxed after Normalize."""
    g = torch.Generator().manual_seed(seed)
    yy, xx = torch.meshgrid(torch.arange(IMG).float(), torch.arange(IMG).float(), indexing="ij")
    theta = torch.rand(n, 1, 1, generator=g) * math.pi
    freq = 0.3 + 0.5 * torch.rand(n, 1, 1, generator=g)
    phase = torch.rand(n, 1, 1, generator=g) * 2 * math.pi
    grating = torch.sin(freq * (xx * torch.cos(theta) + yy * torch.sin(theta)) + phase)
    cx, cy = (torch.rand(n, 1, 1, generator=g) * IMG for _ in range(2))
    blob = torch.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / 8.0)
    colour = torch.rand(n, 3, 1, 1, generator=g)
    img = 0.5 + 0.25 * grating.unsqueeze(1) * colour + 0.3 * blob.unsqueeze(1) * (1 - colour)
    img = (img + NOISE * torch.randn(n, 3, IMG, IMG, generator=g)).clamp(0, 1)
    img = (img - MEAN) / STD                                    # transforms.Normalize
    n_box = int(round(letterbox_frac * n))
    if n_box:
        # frames letterboxed to 16x8 by a pad applied after ToTensor+Normalize: the pad value is 0
        idx = torch.randperm(n, generator=g)[:n_box]
        img[idx, :, :4, :] = 0.0
        img[idx, :, -4:, :] = 0.0
    return img


def epoch_batches(images: torch.Tensor, epoch: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A shuffled DataLoader epoch of (samples, target) pairs, as ImageFolder gives them (targets unused)."""
    g = torch.Generator().manual_seed(seed * 1000 + epoch)
    perm = torch.randperm(len(images), generator=g)
    out = []
    for i in range(0, len(images) - BATCH + 1, BATCH):
        idx = perm[i:i + BATCH]
        out.append((images[idx], torch.zeros(BATCH, dtype=torch.long)))
    return out


def shard(seed: int, epoch: int) -> torch.Tensor:
    """The data of an epoch: the first shard (full frames) before the resume, the new shard after it."""
    if epoch < RESUME_EPOCH:
        return make_images(N_IMAGES, seed, letterbox_frac=0.0)
    return make_images(N_IMAGES, seed + 7919, letterbox_frac=0.3)


# ---------------------------------------------------------------------------------------------------- model
def sincos_pos_embed(dim: int, grid: int, cls_token: bool = True) -> torch.Tensor:
    gh, gw = np.meshgrid(np.arange(grid, dtype=np.float64), np.arange(grid, dtype=np.float64), indexing="xy")

    def one(d, pos):
        omega = 1.0 / 10000 ** (np.arange(d // 2, dtype=np.float64) / (d / 2.0))
        out = np.einsum("m,d->md", pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    emb = np.concatenate([one(dim // 2, gh), one(dim // 2, gw)], axis=1)
    if cls_token:
        emb = np.concatenate([np.zeros([1, dim]), emb], axis=0)
    return torch.from_numpy(emb).float().unsqueeze(0)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_ratio: float = 4.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, int(dim * mlp_ratio)), nn.GELU(), nn.Linear(int(dim * mlp_ratio), dim))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class MaskedAutoencoderViT(nn.Module):
    def __init__(self, embed_dim=64, depth=2, heads=4, dec_dim=32, dec_depth=1, dec_heads=4,
                 norm_pix_loss=True, pix_eps=1e-6):
        super().__init__()
        self.grid = IMG // PATCH
        n = self.grid ** 2
        self.patch_embed = nn.Conv2d(CH, embed_dim, kernel_size=PATCH, stride=PATCH)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, n + 1, embed_dim), requires_grad=False)
        self.blocks = nn.ModuleList([Block(embed_dim, heads) for _ in range(depth)])
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        self.decoder_embed = nn.Linear(embed_dim, dec_dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, dec_dim))
        self.decoder_pos_embed = nn.Parameter(torch.zeros(1, n + 1, dec_dim), requires_grad=False)
        self.decoder_blocks = nn.ModuleList([Block(dec_dim, dec_heads) for _ in range(dec_depth)])
        self.decoder_norm = nn.LayerNorm(dec_dim, eps=1e-6)
        self.decoder_pred = nn.Linear(dec_dim, PATCH * PATCH * CH)
        self.norm_pix_loss = norm_pix_loss
        self.pix_eps = pix_eps          # None: the owner's rewrite, var.sqrt() with no eps
        self.initialize_weights()

    def initialize_weights(self):
        self.pos_embed.data.copy_(sincos_pos_embed(self.pos_embed.shape[-1], self.grid))
        self.decoder_pos_embed.data.copy_(sincos_pos_embed(self.decoder_pos_embed.shape[-1], self.grid))
        w = self.patch_embed.weight.data
        nn.init.xavier_uniform_(w.view(w.shape[0], -1))
        nn.init.normal_(self.cls_token, std=0.02)
        nn.init.normal_(self.mask_token, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.constant_(m.bias, 0)
            elif isinstance(m, nn.LayerNorm):
                nn.init.constant_(m.bias, 0)
                nn.init.constant_(m.weight, 1.0)

    def patchify(self, imgs):
        p, h = PATCH, self.grid
        x = imgs.reshape(imgs.shape[0], CH, h, p, h, p)
        x = torch.einsum("nchpwq->nhwpqc", x)
        return x.reshape(imgs.shape[0], h * h, p * p * CH)

    def random_masking(self, x, mask_ratio):
        N, L, D = x.shape
        len_keep = int(L * (1 - mask_ratio))
        noise = torch.rand(N, L, device=x.device)
        ids_shuffle = torch.argsort(noise, dim=1)
        ids_restore = torch.argsort(ids_shuffle, dim=1)
        ids_keep = ids_shuffle[:, :len_keep]
        x_masked = torch.gather(x, 1, ids_keep.unsqueeze(-1).repeat(1, 1, D))
        mask = torch.ones(N, L, device=x.device)
        mask[:, :len_keep] = 0
        mask = torch.gather(mask, 1, ids_restore)
        return x_masked, mask, ids_restore

    def forward_encoder(self, x, mask_ratio):
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = x + self.pos_embed[:, 1:, :]
        x, mask, ids_restore = self.random_masking(x, mask_ratio)
        cls = (self.cls_token + self.pos_embed[:, :1, :]).expand(x.shape[0], -1, -1)
        x = torch.cat((cls, x), dim=1)
        for blk in self.blocks:
            x = blk(x)
        return self.norm(x), mask, ids_restore

    def forward_decoder(self, x, ids_restore):
        x = self.decoder_embed(x)
        mask_tokens = self.mask_token.repeat(x.shape[0], ids_restore.shape[1] + 1 - x.shape[1], 1)
        x_ = torch.cat([x[:, 1:, :], mask_tokens], dim=1)
        x_ = torch.gather(x_, 1, ids_restore.unsqueeze(-1).repeat(1, 1, x.shape[2]))
        x = torch.cat([x[:, :1, :], x_], dim=1) + self.decoder_pos_embed
        for blk in self.decoder_blocks:
            x = blk(x)
        return self.decoder_pred(self.decoder_norm(x))[:, 1:, :]

    def forward_loss(self, imgs, pred, mask):
        target = self.patchify(imgs)
        if self.norm_pix_loss:
            mean = target.mean(dim=-1, keepdim=True)
            var = target.var(dim=-1, keepdim=True)
            if self.pix_eps is None:
                target = (target - mean) / var.sqrt()
            else:
                target = (target - mean) / (var + self.pix_eps) ** .5
        loss = ((pred - target) ** 2).mean(dim=-1)
        return (loss * mask).sum() / mask.sum()

    def forward(self, imgs, mask_ratio=MASK_RATIO):
        latent, mask, ids_restore = self.forward_encoder(imgs, mask_ratio)
        pred = self.forward_decoder(latent, ids_restore)
        return self.forward_loss(imgs, pred, mask), pred, mask


# ------------------------------------------------------------------------------------------ optimizer, LR
def param_groups_weight_decay(model: nn.Module, weight_decay: float):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if p.ndim <= 1 or name.endswith(".bias") or name in ("cls_token", "mask_token"):
            no_decay.append(p)
        else:
            decay.append(p)
    return [{"params": no_decay, "weight_decay": 0.0}, {"params": decay, "weight_decay": weight_decay}]


def base_lr(variant: str | None) -> float:
    blr = BLR * (0.1 if variant == "lr_low" else 1.0)
    return blr * BATCH / 256


def adjust_learning_rate(optimizer, epoch: float, lr: float) -> float:
    """util/lr_sched.py: linear warmup, then half-cycle cosine, set by hand on every group each iteration."""
    if epoch < WARMUP_EPOCHS:
        cur = lr * epoch / WARMUP_EPOCHS
    else:
        cur = MIN_LR + (lr - MIN_LR) * 0.5 * (1.0 + math.cos(math.pi * (epoch - WARMUP_EPOCHS) / (EPOCHS - WARMUP_EPOCHS)))
    for group in optimizer.param_groups:
        group["lr"] = cur * group.get("lr_scale", 1.0)
    return cur


def build(run: str, variant: str | None = None):
    pix_eps = None if (run == "norm_pix_no_eps" and variant != "eps") else 1e-6
    model = MaskedAutoencoderViT(pix_eps=pix_eps)
    lr = base_lr(variant)
    opt = torch.optim.AdamW(param_groups_weight_decay(model, WEIGHT_DECAY), lr=lr, betas=(0.9, 0.95))
    return model, opt, lr


def _iteration(optimizer) -> int:
    """The run's global iteration: AdamW's own step count (the loop's epoch * len(loader) + data_iter_step)."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            st = optimizer.state.get(p)
            if st and "step" in st:
                return int(st["step"])
    return 0


def make_train_step(lr: float, grad_clip: float | None = None):
    def train_step(model, optimizer, batch):
        samples, _ = batch
        it = _iteration(optimizer)
        adjust_learning_rate(optimizer, it / STEPS_PER_EPOCH, lr)
        loss, _, _ = model(samples, mask_ratio=MASK_RATIO)
        optimizer.zero_grad()
        loss.backward()
        if grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        return loss
    return train_step


# ------------------------------------------------------------------------------------------------- train
def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    torch.manual_seed(seed)
    out_dir = Path(out_dir)
    model, opt, lr = build(run, variant)
    step_fn = make_train_step(lr, grad_clip=1.0 if variant == "clip" else None)
    last_epoch = 10 if run == "healthy" else RESUME_EPOCH + 3
    losses: list[float] = []
    ckpt = out_dir / "checkpoint.pth"
    for epoch in range(last_epoch):
        model.train()
        images = shard(seed, epoch) if run != "healthy" else make_images(N_IMAGES, seed + 7919, 0.3)
        stop = False
        for batch in epoch_batches(images, epoch, seed):
            loss = step_fn(model, opt, batch)
            losses.append(float(loss.item()))
            if not math.isfinite(losses[-1]):
                stop = True            # the owner stops the run at the NaN
                break
        if stop:
            break
        if epoch + 1 == (HEALTHY_CKPT_EPOCH if run == "healthy" else RESUME_EPOCH):  # misc.save_model
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch,
                        "scaler": {}, "args": {"blr": BLR, "batch_size": BATCH, "epochs": EPOCHS,
                                                "warmup_epochs": WARMUP_EPOCHS, "mask_ratio": MASK_RATIO,
                                                "norm_pix_loss": True}}, ckpt)
    return Trained(checkpoint=ckpt, train_losses=losses,
                   metrics={"resume_step": RESUME_EPOCH * STEPS_PER_EPOCH})


def symptom(run: str, trained: Trained) -> str | None:
    losses = trained.train_losses
    start = int(trained.metrics["resume_step"])
    bad = [i for i, v in enumerate(losses) if not math.isfinite(v)]
    if bad:
        return (f"loss went to NaN at iteration {bad[0] + 1} (the resume from the epoch checkpoint was at "
                f"iteration {start}); before it the loss was {losses[bad[0] - 1]:.3f}")
    first, last = np.mean(losses[:STEPS_PER_EPOCH]), np.mean(losses[-STEPS_PER_EPOCH:])
    if run == "healthy" and last > 0.85 * first:
        return f"masked-patch loss {first:.3f} -> {last:.3f} over {len(losses)} iterations: not learning"
    return None


# ------------------------------------------------------------------------------------------------- setups
def _setup(run: str):
    import triage

    model, opt, lr = build(run)
    seed = 0
    images = make_images(N_IMAGES, seed + 7919, 0.3)       # the data after the checkpoint (the new shard)
    first = HEALTHY_CKPT_EPOCH if run == "healthy" else RESUME_EPOCH
    batches = [b for e in range(first, first + 4) for b in epoch_batches(images, e, seed)]   # 48 batches
    return triage.Setup(
        model=model, optimizer=opt,
        loss_fn=lambda model, batch: model(batch[0], mask_ratio=MASK_RATIO)[0],
        batches=batches,
        train_step=make_train_step(lr),
        total_steps=EPOCHS * STEPS_PER_EPOCH,
        steps_per_epoch=STEPS_PER_EPOCH,
        frozen_by_design=("pos_embed", "decoder_pos_embed"),
    )


def setup_healthy():
    return _setup("healthy")


def setup_norm_pix_no_eps():
    return _setup("norm_pix_no_eps")


if __name__ == "__main__":
    torch.set_num_threads(1)
    run = sys.argv[1] if len(sys.argv) > 1 else "healthy"
    t = train(run, Path("."), seed=0)
    print(symptom(run, t))
