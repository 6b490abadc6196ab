"""How often triage is right on programs nobody on the team wrote: the real-programs benchmark, held out by program.

    python benchmarks/programs.py                         # the tune split: a row per run, then the summary
    python benchmarks/programs.py --split heldout         # the held-back third: the summary only (see below)
    python benchmarks/programs.py --split fresh           # the second round (held back the same way)
    python benchmarks/programs.py --split round3          # the third round (held back the same way)
    python benchmarks/programs.py --split round4          # the fourth round (held back the same way)
    python benchmarks/programs.py --split round5          # the fifth round (held back the same way)
    python benchmarks/programs.py --split round6          # the sixth round (held back the same way)
    python benchmarks/programs.py --split round7          # the seventh round (held back the same way)
    python benchmarks/programs.py --split round8          # the eighth round (held back the same way)
    python benchmarks/programs.py --split round9          # the ninth round (held back the same way)
    python benchmarks/programs.py --split round10         # the tenth round (held back the same way)
    python benchmarks/programs.py --split round11         # the eleventh round (held back the same way)
    python benchmarks/programs.py --split round12         # the twelfth round (held back the same way)
    python benchmarks/programs.py --split round13         # the thirteenth round (held back the same way)
    python benchmarks/programs.py --only ctc_speech dcgan --keep /tmp/reports
    python benchmarks/programs.py --certify               # re-run every program's stock-PyTorch certificate
    python benchmarks/programs.py --sample ci             # what CI runs: a few runs, end to end
    python benchmarks/programs.py --merge a.json b.json   # the figures of runs made in several goes (--all-rows)
    python benchmarks/programs.py --list                  # the programs as a Markdown table (their README's)

Each program in benchmarks/programs/ (see its README) is a user's training script with a healthy run and one
or two faults, certified by a stock-PyTorch check that shares no code with triage. A run counts only while
its certificate (benchmarks/programs/certificates.json) matches the program's source. For each run the
program's own loop writes its checkpoint (cached under ~/.cache/triage/programs by source hash), then
`triage run --checkpoint ... --entry benchmarks/programs/NAME.py:setup_RUN` runs in a fresh process on one
torch thread, exactly as a user would run it, and its report.json gives the verdict.

The split is by program, by a hash of its name, fixed before any program was triaged: a third is held back.
A held-back program's rows are never printed, and its figures only as a whole (no per-kind line), unless
--show-cases is given: its verdicts are not to be looked at until the end of the work they are meant to judge.
--json writes the figures and the rows that may be seen; --all-rows writes every row, the held-back ones
included (keep it out of the repository), and --merge prints (and --json writes) the figures of such files.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROGRAMS = HERE / "programs"
CERTIFICATES = PROGRAMS / "certificates.json"
sys.path.insert(0, str(PROGRAMS))

import _program  # noqa: E402  (the folder beside this file)

SPLITS = ("tune", "heldout", "fresh", "round3", "round4", "round5", "round6", "round7", "round8", "round9", "round10",
          "round11", "round12", "round13")
# The second round, written blind from README alone after the held-back third had been read (2026-11-28): a
# split of its own, held back like the third until its first read, whatever the hash of its name says.
FRESH = ("distillation_kd", "clip_dual_encoder", "multilabel_bce", "wgan_gp", "byol_ema", "ordinal_regression")
# The third round, written blind the same way after the second had been read and tuned on (2026-11-28, session 8).
ROUND3 = ("word2vec_sgns", "transe_knowledge_graph", "crf_sequence_tagging", "maml_sinusoid", "pointnet_classification")
# The fourth, written blind the same way after the third had been read and tuned on (2026-11-28, session 9).
ROUND4 = ("masked_autoencoder", "speech_enhancement_sisnr", "knowledge_tracing_dkt")
# The fifth, written blind the same way after the fourth had been read and tuned on (2026-11-29, session 10).
ROUND5 = ("image_captioning_lstm", "sparse_autoencoder_l1", "fixmatch_semisupervised")
# The sixth, written blind the same way after the fifth had been read and tuned on (2026-11-29, session 11).
ROUND6 = ("mixture_density_network", "attention_mil_bags", "bert_mlm_pretraining")
# The seventh, written blind the same way after the sixth had been read and tuned on (2026-11-29, session 12).
ROUND7 = ("focal_loss_imbalanced", "listnet_ranking", "gat_node_classification")
# The eighth, written blind the same way after the seventh had been read and tuned on (2026-11-29, session 13).
ROUND8 = ("edsr_super_resolution", "vqvae_codebook", "cpc_infonce_audio")
# The ninth, written blind the same way after the eighth had been read and tuned on (2026-11-29, session 13).
ROUND9 = ("gumbel_softmax_vae", "deepsets_digit_sum", "deep_svdd_one_class")
# The tenth, written blind the same way after the ninth had been read and tuned on (2026-11-29, session 13).
ROUND10 = ("neural_ode_spiral", "sasrec_sequential_rec", "pixelcnn_masked_conv")
# The eleventh, written blind the same way after the tenth had been read and tuned on (2026-11-29, session 14).
ROUND11 = ("fno_burgers_operator", "rmtpp_point_process")
# The twelfth, written blind the same way after the eleventh had been read and tuned on (2026-11-29, session 14).
ROUND12 = ("learned_image_compression", "fourier_features_coordinate_mlp", "hypernetwork_task_conditioned")
# The thirteenth, written blind the same way after the twelfth had been read and tuned on (2026-11-29, session 15).
ROUND13 = ("barlow_twins_lars", "ebm_langevin_cd", "speaker_aamsoftmax_tdnn")
ROUNDS = {"fresh": FRESH, "round3": ROUND3, "round4": ROUND4, "round5": ROUND5, "round6": ROUND6, "round7": ROUND7,
          "round8": ROUND8, "round9": ROUND9,
          "round10": ROUND10, "round11": ROUND11,
          "round12": ROUND12, "round13": ROUND13}
# CI triages these runs end to end (tests/benchmarks/test_programs_benchmark.py), and re-runs CI_CERTIFY's certificate.
CI_SAMPLE = (("keyword_spotting_cnn", "healthy"), ("keyword_spotting_cnn", "scheduler_per_batch"))
CI_CERTIFY = ("keyword_spotting_cnn", "scheduler_per_batch")
TRIAGE_TIMEOUT_S = 900


def split_of(name: str) -> str:
    """A program's split, from its name alone: the second round's programs are `fresh`, the third to thirteenth
    rounds' `round3` to `round13`; of the first round's, a third (hash mod 3 == 0) is held back."""
    for split, names in ROUNDS.items():
        if name in names:
            return split
    return "heldout" if int(hashlib.sha256(name.encode()).hexdigest(), 16) % 3 == 0 else "tune"


def source_hash(name: str) -> str:
    """What a program's checkpoints and certificate are keyed on: its file and the shared _program.py."""
    h = hashlib.sha256((PROGRAMS / f"{name}.py").read_bytes())
    h.update((PROGRAMS / "_program.py").read_bytes())
    return h.hexdigest()[:16]


