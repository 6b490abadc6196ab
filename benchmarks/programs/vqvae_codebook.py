"""VQ-VAE (van den Oord et al. 2017): a conv encoder, a vector-quantisation bottleneck with a learned codebook,
the codebook and commitment losses, the straight-through estimator, and a conv decoder.

Written after zalandoresearch/pytorch-vq-vae (`vq-vae.ipynb`): `VectorQuantizer(num_embeddings,
embedding_dim, commitment_cost)` with an `nn.Embedding` codebook initialised uniform(-1/K, 1/K), nearest code by
squared distance, one-hot encodings, `e_latent_loss = mse(quantized.detach(), inputs)`, `q_latent_loss =
mse(quantized, inputs.detach())`, `loss = q_latent_loss + commitment_cost * e_latent_loss`, the straight-through
line `quantized = inputs + (quantized - inputs).detach()`, and the perplexity of the code usage; an encoder of two
stride-2 4x4 convs, a 3x3 conv and a residual stack, a 1x1 `pre_vq_conv`, a decoder that mirrors it with
ConvTranspose2d; training with Adam lr 1e-3, `recon_error = mse(data_recon, data) / data_variance`,
`loss = recon_error + vq_loss`, logging recon error and perplexity. I also read the MishaLaskin/vqvae quantizer
(same losses, same straight-through line). Here: 1x16x16 images of 1-3 random bright shapes (squares, discs,
bars) on a dark textured background, a 4x4 latent grid of 16-d vectors, K = 64 codes, batch 64. The loss is a dict
of its two terms `{"recon_error", "vq_loss"}`. Checkpoints are `{"step", "model", "optimizer",
"recon_history", "perplexity_history"}` every 100 steps.

Runs
- healthy: as the notebook; 300 steps, checkpoint at step 200. recon_error (normalised by the data variance)
  falls from ~1 to ~0.4 at the checkpoint and is still falling (~0.35 at step 300); the total loss is noisy and
  spikes early (the vq term is large while the encoder's outputs are far from the tiny initial codebook) and the
  codebook perplexity stays modest (4-7 of 64 codes in use), which is how this layer trains, not a fault.
- quantizer_without_straight_through: the owner rewrote the quantizer "more simply" and returned the looked-up
  code vectors directly (`quantized = self._embedding.weight[idx]`), dropping the line
  `quantized = inputs + (quantized - inputs).detach()`. The forward pass is identical, but the reconstruction
  loss no longer reaches the encoder: `argmin` has no gradient, so the encoder is trained only by the small
  commitment term (which pulls its outputs onto whatever codes they already pick), and the decoder and codebook
  learn to decode the codes of a random, frozen-in-effect encoder. recon_error stays at ~0.92 of the data variance,
  the level of predicting the mean image, from the first steps to the last (the healthy run is at ~0.35). Why a user hits it: the straight-through trick is the one line of a VQ
  layer that changes no value, so it is the one that gets "cleaned up". zalandoresearch/pytorch-vq-vae#6
  ("How does the reconstruction loss update the encoder?": the answer is that one line), Biohub/esm#92 (a decoder
  fed the code indices alone "will not populate gradients for the encoder parameters"), ritheshkumar95/
  pytorch-vqvae#8 (a user's own VQ layer whose output carries no gradient).
  Root cause `no_gradient_flow`: the encoder's parameters get no gradient from the reconstruction (a graph cut at
  the quantizer); putting the straight-through line back (`straight_through`) trains. Competing fix a user tries
  first: a larger commitment cost (`commitment_1.0`, to "tie the encoder to the codebook"), which leaves it:
  the encoder still never sees the reconstruction error.
"""

from __future__ import annotations

from pathlib import Path

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
    name="vqvae_codebook",
    kind="vector-quantised autoencoder",
    original="zalandoresearch/pytorch-vq-vae: vq-vae.ipynb (VectorQuantizer, Encoder, Decoder, training loop)",
    runs={
        "healthy": Run(cause="healthy", story="VQ-VAE with a 64-code codebook on 16x16 shape images, Adam 1e-3; "
                       "recon error (over data variance) still falling at the step-200 checkpoint; the total "
                       "loss spikes early from the vq term."),
        "quantizer_without_straight_through": Run(
            cause="no_gradient_flow",
            story="I simplified the VectorQuantizer and return the codebook vectors directly. Training runs, the "
                  "vq loss is fine, but the reconstruction error never leaves ~0.92 of the data variance and the "
                  "reconstructions are all the same grey blur. A bigger commitment cost did not help.",
            fix="straight_through", competing=("commitment_1.0",)),
    },
)

