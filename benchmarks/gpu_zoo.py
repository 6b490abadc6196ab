"""A few zoo examples triaged on a CUDA GPU under fp16 autocast with a GradScaler (the run's own, as an AMP
run has one), beside the same examples as shipped: prints each verdict, its confidence and seconds.

    python benchmarks/gpu_zoo.py                      # needs a CUDA GPU
    python benchmarks/gpu_zoo.py fp16_overflow healthy_mlp
"""

import sys
import tempfile
import time
from pathlib import Path

import torch

import triage
from triage.cli.zoo import load_example

DEFAULT = ("fp16_overflow", "lr_too_high", "healthy_mlp", "numerical_instability", "bad_batch")


def on_gpu_in_fp16(setup_fn):
    """The example's own setup(), moved to CUDA under fp16 autocast with a GradScaler."""
    def setup() -> triage.Setup:
        s = setup_fn()
        return s.model_copy(update={"device": "cuda", "precision": "fp16",
                                    "scaler": torch.amp.GradScaler("cuda")})
    return setup


def main(names) -> None:
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    for name in names:
        example = load_example(name)
        with tempfile.TemporaryDirectory() as folder:
            checkpoint = example.write_checkpoint(Path(folder) / "ckpt.pt")
            for label, factory in (("as shipped", example.setup), ("cuda fp16+scaler", on_gpu_in_fp16(example.setup))):
                started = time.perf_counter()
                report, _ = triage.run(factory, checkpoint, out=Path(folder) / label.replace(" ", "_"))
                print(f"{name:<24} {label:<18} {report.root_cause:<24} {report.confidence:<7} "
                      f"{time.perf_counter() - started:6.1f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or DEFAULT)