@dataclass
class Result:
    program: str
    run: str
    kind: str
    split: str
    want: str
    got: str | None = None          # triage's root cause; None where triage gave none (see error)
    confidence: str | None = None
    seconds: float | None = None    # triage's wall time, process start to exit
    train_seconds: float | None = None
    error: str | None = None

    @property
    def right(self) -> bool:
        return self.got == self.want


# --- running -------------------------------------------------------------------------------------------

def _checkpoint(name: str, run: str, cache: Path):
    """The run's checkpoint, trained by the program's own loop once per source version."""
    module = _program.load(name)
    out = cache / f"{name}-{source_hash(name)}" / run
    record = out / "trained.json"
    if record.exists():
        saved = json.loads(record.read_text())
        return Path(saved["checkpoint"]), saved["history"] and Path(saved["history"]), None
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    trained = module.train(run, out, seed=0)
    seconds = time.perf_counter() - started
    history = str(trained.history) if trained.history else None
    record.write_text(json.dumps({"checkpoint": str(trained.checkpoint), "history": history, "seconds": seconds}))
    return Path(trained.checkpoint), history and Path(history), seconds


def triage_one(name: str, run: str, cache: Path, keep: Path | None, speedups: bool) -> Result:
    """Train (or take from the cache) one run's checkpoint, then triage it as a user would, in a fresh process."""
    import torch

    torch.set_num_threads(1)
    module = _program.load(name)
    spec = module.PROGRAM.runs[run]
    result = Result(name, run, module.PROGRAM.kind, split_of(name), spec.cause)
    try:
        checkpoint, history, result.train_seconds = _checkpoint(name, run, cache)
    except Exception as exc:  # a program that cannot train is the program's failure, said as such
        result.error = f"training raised {type(exc).__name__}: {exc}"
        return result
    if keep:
        return _triaged(result, checkpoint, history, keep / name / run, speedups)
    with tempfile.TemporaryDirectory(prefix="triage-programs-") as out:
        return _triaged(result, checkpoint, history, Path(out), speedups)


