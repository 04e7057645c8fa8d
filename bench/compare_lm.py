#!/usr/bin/env python3
"""Runs bench_lm and its PyTorch re-creation (bench/torch_lm.py) side by side and prints the ratios.

    bench/compare_lm.py --bench build/release/bench/bench_lm [--config dense,trmoe,mha_trmoe] [--threads 1,2]
                        [--rounds 2] [--steps 10] [--warmup 2] [--vocab 256] [--gen-prompt 16] [--gen-new 240] [--gen-reps 3]
                        [--moe-eval grouped|masked] [--openblas-coretype auto] [--sizes "--hidden 64 ..."]
                        [--raw FILE] [--markdown]

First bench_lm writes the batches and every configuration's initial weights once (--dump-batches, --dump-weights,
--dump-only), so both sides train the same model on the same ids (their first losses are compared). Then for each
thread count, --rounds rounds run, in each round and for each configuration, a dea process and a torch process
one after the other (the order flips each round), each process one configuration alone (so its peak RSS is that
configuration's). Both get OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = the thread count and OMP_WAIT_POLICY=PASSIVE
(spinning OpenMP threads are very slow on a shared machine).

Output, one JSON line per (configuration, threads): each side's best (lowest) median s/step over the rounds and its
tokens/s, CPU s/step, phases, peak RSS (largest), generation tokens/s (best), dea's GEMM-yardstick fraction (best)
and torch's own GEMM speed; the ratios torch / dea of s/step (= dea tokens/s over torch tokens/s: above 1 dea is
faster), of CPU s/step, of the generation time and of the peak RSS (above 1 dea is smaller), the median of the
per-round ratios (the two processes of a round ran back to back), the first-loss difference, the length of the
common prefix of the generated ids, and the 1-minute load averages seen. Then per thread count the cost of each
TR-MoE configuration over dense on each side, (dense tokens/s / config tokens/s) - 1, from the best figures and
as the median over rounds; and per configuration the two-thread speed-up of each side. --raw FILE also writes every
line the programs printed; --sizes passes bench_lm size flags (--hidden, --heads, --layers, --seq, --batch, --ffn,
--routed, --experts, --top_k, --adapter_rank; torch_lm.py reads the sizes from the weights file); --markdown prints the tables of docs/performance.md at the end.

Needs Debian's python3-torch (and libopenblas0-pthread); run with /usr/bin/python3.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def run_json(cmd, env):
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"compare_lm: {' '.join(cmd)} failed with status {proc.returncode}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def load1():
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except OSError:
        return -1.0


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def common_prefix(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", required=True, help="path of the bench_lm program")
    ap.add_argument("--config", default="dense,trmoe,mha_trmoe")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--gen-prompt", type=int, default=16)
    ap.add_argument("--gen-new", type=int, default=240)
    ap.add_argument("--gen-reps", type=int, default=3)
    ap.add_argument("--moe-eval", choices=("grouped", "masked"), default="grouped")
    ap.add_argument("--openblas-coretype", default="auto", help="passed to torch_lm.py")
    ap.add_argument("--sizes", default="", help="size flags passed to bench_lm, e.g. '--layers 2 --seq 64'")
    ap.add_argument("--raw", help="also write every JSON line of the programs to this file")
    ap.add_argument("--markdown", action="store_true", help="print Markdown tables at the end")
    args = ap.parse_args()
    configs = [c for c in args.config.split(",") if c]
    threads = [int(t) for t in args.threads.split(",") if t]
    if not configs or not threads or args.rounds < 1:
        ap.error("--config and --threads need at least one entry, --rounds at least 1")
    common = ["--steps", str(args.steps), "--warmup", str(args.warmup)]
    sizes = shlex.split(args.sizes) + ["--vocab", str(args.vocab)]
    dea_extra = common + sizes + ["--gen_prompt", str(args.gen_prompt), "--gen_new", str(args.gen_new), "--gen_reps",
                                  str(args.gen_reps)]
    torch_extra = common + ["--gen-prompt", str(args.gen_prompt), "--gen-new", str(args.gen_new), "--gen-reps",
                            str(args.gen_reps), "--moe-eval",
                            args.moe_eval, "--openblas-coretype", args.openblas_coretype]
    raw = open(args.raw, "w") if args.raw else None
    results = {}  # (config, threads) -> summary
    per_round = {}  # (config, threads, side) -> list of (s_per_step) per round
    with tempfile.TemporaryDirectory(prefix="compare_lm_") as tmp:
        batches = os.path.join(tmp, "batches.jsonl")
        run_json([args.bench, "--config", ",".join(configs), "--dump-batches", batches, "--dump-weights", tmp,
                  "--dump-only"] + common + sizes, dict(os.environ))
        for th in threads:
            env = dict(os.environ, OMP_NUM_THREADS=str(th), OPENBLAS_NUM_THREADS=str(th), OMP_WAIT_POLICY="PASSIVE")
            best = {c: {"dea": {}, "torch": {}} for c in configs}
            loads = {c: [] for c in configs}
            for r in range(args.rounds):
                for config in configs:
                    dea_cmd = [args.bench, "--config", config, "--threads", str(th)] + dea_extra
                    torch_cmd = [sys.executable, os.path.join(HERE, "torch_lm.py"), "--weights",
                                 os.path.join(tmp, config + ".safetensors"), "--batches", batches, "--threads",
                                 str(th)] + torch_extra
                    order = [("dea", dea_cmd), ("torch", torch_cmd)]
                    for side, cmd in (order if r % 2 == 0 else order[::-1]):
                        print(f"[{config} threads={th} round {r + 1}/{args.rounds}] {side} (load {load1():.2f})",
                              file=sys.stderr, flush=True)
                        for line in run_json(cmd, env):
                            line["round"] = r + 1
                            if raw:
                                raw.write(json.dumps(line) + "\n")
                                raw.flush()
                            b = best[config][side]
                            if line["bench"] == "lm_train_step":
                                loads[config] += [line["load1_before"], line["load1_after"]]
                                per_round.setdefault((config, th, side), []).append(line["s_per_step"])
                                if line["s_per_step"] < b.get("s_per_step", 1e30):
                                    for key in ("s_per_step", "tokens_per_s", "phase_s", "achieved_gflops"):
                                        b[key] = line[key]
                                b["cpu_s_per_step"] = min(b.get("cpu_s_per_step", 1e30), line["cpu_s_per_step"])
                                b["peak_rss_mb"] = max(b.get("peak_rss_mb", 0), line["peak_rss_mb"])
                                for key in ("params", "first_loss", "gflop_per_step", "blas", "moe_eval"):
                                    if key in line:
                                        b[key] = line[key]
                                if side == "dea":
                                    b["yardstick_fraction"] = max(b.get("yardstick_fraction", 0),
                                                                  line["yardstick_fraction"])
                                    b["yardstick_gflops"] = max(b.get("yardstick_gflops", 0),
                                                                line["yardstick_gflops_before"]["all"],
                                                                line["yardstick_gflops_after"]["all"])
                                else:
                                    b["torch_gemm_gflops"] = max(b.get("torch_gemm_gflops", 0),
                                                                 line["torch_gemm_gflops_before"]["all"],
                                                                 line["torch_gemm_gflops_after"]["all"])
                            elif line["bench"] == "lm_generate":
                                per_round.setdefault((config, th, side, "gen"), []).append(line["s_total"])
                                if line["s_total"] < b.get("gen_s_total", 1e30):
                                    b["gen_s_total"] = line["s_total"]
                                    b["gen_tokens_per_s"] = round(line["tokens_per_s"], 1)
                                    b["gen_decode_tokens_per_s"] = round(line["decode_tokens_per_s"], 1)
                                    b["gen_ids"] = line["ids"]
                                b["gen_rss_mb"] = max(b.get("gen_rss_mb", 0), line["rss_mb"])
            for config in configs:
                d, t = best[config]["dea"], best[config]["torch"]
                paired = [ts / ds for ds, ts in zip(per_round[(config, th, "dea")], per_round[(config, th, "torch")])]
                out = {"config": config, "threads": th, "steps": args.steps, "rounds": args.rounds,
                       "vocab": args.vocab, "load1_min": min(loads[config]), "load1_max": max(loads[config]),
                       "torch_over_dea": {
                           "s_per_step": round(t["s_per_step"] / d["s_per_step"], 3),
                           "s_per_step_paired_median": round(median(paired), 3),
                           "cpu_s_per_step": round(t["cpu_s_per_step"] / d["cpu_s_per_step"], 3),
                           "peak_rss_mb": round(t["peak_rss_mb"] / d["peak_rss_mb"], 3)},
                       "first_loss_diff": abs(d["first_loss"] - t["first_loss"])}
                if "gen_s_total" in d and "gen_s_total" in t:
                    out["torch_over_dea"]["generate_s"] = round(t["gen_s_total"] / d["gen_s_total"], 3)
                    out["gen_ids_common_prefix"] = common_prefix(d["gen_ids"], t["gen_ids"])
                for side in (d, t):
                    side.pop("gen_ids", None)
                out["dea"], out["torch"] = d, t
                results[(config, th)] = out
                print(json.dumps(out), flush=True)
            if "dense" in configs:
                cost = {"threads": th, "moe_cost_over_dense": {}}
                for config in configs:
                    if config == "dense":
                        continue
                    entry = {}
                    for side in ("dea", "torch"):
                        bd, bc = best["dense"][side], best[config][side]
                        rd = per_round[("dense", th, side)]
                        rc = per_round[(config, th, side)]
                        entry[side] = {"best": round(bd["tokens_per_s"] / bc["tokens_per_s"] - 1, 3),
                                       "round_median": round(median([c / dd for dd, c in zip(rd, rc)]) - 1, 3)}
                    cost["moe_cost_over_dense"][config] = entry
                    results[("cost", config, th)] = entry
                print(json.dumps(cost), flush=True)
        for config in configs:
            if 1 in threads and 2 in threads:
                sp = {side: round(results[(config, 1)][side]["s_per_step"] / results[(config, 2)][side]["s_per_step"], 2)
                      for side in ("dea", "torch")}
                results[("speedup", config)] = sp
                print(json.dumps({"config": config, "two_thread_speedup": sp}), flush=True)
    if raw:
        raw.close()
    if args.markdown:
        print_markdown(results, configs, threads)


def print_markdown(results, configs, threads):
    print("\n| config | threads | dea tok/s | torch tok/s | dea / torch (best) | paired median | dea yardstick "
          "fraction | dea GEMM GFLOP/s | dea phases f / b / o (s) | torch phases f / b / o (s) | peak RSS dea / "
          "torch (MB) | load |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|---|")
    for th in threads:
        for c in configs:
            o = results[(c, th)]
            d, t, r = o["dea"], o["torch"], o["torch_over_dea"]
            ph = lambda p: " / ".join(f"{p[k]:.2f}" for k in ("forward", "backward", "optim"))  # noqa: E731
            print(f"| {c} | {th} | {d['tokens_per_s']:.0f} | {t['tokens_per_s']:.0f} | {r['s_per_step']:.2f}x | "
                  f"{r['s_per_step_paired_median']:.2f}x | {d['yardstick_fraction']:.2f} | "
                  f"{d['yardstick_gflops']:.0f} | {ph(d['phase_s'])} | {ph(t['phase_s'])} | "
                  f"{d['peak_rss_mb']:.0f} / {t['peak_rss_mb']:.0f} | {o['load1_min']:.1f}-{o['load1_max']:.1f} |")
    print("\n| config | threads | dea gen tok/s | torch gen tok/s | dea / torch | common prefix of the ids |")
    print("|---|---:|---:|---:|---:|---:|")
    for th in threads:
        for c in configs:
            o = results[(c, th)]
            if "generate_s" not in o["torch_over_dea"]:
                continue
            print(f"| {c} | {th} | {o['dea']['gen_tokens_per_s']:.0f} | {o['torch']['gen_tokens_per_s']:.0f} | "
                  f"{o['torch_over_dea']['generate_s']:.2f}x | {o['gen_ids_common_prefix']} |")
    if "dense" in configs:
        print("\n| config | threads | dea cost over dense (best / round median) | torch cost over dense |")
        print("|---|---:|---:|---:|")
        for th in threads:
            for c in configs:
                if c == "dense":
                    continue
                e = results[("cost", c, th)]
                print(f"| {c} | {th} | {100 * e['dea']['best']:+.1f} % / {100 * e['dea']['round_median']:+.1f} % | "
                      f"{100 * e['torch']['best']:+.1f} % / {100 * e['torch']['round_median']:+.1f} % |")


if __name__ == "__main__":
    main()
