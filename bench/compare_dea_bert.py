#!/usr/bin/env python3
"""Runs bench_dea_bert and its PyTorch side (bench/torch_dea_bert.py) alternately and prints the ratios.

    bench/compare_dea_bert.py --bench build/release/bench/bench_dea_bert [--config base|tiny] [--threads 1,2]
                              [--rounds 2] [--steps 3] [--warmup 1] [--openblas-coretype auto|native|NAME]
                              [--precision fp32|bf16|fp32,bf16]

For each thread count, --rounds rounds alternate a dea process and a torch process (the order flips each round),
each running --warmup + --steps steps of one thread count alone, so both see the same machine state and each peak
RSS is that of one run. Per side it keeps the best median s/step over the rounds (with its phases), the largest
peak RSS and dea's yardstick of each round. Output: one JSON line per thread count with both sides, the 1-minute
load averages seen, the ratios torch / dea (above 1: dea is faster or smaller) and each side's step GFLOP/s as a
fraction of dea's same-run GEMM yardstick (the median of the rounds' yardsticks); then, with --threads 1,2, one line
with each side's two-thread speed-up; then a Markdown table of the lines.

--precision lists the precisions to run (default fp32), each in every round: for bf16 bench_dea_bert runs with
--precision bf16 (dea's bf16 products) and torch_dea_bert.py under torch.autocast("cpu", dtype=torch.bfloat16).
The lines and the table are then per (precision, thread count), and with both precisions one more line per thread
count (and a second table) compares dea bf16 with dea fp32 and with PyTorch bf16 (speed, peak RSS).

Both sides get OMP_WAIT_POLICY=PASSIVE and OMP_NUM_THREADS / OPENBLAS_NUM_THREADS = the thread count. Needs
Debian's python3-torch and libopenblas0-pthread; run with /usr/bin/python3.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run_json(cmd, env):
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"compare_dea_bert: {' '.join(cmd)} failed with status {proc.returncode}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def load1():
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except OSError:
        return -1.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", required=True, help="path of the bench_dea_bert program")
    ap.add_argument("--config", default="base", choices=["base", "tiny"])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--openblas-coretype", default="auto", help="passed to torch_dea_bert.py")
    ap.add_argument("--precision", default="fp32", help="fp32, bf16 or both (fp32,bf16)")
    args = ap.parse_args()
    threads = [int(t) for t in args.threads.split(",") if t]
    precisions = [p for p in args.precision.split(",") if p]
    if not precisions or any(p not in ("fp32", "bf16") for p in precisions) or len(set(precisions)) < len(precisions):
        ap.error(f"--precision: expected fp32, bf16 or fp32,bf16, got {args.precision!r}")
    common = ["--config", args.config, "--steps", str(args.steps), "--warmup", str(args.warmup)]
    results = {}
    for th in threads:
        env = dict(os.environ, OMP_NUM_THREADS=str(th), OPENBLAS_NUM_THREADS=str(th), OMP_WAIT_POLICY="PASSIVE")
        best = {p: {"dea": {}, "torch": {}} for p in precisions}
        loads, yards = {p: [] for p in precisions}, {p: [] for p in precisions}
        for r in range(args.rounds):
            for prec in precisions:
                cmds = {"dea": [args.bench, "--threads", str(th), "--precision", prec] + common,
                        "torch": [sys.executable, os.path.join(HERE, "torch_dea_bert.py"), "--threads", str(th),
                                  "--openblas-coretype", args.openblas_coretype, "--precision", prec] + common}
                order = ["dea", "torch"] if r % 2 == 0 else ["torch", "dea"]
                for side in order:
                    print(f"[{args.config} {prec} threads={th} round {r + 1}/{args.rounds}] {side} "
                          f"(load {load1():.2f})", file=sys.stderr, flush=True)
                    for line in run_json(cmds[side], env):
                        b = best[prec][side]
                        loads[prec] += [line["load1_before"], line["load1_after"]]
                        if side == "dea":
                            yards[prec].append(line["yardstick_gflops"])
                        if line["s_per_step"] < b.get("s_per_step", 1e30):
                            for key in ("s_per_step", "cpu_s_per_step", "phase_s", "gflops", "peak_fraction"):
                                if key in line:
                                    b[key] = line[key]
                        b["peak_rss_mb"] = max(b.get("peak_rss_mb", 0), line["peak_rss_mb"])
                        b.setdefault("s_per_step_rounds", []).append(round(line["s_per_step"], 3))
                        for key in ("params", "gflop", "first_task_loss", "first_loss_gate", "blas", "peak_gflops"):
                            if key in line:
                                b[key] = line[key]
        for prec in precisions:
            yard = statistics.median(yards[prec])
            bp = best[prec]
            out = {"config": args.config, "precision": prec, "threads": th, "steps": args.steps,
                   "warmup": args.warmup, "rounds": args.rounds, "load1_min": min(loads[prec]),
                   "load1_max": max(loads[prec]), "yardstick_gflops": round(yard, 1),
                   "yardstick_rounds": [round(y, 1) for y in yards[prec]],
                   "dea": bp["dea"], "torch": bp["torch"],
                   "torch_over_dea": {k: round(bp["torch"][k] / bp["dea"][k], 2) for k in ("s_per_step",
                                                                                         "cpu_s_per_step",
                                                                                         "peak_rss_mb")},
                   "frac_yardstick": {side: round(bp[side]["gflops"] / yard, 3) for side in ("dea", "torch")}}
            print(json.dumps(out), flush=True)
            results[(th, prec)] = out
        if "fp32" in precisions and "bf16" in precisions:
            f, h = results[(th, "fp32")], results[(th, "bf16")]
            cmp = {"config": args.config, "threads": th, "bf16": {
                "dea_bf16_over_dea_fp32": {"speed": round(f["dea"]["s_per_step"] / h["dea"]["s_per_step"], 3),
                                           "cpu_time": round(f["dea"]["cpu_s_per_step"] /
                                                             h["dea"]["cpu_s_per_step"], 3),
                                           "peak_rss": round(h["dea"]["peak_rss_mb"] / f["dea"]["peak_rss_mb"], 3)},
                "dea_bf16_over_torch_bf16": {"speed": h["torch_over_dea"]["s_per_step"],
                                             "cpu_time": h["torch_over_dea"]["cpu_s_per_step"],
                                             "peak_rss": round(h["dea"]["peak_rss_mb"] / h["torch"]["peak_rss_mb"], 3)},
                "torch_bf16_over_torch_fp32": {"speed": round(f["torch"]["s_per_step"] / h["torch"]["s_per_step"], 3)}}}
            results[(th, "cmp")] = cmp["bf16"]
            print(json.dumps(cmp), flush=True)
    for prec in precisions:
        if (1, prec) in results and (2, prec) in results:
            print(json.dumps({"config": args.config, "precision": prec, "two_thread_speedup": {
                side: round(results[(1, prec)][side]["s_per_step"] / results[(2, prec)][side]["s_per_step"], 2)
                for side in ("dea", "torch")}}), flush=True)
    print("\n| precision | threads | dea s/step | PyTorch s/step | PyTorch / dea | step GFLOP/s, dea / PyTorch "
          "| yardstick GFLOP/s | step / yardstick, dea / PyTorch | peak RSS dea / PyTorch | load |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for prec in precisions:
        for th in threads:
            o = results[(th, prec)]
            d, t = o["dea"], o["torch"]
            print(f"| {prec} | {th} | {d['s_per_step']:.2f} | {t['s_per_step']:.2f} "
                  f"| {o['torch_over_dea']['s_per_step']:.2f} "
                  f"| {d['gflops']:.1f} / {t['gflops']:.1f} | {o['yardstick_gflops']:.1f} "
                  f"| {o['frac_yardstick']['dea']:.2f} / {o['frac_yardstick']['torch']:.2f} "
                  f"| {d['peak_rss_mb'] / 1024:.2f} / {t['peak_rss_mb'] / 1024:.2f} GB "
                  f"| {o['load1_min']:.1f}–{o['load1_max']:.1f} |")
    if "fp32" in precisions and "bf16" in precisions:
        print("\n| threads | dea fp32 s/step | dea bf16 s/step | PyTorch bf16 s/step | dea bf16 / dea fp32 "
              "| dea bf16 / PyTorch bf16 | dea bf16 of the bf16 peak | peak RSS dea bf16 / PyTorch bf16 |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for th in threads:
            f, h, x = results[(th, "fp32")], results[(th, "bf16")], results[(th, "cmp")]
            print(f"| {th} | {f['dea']['s_per_step']:.2f} | {h['dea']['s_per_step']:.2f} "
                  f"| {h['torch']['s_per_step']:.2f} | {x['dea_bf16_over_dea_fp32']['speed']:.2f}x "
                  f"| {x['dea_bf16_over_torch_bf16']['speed']:.2f}x | {h['dea'].get('peak_fraction', 0):.2f} "
                  f"| {h['dea']['peak_rss_mb'] / 1024:.2f} / {h['torch']['peak_rss_mb'] / 1024:.2f} GB |")


if __name__ == "__main__":
    main()
