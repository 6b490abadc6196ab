"""WGAN-GP on the 8-Gaussians toy: an MLP critic and an MLP generator, five critic steps per generator step.

What it does
------------
A small Wasserstein GAN with gradient penalty learns the "8 gaussians" 2-D toy distribution (eight tight
Gaussian blobs on a ring, generated in code and seeded). The critic and the generator are ReLU MLPs; each
generator iteration takes CRITIC_ITERS=5 critic steps, each on a fresh real batch, with the gradient penalty
LAMBDA * (||grad_x D(x_hat)||_2 - 1)^2 taken on random interpolates between real and fake points
(`torch.autograd.grad(..., create_graph=True)`), then one generator step on -mean D(G(z)). Both networks use
Adam with betas (0.5, 0.9). The critic's cost D(fake) - D(real) + GP is negative by nature (minus the
Wasserstein estimate), so a healthy run has a negative, slowly rising critic cost and a generator cost that
wanders: neither is a loss that should go to 0.

Public original
---------------
igul222/improved_wgan_training `gan_toy.py` (the toy of the WGAN-GP paper: MODE 'wgan-gp', 8gaussians,
DIM 512, CRITIC_ITERS 5, LAMBDA .1 for the toy, Adam 1e-4 betas (0.5, 0.9), disc cost
mean(D(fake)) - mean(D(real)) + GP on interpolates) as ported to PyTorch (caogang/wgan-gp `gan_toy.py`:
`netD.zero_grad()` each critic iteration, `fake = netG(noise).detach()`, `requires_grad` toggled off the
critic for the generator step), and eriklindernoren/PyTorch-GAN `implementations/wgan_gp/wgan_gp.py`
(`compute_gradient_penalty`, lambda_gp, n_critic, `optimizer_G.zero_grad()` inside `if i % n_critic == 0`).
Read through the `search` tool (code corpus, and the issue threads below). Scaled down for one CPU thread:
DIM 64, batch 128, lr 1e-3, LAMBDA 0.1. The iteration log is written as `log.csv` (the original's
`lib.plot` keeps disc cost / gen cost per iteration); the checkpoint is a dict
{"model", "optimizer": {"G", "D"}, "iteration"}.

Triage setup: `optimizers={"G": opt_g, "D": opt_d}`, and a `train_step` that is one generator iteration
(five critic steps then one generator step), as "Your own training step" says for a GAN; each snapshot batch
holds the five real batches of one iteration (shape 5 x 128 x 2). `loss_fn` is the critic's cost plus the
generator's, so both networks get a gradient.

Runs
----
healthy: the run as the originals write it. Checkpoint at iteration 120 of 240, while the generator is still
    closing on the modes. The critic cost is negative throughout.

generator_pushed_away (cause `loop_bug`): the user followed eriklindernoren's wgan_gp.py, whose critic step
    feeds the generator's output to the critic without `.detach()` (PyTorch-GAN issues #21 and #136, "WGAN GP
    detach is necessary?", "Bug in WGAN-GP?": the maintainers' answer is that it does not matter "since we
    later zero out the gradients" of G right before its step). Tidying the loop, the user moved
    `optimizer_G.zero_grad()` to the top of the generator iteration, next to the critic's. Now the five critic
    backward passes each leave d(D(fake))/dG (and the penalty's gradient through the interpolates) in G's
    .grad, and the generator step adds its own -d(D(fake))/dG once: G descends the critic's cost, i.e. is
    pushed away from the data, five times harder than it is pulled towards it. The same family of slip is
    ajbrock/BigGAN-PyTorch issue #25 (the critic's zero_grad missing between its steps, "a typo").
    Symptom: after 400 iterations the energy distance between generated and real points is far above a
    healthy run's 0.02 (usually above where it started: the generated points fly off and the Wasserstein
    estimate grows by orders of magnitude). Checkpoint: the periodic one at iteration 100, where the
    samples have started to drift away and the Wasserstein estimate is rising. The deciding fix is in the loop (detach the fake in the critic step, so G's
    gradient is its own loss's): `loop_bug`. Competing: a lower learning rate for both nets (the generator
    still walks away, only slower) and a single critic step per generator step (the usual "critic too
    strong" reflex: the two gradients then cancel and G stays where it started).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import torch
from torch import nn

import triage

if __package__ in (None, ""):
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from _program import Program, Run, Trained  # noqa: E402

DIM = 64
BATCH = 128
CRITIC_ITERS = 5
LAMBDA = 0.1
LR = 1e-3
BETAS = (0.5, 0.9)
ITERS = 400
CKPT_HEALTHY = 150
CKPT_FAULT = 100
N_SNAPSHOT = 40

PROGRAM = Program(
    name="wgan_gp",
    kind="gan",
    original="igul222/improved_wgan_training gan_toy.py (PyTorch port caogang/wgan-gp gan_toy.py); "
             "eriklindernoren/PyTorch-GAN implementations/wgan_gp/wgan_gp.py",
    runs={
        "healthy": Run(
            cause="healthy",
            story="WGAN-GP on the 8-gaussians toy, 5 critic steps per generator step, Adam (0.5, 0.9). The "
                  "critic cost is negative (minus the Wasserstein estimate) and the generator cost wanders; "
                  "the generated points close in on the eight modes. Checkpoint mid-run.",
        ),
        "generator_pushed_away": Run(
            cause="loop_bug",
            story="I moved optimizer_G.zero_grad() to the top of the iteration next to the critic's, and my "
                  "critic step (like PyTorch-GAN's) does not detach the fake. The generator never gets "
                  "closer to the data: its samples drift away from the ring and the Wasserstein estimate "
                  "keeps growing. Lowering the LR or using one critic step did not help.",
            fix="detach_fake",
            competing=("lower_lr", "one_critic_step"),
        ),
    },
)


# ----------------------------------------------------------------------------------------------- data
def centers() -> torch.Tensor:
    s = 2.0
    pts = [(1, 0), (-1, 0), (0, 1), (0, -1), (1 / math.sqrt(2), 1 / math.sqrt(2)),
           (1 / math.sqrt(2), -1 / math.sqrt(2)), (-1 / math.sqrt(2), 1 / math.sqrt(2)),
           (-1 / math.sqrt(2), -1 / math.sqrt(2))]
    return torch.tensor(pts, dtype=torch.float32) * s / 1.414


def eight_gaussians(n: int, g: torch.Generator) -> torch.Tensor:
    c = centers()
    idx = torch.randint(0, 8, (n,), generator=g)
    return c[idx] + 0.04 * torch.randn(n, 2, generator=g)


def iteration_batches(n_iters: int, seed: int) -> list[torch.Tensor]:
    """One tensor per generator iteration: the CRITIC_ITERS real batches its critic steps take."""
    g = torch.Generator().manual_seed(1000 + seed)
    return [eight_gaussians(CRITIC_ITERS * BATCH, g).view(CRITIC_ITERS, BATCH, 2) for _ in range(n_iters)]


# ---------------------------------------------------------------------------------------------- model
class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(nn.Linear(2, DIM), nn.ReLU(True), nn.Linear(DIM, DIM), nn.ReLU(True),
                                  nn.Linear(DIM, DIM), nn.ReLU(True), nn.Linear(DIM, 2))

    def forward(self, noise):
        return self.main(noise)


class Critic(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(nn.Linear(2, DIM), nn.ReLU(True), nn.Linear(DIM, DIM), nn.ReLU(True),
                                  nn.Linear(DIM, DIM), nn.ReLU(True), nn.Linear(DIM, 1))

    def forward(self, x):
        return self.main(x).view(-1)


class WGANGP(nn.Module):
    def __init__(self):
        super().__init__()
        self.generator = Generator()
        self.critic = Critic()


def calc_gradient_penalty(critic: nn.Module, real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
    alpha = torch.rand(real.size(0), 1).expand_as(real)
    interpolates = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
    disc_interpolates = critic(interpolates)
    gradients = torch.autograd.grad(outputs=disc_interpolates, inputs=interpolates,
                                    grad_outputs=torch.ones_like(disc_interpolates),
                                    create_graph=True, retain_graph=True)[0]
    return ((gradients.norm(2, dim=1) - 1) ** 2).mean() * LAMBDA


def build(lr_scale: float = 1.0):
    model = WGANGP()
    opt_d = torch.optim.Adam(model.critic.parameters(), lr=LR * lr_scale, betas=BETAS)
    opt_g = torch.optim.Adam(model.generator.parameters(), lr=LR * lr_scale, betas=BETAS)
    return model, {"G": opt_g, "D": opt_d}


# ----------------------------------------------------------------------------------------------- step
def make_train_step(run: str, variant: str | None):
    """One generator iteration: CRITIC_ITERS critic steps, then one generator step."""
    buggy = run == "generator_pushed_away" and variant != "detach_fake"
    n_critic = 1 if variant == "one_critic_step" else CRITIC_ITERS

    def train_step(model: WGANGP, optimizers, batch: torch.Tensor):
        netG, netD = model.generator, model.critic
        opt_g, opt_d = optimizers["G"], optimizers["D"]
        if buggy:
            opt_g.zero_grad()                       # the user's tidy-up: G's grads cleared once, up here
        for p in netD.parameters():
            p.requires_grad_(True)
        disc_costs = []
        for i in range(n_critic):
            real = batch[i]
            opt_d.zero_grad()
            d_real = netD(real).mean()
            noise = torch.randn(real.size(0), 2)
            fake = netG(noise)
            if not buggy:
                fake = fake.detach()
            d_fake = netD(fake).mean()
            gp = calc_gradient_penalty(netD, real, fake)
            disc_cost = d_fake - d_real + gp
            disc_cost.backward()
            opt_d.step()
            disc_costs.append(disc_cost.item())
        for p in netD.parameters():
            p.requires_grad_(False)
        if not buggy:
            opt_g.zero_grad()
        fake = netG(torch.randn(BATCH, 2))
        gen_cost = -netD(fake).mean()
        gen_cost.backward()
        opt_g.step()
        for p in netD.parameters():
            p.requires_grad_(True)
        wdist = -(disc_costs[-1])
        return torch.tensor(disc_costs[-1] + gen_cost.item()), disc_costs[-1], gen_cost.item(), wdist

    return train_step


def loss_fn(model: WGANGP, batch: torch.Tensor):
    """The two objectives, so that both networks get a gradient: critic cost + generator cost."""
    real = batch[0]
    fake = model.generator(torch.randn(real.size(0), 2))
    disc_cost = model.critic(fake.detach()).mean() - model.critic(real).mean() \
        + calc_gradient_penalty(model.critic, real, fake.detach())
    gen_cost = -model.critic(fake).mean()
    return {"critic": disc_cost, "generator": gen_cost}


@torch.no_grad()
def energy_distance(model: WGANGP, n: int = 1000) -> float:
    """Energy distance between generated and real points (0 when the distributions match)."""
    g = torch.Generator().manual_seed(12345)
    fake = model.generator(torch.randn(n, 2, generator=g))
    real = eight_gaussians(n, g)
    return (2 * torch.cdist(fake, real).mean() - torch.cdist(fake, fake).mean()
            - torch.cdist(real, real).mean()).item()


@torch.no_grad()
def mode_distance(model: WGANGP, n: int = 2000) -> float:
    """Mean distance of generated points to their nearest mode centre (0.02-ish when learnt)."""
    g = torch.Generator().manual_seed(12345)
    fake = model.generator(torch.randn(n, 2, generator=g))
    return torch.cdist(fake, centers()).min(dim=1).values.mean().item()


# ---------------------------------------------------------------------------------------------- train
def train(run: str, out_dir: Path, seed: int = 0, variant: str | None = None) -> Trained:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model, optimizers = build(lr_scale=0.1 if variant == "lower_lr" else 1.0)
    step_fn = make_train_step(run, variant)
    data = iteration_batches(ITERS, seed)
    ckpt_at = CKPT_HEALTHY if run == "healthy" else CKPT_FAULT
    start_dist, start_ed = mode_distance(model), energy_distance(model)
    losses, rows = [], []
    ckpt = out_dir / "ckpt.pt"
    for iteration in range(ITERS):
        loss, d, gcost, w = step_fn(model, optimizers, data[iteration])
        losses.append(float(loss))
        rows.append((iteration, float(loss), d, gcost, w))
        if iteration + 1 == ckpt_at:
            torch.save({"model": model.state_dict(),
                        "optimizer": {k: o.state_dict() for k, o in optimizers.items()},
                        "iteration": iteration + 1}, ckpt)
            ckpt_dist, ckpt_ed = mode_distance(model), energy_distance(model)
    hist = out_dir / "log.csv"
    with open(hist, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["iteration", "loss", "disc_cost", "gen_cost", "wasserstein_distance"])
        w.writerows(rows)
    tail = rows[-20:]
    return Trained(checkpoint=ckpt, train_losses=losses, history=hist,
                   metrics={"mode_dist_start": start_dist, "mode_dist_ckpt": ckpt_dist,
                            "mode_dist_end": mode_distance(model),
                            "energy_start": start_ed, "energy_ckpt": ckpt_ed, "energy_end": energy_distance(model),
                            "wdist_end": sum(r[4] for r in tail) / len(tail),
                            "disc_cost_end": sum(r[2] for r in tail) / len(tail)})


def symptom(run: str, trained: Trained) -> str | None:
    m = trained.metrics
    if not all(math.isfinite(v) for v in m.values()):
        return f"training went non-finite: {m}"
    if m["energy_end"] > 0.2:
        return (f"after {ITERS} generator iterations the energy distance between generated and real points is "
                f"{m['energy_end']:.3g} (start {m['energy_start']:.2f}, checkpoint {m['energy_ckpt']:.3g}; a "
                f"healthy run ends near 0.02); generated points {m['mode_dist_end']:.3g} from the nearest mode, "
                f"Wasserstein estimate {m['wdist_end']:.3g} over the last 20 iterations")
    return None


# ---------------------------------------------------------------------------------------------- setup
def _setup(run: str) -> triage.Setup:
    torch.manual_seed(0)
    model, optimizers = build()
    step_fn = make_train_step(run, None)

    def train_step(model, optimizers, batch):
        return step_fn(model, optimizers, batch)[0]

    ckpt_at = CKPT_HEALTHY if run == "healthy" else CKPT_FAULT
    # the real batches of the iterations after the checkpoint (the data the run took next)
    data = iteration_batches(ckpt_at + N_SNAPSHOT, 0)[ckpt_at:ckpt_at + N_SNAPSHOT]
    return triage.Setup(model=model, optimizers=optimizers, loss_fn=loss_fn, batches=data,
                        train_step=train_step, total_steps=ITERS)


def setup_healthy() -> triage.Setup:
    return _setup("healthy")


def setup_generator_pushed_away() -> triage.Setup:
    return _setup("generator_pushed_away")


if __name__ == "__main__":
    import sys
    import time
    torch.set_num_threads(1)
    for r in (sys.argv[1:] or list(PROGRAM.runs)):
        t = time.perf_counter()
        tr = train(r, Path("/tmp/wgan_gp_out") / r)
        print(r, round(time.perf_counter() - t, 2), "s", tr.metrics, symptom(r, tr))
