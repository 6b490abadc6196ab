"""Accuracy and speed of triage over a folder of fault modules (default: the zoo in examples/).

    python benchmarks/accuracy.py                              # the zoo
    python benchmarks/accuracy.py --folder benchmarks/holdout  # differently built runs, same faults
    python benchmarks/accuracy.py --folder benchmarks/holdout2 lr_too_low_autoencoder_sgd --keep /tmp/r

Prints a per-case table, the confusion pairs, top-1 accuracy, false alarms on healthy examples and
seconds per case (the same as `triage bench`). Every module follows the zoo's convention: ROOT_CAUSE,
setup(), fixed_setup(), write_checkpoint(path).

The held-out sets were built apart from the zoo to measure whether the playbook generalises. Each was
measured once untouched (holdout 20/29, holdout2 21/27) and then used to make general changes to the
playbook, so their current scores are no longer a held-out measure: a new set is.
"""

import argparse
import logging
import sys
from pathlib import Path

from triage.cli.bench import print_table, run_cases

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="modules to run (default: all in the folder)")
    parser.add_argument("--folder", type=Path, help="a folder of fault modules (default: examples/)")
    parser.add_argument("--keep", type=Path, help="keep checkpoints and reports here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    print_table(run_cases(args.names or None, folder=args.folder, keep=args.keep), sys.stdout)
