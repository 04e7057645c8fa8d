#!/usr/bin/env python3
"""Runs bench_dea and the PyTorch anchor (bench/torch_dea.py) side by side and prints the ratios.

    bench/compare_anchor.py --bench build/release/bench/bench_dea [--shape 32x128x512x8 ...] [--threads 2]
                            [--rounds 2] [--reps 3] [--kernel tiled|reference]

Each (shape, threads) pair runs in fresh processes, alternating dea and torch for --rounds rounds, so both see
the same machine state; the best time of each side is kept (as the anchor reports its best of --reps). Output:
one JSON line per shape with both sides' forward and training-step times, peak RSS, and the ratios
torch / dea (above 1: dea is faster or smaller). Needs Debian's python3-torch (and libopenblas0-pthread, or torch
runs on a slow reference BLAS); run with /usr/bin/python3.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run_json(cmd, env):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", required=True, help="path of the bench_dea program")
    ap.add_argument("--shape", action="append", default=[], help="BxTxDxH, repeatable (default 32x128x512x8)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--kernel", default="tiled", choices=["tiled", "reference"],
                    help="DualExpertAttention kernel that bench_dea times (default tiled)")
    args = ap.parse_args()
    shapes = args.shape or ["32x128x512x8"]
    # passive waiting: spinning OpenMP threads slow 2-thread runs 5-20x on a shared machine (both sides get it)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS=str(args.threads),
               OMP_WAIT_POLICY="PASSIVE")
    for shape in shapes:
        best = {"dea": {}, "torch": {}}
        for _ in range(args.rounds):
            for line in run_json([args.bench, "--shape", shape, "--threads", str(args.threads), "--reps",
                                  str(args.reps), "--sizes", "fixed" if shape.endswith("x512x8") else "dynamic",
                                  "--kernel", args.kernel, "--no-yardstick"], env):
                if line["bench"] not in ("dea_forward", "dea_train_step"):
                    continue  # the kernel-agreement line
                key = "forward_ms" if line["bench"] == "dea_forward" else "train_step_ms"
                best["dea"][key] = min(best["dea"].get(key, 1e30), line["ms"])
                best["dea"]["peak_rss_mb"] = max(best["dea"].get("peak_rss_mb", 0), line["peak_rss_mb"])
            for line in run_json([sys.executable, os.path.join(HERE, "torch_dea.py"), "bench", "--threads",
                                  str(args.threads), "--shape", shape, "--reps", str(args.reps)], env):
                for key in ("forward_ms", "train_step_ms"):
                    best["torch"][key] = min(best["torch"].get(key, 1e30), line[key])
                best["torch"]["peak_rss_mb"] = max(best["torch"].get("peak_rss_mb", 0), line["peak_rss_mb"])
        ratios = {k: round(best["torch"][k] / best["dea"][k], 2) for k in ("forward_ms", "train_step_ms", "peak_rss_mb")
                  if best["dea"].get(k) and best["torch"].get(k)}
        print(json.dumps({"shape": shape, "threads": args.threads, "dea": best["dea"], "torch": best["torch"],
                          "torch_over_dea": ratios}), flush=True)


if __name__ == "__main__":
    main()
