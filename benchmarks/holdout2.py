"""Held-out accuracy of the default playbook: `python benchmarks/holdout2.py [NAME ...] [--keep DIR]`.

Runs triage over the modules in benchmarks/holdout2/ (a second held-out set, built without reading the first
one and not used to tune the playbook) exactly as `triage bench` runs the zoo, and prints the same table. Each
module follows the zoo's convention: ROOT_CAUSE, setup(), fixed_setup(), write_checkpoint(path).
"""

import argparse
import logging
import sys
from pathlib import Path

from triage.bench import print_table, run_cases

HOLDOUT_DIR = Path(__file__).resolve().parent / "holdout2"

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="held-out-2 modules to run (default: all)")
    parser.add_argument("--keep", type=Path, help="keep checkpoints and reports here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    print_table(run_cases(args.names or None, folder=HOLDOUT_DIR, keep=args.keep), sys.stdout)