def _triaged(result: Result, checkpoint: Path, history: Path | None, out: Path, speedups: bool) -> Result:
    """`result` with the verdict of `triage run` on this checkpoint, its report written to `out`."""
    name, run = result.program, result.run
    command = [sys.executable, "-m", "triage", "run", "--checkpoint", str(checkpoint),
               "--entry", f"{PROGRAMS / name}.py:setup_{run}", "--out", str(out), "--output", "quiet"]
    if history:
        command += ["--history", str(history)]
    if not speedups:
        command.append("--no-speedups")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=TRIAGE_TIMEOUT_S, env=env,
                              cwd=HERE.parent)
    except subprocess.TimeoutExpired:
        result.error = f"triage ran past {TRIAGE_TIMEOUT_S} s"
        return result
    result.seconds = round(time.perf_counter() - started, 1)
    report = out / "report.json"
    if report.exists():
        verdict = json.loads(report.read_text())
        result.got, result.confidence = verdict.get("root_cause"), verdict.get("confidence")
    if done.returncode != 0 or result.got is None:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        result.error = f"triage exited {done.returncode}: " + " | ".join(tail)
    return result


def certified_runs() -> dict[str, dict[str, bool]]:
    """program -> run -> certified, for the certificates that match today's source."""
    if not CERTIFICATES.exists():
        return {}
    saved = json.loads(CERTIFICATES.read_text())
    return {name: entry["runs"] for name, entry in saved.items()
            if (PROGRAMS / f"{name}.py").exists() and entry["source"] == source_hash(name)}


def certify(names: list[str]) -> None:
    """Re-run the stock-PyTorch certificate of every run of these programs; write certificates.json."""
    import torch

    torch.set_num_threads(1)
    saved = json.loads(CERTIFICATES.read_text()) if CERTIFICATES.exists() else {}
    for name in names:
        module = _program.load(name)
        runs = {}
        for run in module.PROGRAM.runs:
            checks = _program.certify(module, run)
            runs[run] = all(c.ok for c in checks)
            bad = [c for c in checks if not c.ok]
            print(f"{'✓' if runs[run] else '✗'} {name}/{run}: {len(checks)} checks"
                  + (f", failing: seed {bad[0].seed} variant {bad[0].variant}: {bad[0].symptom}" if bad else ""),
                  flush=True)
        saved[name] = {"source": source_hash(name), "runs": runs}
        CERTIFICATES.write_text(json.dumps(saved, indent=1, sort_keys=True) + "\n")


# --- the summary ------------------------------------------------------------------------------------------

def summary(results: list[Result]) -> dict:
    """The figures a user would ask for: top-1, how often each confidence was right, the two worst mistakes."""
    def share(rs):
        return {"right": sum(r.right for r in rs), "of": len(rs)}

    healthy = [r for r in results if r.want == "healthy"]
    faulty = [r for r in results if r.want != "healthy"]
    by_kind = defaultdict(list)
    for r in results:
        by_kind[r.kind].append(r)
    return {
        "runs": len(results), "programs": len({r.program for r in results}),
        "top1": share(results),
        "high": share([r for r in results if r.confidence == "high"]),
        "medium": share([r for r in results if r.confidence == "medium"]),
        "low": share([r for r in results if r.confidence == "low"]),
        "healthy_called_faulty": sum(r.got not in (None, "healthy") for r in healthy),
        "healthy_called_faulty_high": sum(r.got not in (None, "healthy") and r.confidence == "high"
                                          for r in healthy),
        "healthy_runs": len(healthy),
        "faulty_called_healthy": sum(r.got == "healthy" for r in faulty),
        "faulty_runs": len(faulty),
        "errors": sum(r.error is not None for r in results),
        "by_kind": {kind: share(rs) for kind, rs in sorted(by_kind.items())},
    }