IMG, BS, STEPS, CKPT_STEP, N_TRAIN, N_VAL = 16, 64, 300, 200, 4096, 512
K, D, HID, RES_HID = 64, 16, 32, 16
LR = 1e-3


# ----------------------------------------------------------------------------------------------- data
def make_images(n, g):
    yy, xx = torch.meshgrid(torch.arange(IMG).float(), torch.arange(IMG).float(), indexing="ij")
    out = 0.1 * torch.rand(n, 1, IMG, IMG, generator=g)
    for i in range(n):
        for _ in range(int(torch.randint(1, 4, (1,), generator=g))):
            kind = int(torch.randint(0, 3, (1,), generator=g))
            cx, cy = (torch.rand(2, generator=g) * (IMG - 4) + 2).tolist()
            r = float(torch.rand(1, generator=g) * 3 + 1.5)
            v = float(torch.rand(1, generator=g) * 0.6 + 0.4)
            if kind == 0:
                m = ((xx - cx).abs() <= r) & ((yy - cy).abs() <= r)
            elif kind == 1:
                m = (xx - cx) ** 2 + (yy - cy) ** 2 <= r * r
            else:
                m = ((xx - cx).abs() <= r * 1.5) & ((yy - cy).abs() <= 1)
            out[i, 0][m] = v
    return out


def make_data(seed):
    g = torch.Generator().manual_seed(6300 + seed)
    x = make_images(N_TRAIN + N_VAL, g)
    return x[:N_TRAIN], x[N_TRAIN:]


def data_variance(train_x):
    return float(train_x.var())


