#!/usr/bin/env python3
"""Runs bench_train and the PyTorch re-creation (bench/torch_train.py) side by side and prints the ratios.

    bench/compare_train.py --bench build/release/bench/bench_train [--config quick,mid,paper] [--threads 1,2]
                           [--rounds 2] [--steps 10] [--warmup 2] [--openblas-coretype auto|native|NAME]
                           [--precision fp32|bf16|fp32,bf16]

For each configuration the D_alpha training batches are written once (bench_train --dump-batches --dump-only), so
both sides train on the same tokens. Then for each thread count, --rounds rounds alternate a dea process and a
torch process (the order flips each round), each running --warmup + --steps steps of that configuration alone,
so both see the same machine state and each peak RSS is that of one configuration. Per side it keeps the best
median s/step and CPU s/step over the rounds and the largest peak RSS. Output: one JSON line per (configuration,
threads) with both sides, the 1-minute load averages seen, and the ratios torch / dea (above 1: dea is faster or
smaller); then one line per configuration with each side's two-thread speed-up when --threads has 1 and 2. The
reference's own s/step as recorded with the reference implementation (quick 0.194 s on 2 threads, mid 0.876 s and
paper 7.4 s on 1 thread, on an idle machine) is printed next to dea's figure for that thread count.

--precision lists the precisions to run (default fp32), each in every round: for bf16 bench_train runs with
--precision bf16 (dea's bf16 products) and torch_train.py under torch.autocast("cpu", dtype=torch.bfloat16). The
lines are then per (configuration, precision, threads), and with both precisions one more line per (configuration,
threads) compares dea bf16 with dea fp32 and with PyTorch bf16 (speed, peak RSS); --markdown prints that table.

Needs Debian's python3-torch (and libopenblas0-pthread, or torch runs on a slow reference BLAS); run with
/usr/bin/python3. Both sides get OMP_WAIT_POLICY=PASSIVE (spinning OpenMP threads slow two-thread runs 5-20x on a
shared machine) and OMP_NUM_THREADS / OPENBLAS_NUM_THREADS = the thread count. torch_train.py replaces OpenBLAS's
fallback kernels on a CPU it does not recognise (see its --openblas-coretype); the kernels used are reported
under torch.blas.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
# the reference's train.py, s/step and peak RSS (GB) as recorded with the reference: (threads, s/step, GB)
REFERENCE = {"quick": (2, 0.194, 0.47), "mid": (1, 0.876, 1.68), "paper": (1, 7.4, 4.4)}


def run_json(cmd, env):
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"compare_train: {' '.join(cmd)} failed with status {proc.returncode}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def load1():
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except OSError:
        return -1.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", required=True, help="path of the bench_train program")
    ap.add_argument("--config", default="quick,mid,paper")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--gamma", type=float, default=0.5)
    ap.add_argument("--openblas-coretype", default="auto", help="passed to torch_train.py (auto, native or a core name)")
    ap.add_argument("--precision", default="fp32", help="fp32, bf16 or both (fp32,bf16)")
    ap.add_argument("--markdown", action="store_true", help="print the bf16 comparison as a Markdown table at the end")
    args = ap.parse_args()
    precisions = [p for p in args.precision.split(",") if p]
    if not precisions or any(p not in ("fp32", "bf16") for p in precisions) or len(set(precisions)) < len(precisions):
        ap.error(f"--precision: expected fp32, bf16 or fp32,bf16, got {args.precision!r}")
    configs = [c for c in args.config.split(",") if c]
    threads = [int(t) for t in args.threads.split(",") if t]
    common = ["--steps", str(args.steps), "--warmup", str(args.warmup), "--gamma", str(args.gamma)]
    rows = []  # (config, threads, fp32 best, bf16 best, comparison) for --markdown
    with tempfile.TemporaryDirectory(prefix="compare_train_") as tmp:
        for config in configs:
            batches = os.path.join(tmp, config + ".jsonl")
            run_json([args.bench, "--config", config, "--dump-only", "--dump-batches", batches] + common, dict(os.environ))
            per_threads = {}
            for th in threads:
                env = dict(os.environ, OMP_NUM_THREADS=str(th), OPENBLAS_NUM_THREADS=str(th), OMP_WAIT_POLICY="PASSIVE")
                best = {p: {"dea": {}, "torch": {}} for p in precisions}
                loads = {p: [] for p in precisions}
                for r in range(args.rounds):
                    for prec in precisions:
                        dea_cmd = [args.bench, "--config", config, "--threads", str(th), "--precision", prec] + common
                        torch_cmd = [sys.executable, os.path.join(HERE, "torch_train.py"), "--batches", batches,
                                     "--threads", str(th), "--openblas-coretype", args.openblas_coretype,
                                     "--precision", prec] + common
                        order = [("dea", dea_cmd), ("torch", torch_cmd)]
                        for side, cmd in (order if r % 2 == 0 else order[::-1]):
                            print(f"[{config} {prec} threads={th} round {r + 1}/{args.rounds}] {side} "
                                  f"(load {load1():.1f})", file=sys.stderr, flush=True)
                            for line in run_json(cmd, env):
                                b = best[prec][side]
                                loads[prec] += [line["load1_before"], line["load1_after"]]
                                for key in ("s_per_step", "cpu_s_per_step"):
                                    b[key] = min(b.get(key, 1e30), line[key])
                                b["peak_rss_mb"] = max(b.get("peak_rss_mb", 0), line["peak_rss_mb"])
                                for key in ("params", "mean_T", "first_task_loss", "first_loss_gate",
                                            "peak_rss_step1_mb", "blas"):
                                    if key in line:
                                        b[key] = line[key]
                                if b["s_per_step"] == line["s_per_step"]:
                                    b["phase_s"] = line["phase_s"]
                for prec in precisions:
                    bp = best[prec]
                    for b in bp.values():
                        b["examples_per_s"] = round(BATCH[config] / b["s_per_step"], 1)
                    ratios = {k: round(bp["torch"][k] / bp["dea"][k], 2) for k in ("s_per_step", "cpu_s_per_step",
                                                                                 "peak_rss_mb")}
                    out = {"config": config, "precision": prec, "threads": th, "steps": args.steps,
                           "rounds": args.rounds, "load1_min": min(loads[prec]), "load1_max": max(loads[prec]),
                           "dea": bp["dea"], "torch": bp["torch"], "torch_over_dea": ratios}
                    ref_threads, ref_s, ref_gb = REFERENCE[config]
                    if th == ref_threads and prec == "fp32":
                        out["reference_recorded"] = {"threads": ref_threads, "s_per_step": ref_s, "peak_rss_gb": ref_gb,
                                                     "reference_over_dea": round(ref_s / bp["dea"]["s_per_step"], 2)}
                    print(json.dumps(out), flush=True)
                if "fp32" in precisions and "bf16" in precisions:
                    f, h = best["fp32"], best["bf16"]
                    cmp = {"config": config, "threads": th, "bf16": {
                        "dea_bf16_over_dea_fp32": {"speed": round(f["dea"]["s_per_step"] / h["dea"]["s_per_step"], 3),
                                                   "cpu_time": round(f["dea"]["cpu_s_per_step"] /
                                                                     h["dea"]["cpu_s_per_step"], 3),
                                                   "peak_rss": round(h["dea"]["peak_rss_mb"] / f["dea"]["peak_rss_mb"],
                                                                     3)},
                        "dea_bf16_over_torch_bf16": {
                            "speed": round(h["torch"]["s_per_step"] / h["dea"]["s_per_step"], 3),
                            "cpu_time": round(h["torch"]["cpu_s_per_step"] / h["dea"]["cpu_s_per_step"], 3),
                            "peak_rss": round(h["dea"]["peak_rss_mb"] / h["torch"]["peak_rss_mb"], 3)},
                        "torch_bf16_over_torch_fp32": {
                            "speed": round(f["torch"]["s_per_step"] / h["torch"]["s_per_step"], 3)},
                        "first_task_loss_bf16_minus_fp32": {
                            side: h[side]["first_task_loss"] - f[side]["first_task_loss"]
                            for side in ("dea", "torch")}}}
                    print(json.dumps(cmp), flush=True)
                    rows.append((config, th, f, h, cmp["bf16"]))
                per_threads[th] = best
            if 1 in per_threads and 2 in per_threads:
                for prec in precisions:
                    print(json.dumps({"config": config, "precision": prec, "two_thread_speedup": {
                        side: round(per_threads[1][prec][side]["s_per_step"] / per_threads[2][prec][side]["s_per_step"],
                                    2) for side in ("dea", "torch")}}), flush=True)
    if args.markdown and rows:
        print("\n| configuration | threads | dea fp32 s/step | dea bf16 s/step | PyTorch bf16 s/step | "
              "dea bf16 / dea fp32 | dea bf16 / PyTorch bf16 | peak RSS dea bf16 / PyTorch bf16 |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for config, th, f, h, x in rows:
            print(f"| {config} | {th} | {f['dea']['s_per_step']:.3g} | {h['dea']['s_per_step']:.3g} | "
                  f"{h['torch']['s_per_step']:.3g} | {x['dea_bf16_over_dea_fp32']['speed']:.2f}x | "
                  f"{x['dea_bf16_over_torch_bf16']['speed']:.2f}x | "
                  f"{h['dea']['peak_rss_mb']:.0f} MB / {h['torch']['peak_rss_mb']:.0f} MB |")

BATCH = {"quick": 32, "mid": 64, "paper": 128}

if __name__ == "__main__":
    main()
