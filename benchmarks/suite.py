"""triage's fault-injection benchmark: generated runs, one root cause each (or healthy), every one certified
by a stock-PyTorch check (benchmarks/suite/check.py) before it counts; triaged in-process by workers.

    python benchmarks/suite.py --split tune                 # tune on this part only
    python benchmarks/suite.py --split heldout              # report on the held-back part
    python benchmarks/suite.py --split lofo                 # the families never tuned on (rnn, binary_classifier)
    python benchmarks/suite.py --split lofo --family binary_classifier
    python benchmarks/suite.py --sample ci                  # every cause and healthy, 2 families each
    python benchmarks/suite.py --only lr_too_high dead_relu --json out.json --keep /tmp/reports
    python benchmarks/suite.py --split all --no-triage      # generate and validate only: the validity table
    python benchmarks/suite.py --split blind --axis schedule --workers 1   # issues 20/21's axes: measured blind

Checkpoints and verdicts are cached under ~/.cache/triage/suite (--cache), keyed by the generator's source.
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `suite` is the package beside this file

from suite.axes import AXES  # noqa: E402
from suite.cases import (BLIND_SPLIT, LOFO_FAMILIES, SPLITS, CaseSpec, all_cases, blind_cases,  # noqa: E402
                         sample_for_ci, split_of)
from suite.faults import CAUSES, HEALTHY  # noqa: E402
from suite.families import BLIND_FAMILY_NAMES, FAMILY_NAMES  # noqa: E402
from suite.runner import run_cases  # noqa: E402
from suite.summary import (print_accuracy, print_by_split, print_generation_times,  # noqa: E402
                           print_validity)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", choices=SPLITS + ("all", BLIND_SPLIT), default="tune",
                        help="all: tune + heldout + lofo; blind: the held-out axes of issues 20/21, never tuned on")
    parser.add_argument("--axis", nargs="+", choices=AXES, help="these blind axes only (implies --split blind)")
    parser.add_argument("--sample", choices=["ci"], help="a stratified sample instead of every case")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--only", nargs="+", metavar="CAUSE", choices=CAUSES + (HEALTHY,))
    parser.add_argument("--family", nargs="+", choices=FAMILY_NAMES + BLIND_FAMILY_NAMES,
                        help="these model families only")
    parser.add_argument("--json", type=Path, help="write every case's result here")
    parser.add_argument("--keep", type=Path, help="keep triage's reports here (one folder per case)")
    parser.add_argument("--cache", type=Path, help="checkpoints and verdicts (default ~/.cache/triage/suite)")
    parser.add_argument("--no-triage", action="store_true", help="generate and validate only")
    parser.add_argument("--no-race", action="store_true", help="every candidate fix to its last step (triage run --no-race)")
    args = parser.parse_args()

    if args.axis or (args.family and set(args.family) <= set(BLIND_FAMILY_NAMES)):
        args.split = BLIND_SPLIT  # the blind axes and families live in that split only
    if args.split == BLIND_SPLIT and args.sample:
        parser.error("--sample ci draws from the tuned grid; the blind split has no CI sample")
    pool = blind_cases() if args.split == BLIND_SPLIT else all_cases()
    specs = [s for s in pool if args.split in ("all", BLIND_SPLIT) or split_of(s) == args.split]
    if args.axis:
        specs = [s for s in specs if s.axis in args.axis]
    if args.only:
        specs = [s for s in specs if s.cause in args.only]
    if args.family:
        specs = [s for s in specs if s.family in args.family]
    if args.sample == "ci":  # skip candidates the (cached) stock check excludes, so every cause is covered
        specs = sample_for_ci(specs, is_valid=_validity_checker(args.cache))
    print(f"{len(specs)} cases, split {args.split}{', CI sample' if args.sample else ''}, "
          f"{args.workers} worker(s)", flush=True)

    started = time.perf_counter()
    results = []
    for i, result in enumerate(run_cases(specs, args.workers, args.cache, args.keep, not args.no_triage, not args.no_race), 1):
        results.append(result)
        print(f"[{i:3d}/{len(specs)}] {_line(result)}", flush=True)
    wall = time.perf_counter() - started
    results.sort(key=lambda r: r.id)

    print()
    print_validity(results, sys.stdout)
    print_generation_times(results, sys.stdout)
    if not args.no_triage:
        print_accuracy(results, sys.stdout, title=f"split {args.split}")
        if args.split == "all":
            print("top-1 by split:")
            print_by_split(results, sys.stdout)
        axes = sorted({CaseSpec.from_id(r.id).axis for r in results} - {""})
        for axis in axes if len(axes) > 1 else ():  # each blind axis's figure apart
            print_accuracy([r for r in results if CaseSpec.from_id(r.id).axis == axis], sys.stdout,
                           title=f"blind axis {axis}")
        for family in LOFO_FAMILIES:  # each held-out family's figure apart
            lofo = [r for r in results if r.split == "lofo" and CaseSpec.from_id(r.id).family == family]
            if lofo and len(lofo) < len(results):
                print_accuracy(lofo, sys.stdout, title=f"lofo {family} (never tuned on)")
    print(f"\nwall time {wall:.0f} s for {len(results)} cases ({args.workers} worker(s))")
    if args.json:
        args.json.write_text("[\n" + ",\n".join(r.model_dump_json() for r in results) + "\n]\n")
        print(f"wrote {args.json}")


def _validity_checker(cache_root):
    import torch

    from suite.cache import CaseCache
    from suite.cases import build_case

    torch.set_num_threads(1)
    cache = CaseCache(cache_root)
    return lambda spec: cache.validity(build_case(spec))[0].ok


def _line(result) -> str:
    if not result.valid:
        return f"· {result.id:<52} excluded: {result.validity.reason[:90]}"
    if result.seconds is None:
        return f"· {result.id:<52} valid"
    said = result.predicted or "triage raised " + (result.error or "").split("\n")[0][:60]
    return f"{'✓' if result.predicted == result.expected else '✗'} {result.id:<52} {said}"


if __name__ == "__main__":
    main()