def _pct(share: dict) -> str:
    return f"{share['right']}/{share['of']}" + (f" = {100 * share['right'] / share['of']:.1f} %" if share["of"] else "")


def print_summary(figures: dict, title: str, per_kind: bool) -> None:
    """The summary's lines; per kind of program only where its rows may be seen."""
    print(f"\n{title}: {figures['runs']} runs of {figures['programs']} programs")
    print(f"  top-1                 {_pct(figures['top1'])}")
    for level in ("high", "medium", "low"):
        print(f"  '{level}' right{' ' * (14 - len(level))}{_pct(figures[level])}")
    print(f"  healthy called faulty {figures['healthy_called_faulty']} of {figures['healthy_runs']} "
          f"({figures['healthy_called_faulty_high']} with 'high')")
    print(f"  faulty called healthy {figures['faulty_called_healthy']} of {figures['faulty_runs']}")
    print(f"  triage gave no verdict {figures['errors']}")
    if per_kind:
        print("  by kind of program:")
        for kind, share in figures["by_kind"].items():
            print(f"    {kind:<18} {_pct(share)}")


def _row(r: Result) -> str:
    mark = "·" if r.error and r.got is None else ("✓" if r.right else "✗")
    got = f"{r.got} ({r.confidence})" if r.got else (r.error or "")[:80]
    seconds = f"{r.seconds:6.1f} s" if r.seconds is not None else "      -"
    return f"{mark} {r.program + '/' + r.run:<48} want {r.want:<24} got {got:<36} {seconds}"


def table() -> str:
    """Every program as a Markdown row: its kind, its original, its runs with the cause each should get."""
    certified = certified_runs()
    rows = ["| program | kind | split | original | runs (the cause a right verdict names) |",
            "| --- | --- | --- | --- | --- |"]
    for name in _program.names():
        program = _program.load(name).PROGRAM
        runs = ", ".join(f"`{run}` → {spec.cause}" + ("" if certified.get(name, {}).get(run) else " (not certified)")
                         for run, spec in program.runs.items())
        rows.append(f"| {name} | {program.kind} | {split_of(name)} | {program.original} | {runs} |")
    return "\n".join(rows)