# ----------------------------------------------------------------------------------------------- model
class Residual(nn.Module):
    def __init__(self, ch, hid):
        super().__init__()
        self.block = nn.Sequential(nn.ReLU(), nn.Conv2d(ch, hid, 3, padding=1, bias=False), nn.ReLU(),
                                   nn.Conv2d(hid, ch, 1, bias=False))

    def forward(self, x):
        return x + self.block(x)


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv_1 = nn.Conv2d(1, HID // 2, 4, stride=2, padding=1)
        self.conv_2 = nn.Conv2d(HID // 2, HID, 4, stride=2, padding=1)
        self.conv_3 = nn.Conv2d(HID, HID, 3, padding=1)
        self.residual_stack = Residual(HID, RES_HID)

    def forward(self, x):
        x = F.relu(self.conv_1(x))
        x = F.relu(self.conv_2(x))
        x = self.conv_3(x)
        return F.relu(self.residual_stack(x))


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv_1 = nn.Conv2d(D, HID, 3, padding=1)
        self.residual_stack = Residual(HID, RES_HID)
        self.conv_trans_1 = nn.ConvTranspose2d(HID, HID // 2, 4, stride=2, padding=1)
        self.conv_trans_2 = nn.ConvTranspose2d(HID // 2, 1, 4, stride=2, padding=1)

    def forward(self, x):
        x = self.conv_1(x)
        x = F.relu(self.residual_stack(x))
        x = F.relu(self.conv_trans_1(x))
        return self.conv_trans_2(x)


class VectorQuantizer(nn.Module):
    def __init__(self, num_embeddings, embedding_dim, commitment_cost, straight_through=True):
        super().__init__()
        self._embedding_dim = embedding_dim
        self._num_embeddings = num_embeddings
        self._embedding = nn.Embedding(num_embeddings, embedding_dim)
        self._embedding.weight.data.uniform_(-1 / num_embeddings, 1 / num_embeddings)
        self._commitment_cost = commitment_cost
        self._straight_through = straight_through

    def forward(self, inputs):
        inputs = inputs.permute(0, 2, 3, 1).contiguous()          # BCHW -> BHWC
        flat = inputs.view(-1, self._embedding_dim)
        distances = (flat.pow(2).sum(1, keepdim=True) + self._embedding.weight.pow(2).sum(1)
                     - 2 * flat @ self._embedding.weight.t())
        idx = torch.argmin(distances, dim=1)
        if self._straight_through:
            encodings = F.one_hot(idx, self._num_embeddings).float()
            quantized = (encodings @ self._embedding.weight).view(inputs.shape)
        else:                                                     # the owner's "simpler" lookup
            quantized = self._embedding.weight[idx].view(inputs.shape)
            encodings = F.one_hot(idx, self._num_embeddings).float()
        e_latent_loss = F.mse_loss(quantized.detach(), inputs)
        q_latent_loss = F.mse_loss(quantized, inputs.detach())
        loss = q_latent_loss + self._commitment_cost * e_latent_loss
        if self._straight_through:
            quantized = inputs + (quantized - inputs).detach()
        avg_probs = encodings.mean(0)
        perplexity = torch.exp(-torch.sum(avg_probs * torch.log(avg_probs + 1e-10)))
        return loss, quantized.permute(0, 3, 1, 2).contiguous(), perplexity


class Model(nn.Module):
    def __init__(self, commitment_cost=0.25, straight_through=True, data_variance=1.0):
        super().__init__()
        self._encoder = Encoder()
        self._pre_vq_conv = nn.Conv2d(HID, D, 1)
        self._vq_vae = VectorQuantizer(K, D, commitment_cost, straight_through)
        self._decoder = Decoder()
        self.register_buffer("data_variance", torch.tensor(float(data_variance)))

    def forward(self, x):
        z = self._pre_vq_conv(self._encoder(x))
        loss, quantized, perplexity = self._vq_vae(z)
        return loss, self._decoder(quantized), perplexity


def loss_fn(model, batch):
    vq_loss, data_recon, _ = model(batch)
    recon_error = F.mse_loss(data_recon, batch) / model.data_variance
    return {"recon_error": recon_error, "vq_loss": vq_loss}


# ----------------------------------------------------------------------------------------------- config
def config(run, variant):
    straight = run == "healthy" or variant == "straight_through"
    commitment = 1.0 if variant == "commitment_1.0" else 0.25
    return straight, commitment


def build(run, variant=None, seed=0, var=1.0):
    torch.manual_seed(seed)
    straight, commitment = config(run, variant)
    model = Model(commitment, straight, var)
    opt = torch.optim.Adam(model.parameters(), lr=LR, amsgrad=False)
    return model, opt


def batches_for_epoch(x, epoch, seed):
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed * 1000 + epoch))
    return [x[order[i:i + BS]] for i in range(0, len(x) - BS + 1, BS)]


@torch.no_grad()
def evaluate(model, x):
    model.eval()
    t = loss_fn(model, x)
    _, _, perp = model(x)
    model.train()
    return float(t["recon_error"]), float(perp)


def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    train_x, val_x = make_data(seed)
    model, opt = build(run, variant, seed, data_variance(train_x))
    ckpt = Path(out_dir) / f"vqvae_step{CKPT_STEP}.pt"
    recon_hist, perp_hist, totals, vals = [], [], [], []
    step, epoch = 0, 0
    while step < STEPS:
        for batch in batches_for_epoch(train_x, epoch, seed):
            vq_loss, data_recon, perplexity = model(batch)
            recon_error = F.mse_loss(data_recon, batch) / model.data_variance
            loss = recon_error + vq_loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            recon_hist.append(recon_error.item())
            perp_hist.append(perplexity.item())
            totals.append(loss.item())
            if step % 50 == 0:
                vals.append(evaluate(model, val_x)[0])
            if step == CKPT_STEP:
                torch.save({"step": step, "model": model.state_dict(), "optimizer": opt.state_dict(),
                            "recon_history": list(recon_hist), "perplexity_history": list(perp_hist)}, ckpt)
            if step >= STEPS:
                break
        epoch += 1
    val_recon, val_perp = evaluate(model, val_x)
    return Trained(checkpoint=ckpt, train_losses=totals, val_losses=vals,
                   metrics={"val_recon": val_recon, "val_perplexity": val_perp,
                            "recon_first": sum(recon_hist[:10]) / 10, "recon_last": sum(recon_hist[-50:]) / 50})


def symptom(run: str, trained: Trained) -> str | None:
    m = trained.metrics
    if m["val_recon"] > 0.6:
        return (f"reconstruction error {m['val_recon']:.3f} of the data variance on held-out images after "
                f"{len(trained.train_losses)} steps (train {m['recon_first']:.3f} -> {m['recon_last']:.3f}), "
                f"codebook perplexity {m['val_perplexity']:.1f}")
    return None


def _setup(run):
    import triage

    train_x, val_x = make_data(0)
    model, opt = build(run, None, 0, data_variance(train_x))
    return triage.Setup(model=model, optimizer=opt, loss_fn=loss_fn, batches=batches_for_epoch(train_x, 0, 0),
                        val_batches=[val_x[i:i + 128] for i in range(0, len(val_x), 128)], total_steps=STEPS)


def setup_healthy():
    return _setup("healthy")


def setup_quantizer_without_straight_through():
    return _setup("quantizer_without_straight_through")
