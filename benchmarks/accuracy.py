"""Accuracy and speed of triage over the fault zoo: `python benchmarks/accuracy.py [NAME ...]`.

Prints a per-case table, the confusion pairs, top-1 accuracy, false alarms on healthy examples and
seconds per case (the same as `triage bench`).
"""

import logging
import sys

from triage.bench import print_table, run_cases

if __name__ == "__main__":
    logging.basicConfig(level=logging.ERROR)
    print_table(run_cases(sys.argv[1:] or None), sys.stdout)