# --- the command --------------------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", choices=SPLITS + ("all",), default="tune")
    parser.add_argument("--only", nargs="+", metavar="PROGRAM", help="these programs only")
    parser.add_argument("--sample", choices=["ci"], help="CI's few runs instead of the split")
    parser.add_argument("--workers", type=int, default=2, help="runs triaged at once (one torch thread each)")
    parser.add_argument("--speedups", action="store_true",
                        help="let each triage fork a second process (off by default: the workers use the cores)")
    parser.add_argument("--json", type=Path, help="write the figures and the rows that may be seen here")
    parser.add_argument("--all-rows", type=Path, help="write every row here, held-back ones too (not to be read)")
    parser.add_argument("--keep", type=Path, help="keep triage's reports here (PROGRAM/RUN/)")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "triage" / "programs")
    parser.add_argument("--show-cases", action="store_true", help="print the held-back split's rows too")
    parser.add_argument("--certify", action="store_true", help="re-run the certificates instead of triage")
    parser.add_argument("--uncertified", action="store_true", help="triage runs without a current certificate")
    parser.add_argument("--merge", nargs="+", type=Path, metavar="JSON",
                        help="print the figures of these --all-rows files (a later file's row replaces an earlier)")
    parser.add_argument("--list", action="store_true", help="print the programs as a Markdown table")
    args = parser.parse_args()
    if args.merge:
        merge(args.merge, args)
        return
    if args.list:
        print(table())
        return

    names = _program.names()
    if args.only:
        unknown = sorted(set(args.only) - set(names))
        if unknown:
            parser.error(f"no program {', '.join(unknown)} in {PROGRAMS}; there are: {', '.join(names)}")
        names = [n for n in names if n in args.only]
    elif args.split != "all" and not args.sample:
        names = [n for n in names if split_of(n) == args.split]
    if args.certify:
        certify(names)
        return

    certified = certified_runs()
    cases, skipped = [], []
    for name in names:
        for run in _program.load(name).PROGRAM.runs:
            ok = certified.get(name, {}).get(run, False)
            (cases if ok or args.uncertified else skipped).append((name, run))
    if args.sample == "ci":
        cases = [c for c in cases if c in CI_SAMPLE]
    chosen = "the programs named" if args.only else f"split {args.split}"
    print(f"{len(cases)} runs of {len({n for n, _ in cases})} programs, {chosen}"
          f"{', CI sample' if args.sample else ''}; {len(skipped)} left out without a current certificate"
          f"{': ' + ', '.join(f'{n}/{r}' for n, r in skipped if _shown(n, args)) if skipped else ''}", flush=True)

    started = time.perf_counter()
    results = []
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        futures = [pool.submit(triage_one, n, r, args.cache, args.keep, args.speedups) for n, r in cases]
        for i, future in enumerate(futures, 1):
            result = future.result()
            results.append(result)
            print(f"[{i:3d}/{len(cases)}] " + (_row(result) if _shown(result.program, args) else "(held back)"),
                  flush=True)
    report(results, args)
    print(f"wall time {time.perf_counter() - started:.0f} s ({args.workers} worker(s))")
    write(results, args)


def write(results: list[Result], args) -> None:
    """--json: each split's figures and the rows that may be seen; --all-rows: every row."""
    if args.json:
        shown = [r for r in results if _shown(r.program, args)]
        figures = {split: summary([r for r in results if r.split == split]) for split in SPLITS}
        figures["every program"] = summary(results)
        for split, part in figures.items():
            if split != "tune" and not args.show_cases:
                part.pop("by_kind")
        body = {"date": time.strftime("%Y-%m-%d"), "triage_commit": _commit(), "summary": figures,
                "results": [asdict(r) | {"right": r.right} for r in sorted(shown, key=lambda r: (r.program, r.run))]}
        args.json.write_text(json.dumps(body, indent=1) + "\n")
        print(f"wrote {args.json}")
    if args.all_rows:
        args.all_rows.write_text(json.dumps({"results": [asdict(r) for r in results]}, indent=1) + "\n")
        print(f"wrote {args.all_rows} (every row, the held-back ones included: not to be read before their time)")


def _commit() -> str | None:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE)
    return done.stdout.strip() or None


def _shown(name: str, args) -> bool:
    return split_of(name) == "tune" or args.show_cases


def report(results: list[Result], args) -> None:
    """The figures: the tune split with its kinds, the held-back split as a whole, and both together."""
    for split in SPLITS:
        part = [r for r in results if r.split == split]
        if part:
            print_summary(summary(part), f"split {split}", per_kind=split == "tune" or args.show_cases)
    if len({r.split for r in results}) > 1:
        print_summary(summary(results), "every program", per_kind=args.show_cases)
    seconds = [r.seconds for r in results if r.seconds is not None]
    if seconds:
        print(f"\ntriage seconds per run: median {sorted(seconds)[len(seconds) // 2]:.0f}, max {max(seconds):.0f}")


def merge(files: list[Path], args) -> None:
    """Print the figures of runs triaged in several goes (each file written by --all-rows)."""
    results = {}
    for file in files:
        for row in json.loads(file.read_text())["results"]:
            results[(row["program"], row["run"])] = Result(**row)  # a later file's row replaces an earlier one
    for r in sorted(results.values(), key=lambda r: (r.program, r.run)):
        if _shown(r.program, args):
            print(_row(r))
    report(list(results.values()), args)
    write(list(results.values()), args)


if __name__ == "__main__":
    main()
