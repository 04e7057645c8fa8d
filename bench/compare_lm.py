#!/usr/bin/env python3
"""Runs bench_lm and its PyTorch re-creation (bench/torch_lm.py) side by side and prints the ratios.

    bench/compare_lm.py --bench build/release/bench/bench_lm [--config dense,trmoe,mha_trmoe] [--threads 1,2]
                        [--rounds 2] [--steps 10] [--warmup 2] [--vocab 256] [--gen-prompt 16] [--gen-new 240] [--gen-reps 3]
                        [--moe-eval grouped|masked] [--openblas-coretype auto] [--sizes "--hidden 64 ..."]
                        [--precision fp32|bf16|fp32,bf16] [--raw FILE] [--markdown]

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

--precision lists the precisions to run (default fp32): for bf16, bench_lm runs with --precision bf16 (dea's bf16
products) and torch_lm.py under torch.autocast("cpu", dtype=torch.bfloat16); every precision runs in every round,
next to the others, so their figures share the machine's state. Every line above is then per (configuration,
precision, threads), and with both precisions one more line per (configuration, threads) compares them:
dea bf16 against dea fp32 and against torch bf16 (training speed, generation speed, peak RSS); --markdown adds
their table.

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
    ap.add_argument("--precision", default="fp32", help="fp32, bf16 or both (fp32,bf16)")
    ap.add_argument("--raw", help="also write every JSON line of the programs to this file")
    ap.add_argument("--markdown", action="store_true", help="print Markdown tables at the end")
    args = ap.parse_args()
    configs = [c for c in args.config.split(",") if c]
    threads = [int(t) for t in args.threads.split(",") if t]
    precisions = [p for p in args.precision.split(",") if p]
    if not configs or not threads or args.rounds < 1:
        ap.error("--config and --threads need at least one entry, --rounds at least 1")
    if not precisions or any(p not in ("fp32", "bf16") for p in precisions) or len(set(precisions)) < len(precisions):
        ap.error(f"--precision: expected fp32, bf16 or fp32,bf16, got {args.precision!r}")
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
            variants = [(c, p) for c in configs for p in precisions]
            best = {v: {"dea": {}, "torch": {}} for v in variants}
            loads = {v: [] for v in variants}
            for r in range(args.rounds):
                for config, prec in variants:
                    dea_cmd = [args.bench, "--config", config, "--threads", str(th), "--precision", prec] + dea_extra
                    torch_cmd = [sys.executable, os.path.join(HERE, "torch_lm.py"), "--weights",
                                 os.path.join(tmp, config + ".safetensors"), "--batches", batches, "--threads",
                                 str(th), "--precision", prec] + torch_extra
                    order = [("dea", dea_cmd), ("torch", torch_cmd)]
                    for side, cmd in (order if r % 2 == 0 else order[::-1]):
                        print(f"[{config} {prec} threads={th} round {r + 1}/{args.rounds}] {side} (load {load1():.2f})",
                              file=sys.stderr, flush=True)
                        for line in run_json(cmd, env):
                            line["round"] = r + 1
                            if raw:
                                raw.write(json.dumps(line) + "\n")
                                raw.flush()
                            b = best[(config, prec)][side]
                            if line["bench"] == "lm_train_step":
                                loads[(config, prec)] += [line["load1_before"], line["load1_after"]]
                                per_round.setdefault((config, prec, th, side), []).append(line["s_per_step"])
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
                                    b["peak_fraction"] = max(b.get("peak_fraction", 0), line.get("peak_fraction", 0))
                                else:
                                    b["torch_gemm_gflops"] = max(b.get("torch_gemm_gflops", 0),
                                                                 line["torch_gemm_gflops_before"]["all"],
                                                                 line["torch_gemm_gflops_after"]["all"])
                            elif line["bench"] == "lm_generate":
                                per_round.setdefault((config, prec, th, side, "gen"), []).append(line["s_total"])
                                if line["s_total"] < b.get("gen_s_total", 1e30):
                                    b["gen_s_total"] = line["s_total"]
                                    b["gen_tokens_per_s"] = round(line["tokens_per_s"], 1)
                                    b["gen_decode_tokens_per_s"] = round(line["decode_tokens_per_s"], 1)
                                    b["gen_ids"] = line["ids"]
                                b["gen_rss_mb"] = max(b.get("gen_rss_mb", 0), line["rss_mb"])
            for config, prec in variants:
                d, t = best[(config, prec)]["dea"], best[(config, prec)]["torch"]
                paired = [ts / ds for ds, ts in zip(per_round[(config, prec, th, "dea")],
                                                    per_round[(config, prec, th, "torch")])]
                lv = loads[(config, prec)]
                out = {"config": config, "precision": prec, "threads": th, "steps": args.steps, "rounds": args.rounds,
                       "vocab": args.vocab, "load1_min": min(lv), "load1_max": max(lv),
                       "torch_over_dea": {
                           "s_per_step": round(t["s_per_step"] / d["s_per_step"], 3),
                           "s_per_step_paired_median": round(median(paired), 3),
                           "cpu_s_per_step": round(t["cpu_s_per_step"] / d["cpu_s_per_step"], 3),
                           "peak_rss_mb": round(t["peak_rss_mb"] / d["peak_rss_mb"], 3)},
                       "first_loss_diff": abs(d["first_loss"] - t["first_loss"])}
                if "gen_s_total" in d and "gen_s_total" in t:
                    out["torch_over_dea"]["generate_s"] = round(t["gen_s_total"] / d["gen_s_total"], 3)
                    out["gen_ids_common_prefix"] = common_prefix(d["gen_ids"], t["gen_ids"])
                out["dea"], out["torch"] = d, t
                results[(config, prec, th)] = out
            for config, prec in variants:
                out = results[(config, prec, th)]
                print(json.dumps({k: ({kk: vv for kk, vv in v.items() if kk != "gen_ids"} if k in ("dea", "torch")
                                      else v) for k, v in out.items()}), flush=True)
            if "fp32" in precisions and "bf16" in precisions:
                for config in configs:
                    f, h = results[(config, "fp32", th)], results[(config, "bf16", th)]
                    cmp = {"config": config, "threads": th, "bf16": {
                        "dea_bf16_over_dea_fp32": {
                            "speed": round(f["dea"]["s_per_step"] / h["dea"]["s_per_step"], 3),
                            "speed_paired_median": round(median(
                                [a / b for a, b in zip(per_round[(config, "fp32", th, "dea")],
                                                       per_round[(config, "bf16", th, "dea")])]), 3),
                            "cpu_time": round(f["dea"]["cpu_s_per_step"] / h["dea"]["cpu_s_per_step"], 3),
                            "peak_rss": round(h["dea"]["peak_rss_mb"] / f["dea"]["peak_rss_mb"], 3)},
                        "dea_bf16_over_torch_bf16": {
                            "speed": h["torch_over_dea"]["s_per_step"],
                            "speed_paired_median": h["torch_over_dea"]["s_per_step_paired_median"],
                            "cpu_time": h["torch_over_dea"]["cpu_s_per_step"],
                            "peak_rss": round(h["dea"]["peak_rss_mb"] / h["torch"]["peak_rss_mb"], 3)},
                        "torch_bf16_over_torch_fp32": {
                            "speed": round(f["torch"]["s_per_step"] / h["torch"]["s_per_step"], 3)},
                        "first_loss_bf16_minus_fp32": {
                            "dea": h["dea"]["first_loss"] - f["dea"]["first_loss"],
                            "torch": h["torch"]["first_loss"] - f["torch"]["first_loss"]}}}
                    if "gen_s_total" in f["dea"] and "gen_s_total" in h["dea"] and "gen_s_total" in h["torch"]:
                        cmp["bf16"]["generate"] = {
                            "dea_bf16_over_dea_fp32": round(f["dea"]["gen_s_total"] / h["dea"]["gen_s_total"], 3),
                            "dea_bf16_over_torch_bf16": round(h["torch"]["gen_s_total"] / h["dea"]["gen_s_total"], 3),
                            "ids_common_prefix_dea_bf16_fp32": common_prefix(h["dea"]["gen_ids"], f["dea"]["gen_ids"])}
                    results[("bf16", config, th)] = cmp["bf16"]
                    print(json.dumps(cmp), flush=True)
            for prec in precisions:
                if "dense" not in configs:
                    break
                cost = {"threads": th, "precision": prec, "moe_cost_over_dense": {}}
                for config in configs:
                    if config == "dense":
                        continue
                    entry = {}
                    for side in ("dea", "torch"):
                        bd, bc = best[("dense", prec)][side], best[(config, prec)][side]
                        rd = per_round[("dense", prec, th, side)]
                        rc = per_round[(config, prec, th, side)]
                        entry[side] = {"best": round(bd["tokens_per_s"] / bc["tokens_per_s"] - 1, 3),
                                       "round_median": round(median([c / dd for dd, c in zip(rd, rc)]) - 1, 3)}
                    cost["moe_cost_over_dense"][config] = entry
                    results[("cost", config, prec, th)] = entry
                print(json.dumps(cost), flush=True)
        for config in configs:
            for prec in precisions:
                if 1 in threads and 2 in threads:
                    sp = {side: round(results[(config, prec, 1)][side]["s_per_step"] /
                                      results[(config, prec, 2)][side]["s_per_step"], 2) for side in ("dea", "torch")}
                    results[("speedup", config, prec)] = sp
                    print(json.dumps({"config": config, "precision": prec, "two_thread_speedup": sp}), flush=True)
    if raw:
        raw.close()
    if args.markdown:
        print_markdown(results, configs, threads, precisions)


def print_markdown(results, configs, threads, precisions):
    for prec in precisions:
        print(f"\n{prec}:")
        print_markdown_precision(results, configs, threads, prec)
    if "fp32" in precisions and "bf16" in precisions:
        print("\n| config | threads | dea fp32 tok/s | dea bf16 tok/s | torch bf16 tok/s | dea bf16 / dea fp32 | "
              "dea bf16 / torch bf16 | dea bf16 of the bf16 peak | peak RSS dea bf16 / torch bf16 (MB) |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
        for th in threads:
            for c in configs:
                f, h, x = results[(c, "fp32", th)], results[(c, "bf16", th)], results[("bf16", c, th)]
                print(f"| {c} | {th} | {f['dea']['tokens_per_s']:.0f} | {h['dea']['tokens_per_s']:.0f} | "
                      f"{h['torch']['tokens_per_s']:.0f} | {x['dea_bf16_over_dea_fp32']['speed']:.2f}x | "
                      f"{x['dea_bf16_over_torch_bf16']['speed']:.2f}x | {h['dea'].get('peak_fraction', 0):.2f} | "
                      f"{h['dea']['peak_rss_mb']:.0f} / {h['torch']['peak_rss_mb']:.0f} |")
        if all("generate" in results[("bf16", c, th)] for th in threads for c in configs):
            print("\n| config | threads | dea fp32 gen tok/s | dea bf16 gen tok/s | torch fp32 gen tok/s | "
                  "torch bf16 gen tok/s | dea bf16 / dea fp32 | dea bf16 / torch bf16 |")
            print("|---|---:|---:|---:|---:|---:|---:|---:|")
            for th in threads:
                for c in configs:
                    f, h, x = results[(c, "fp32", th)], results[(c, "bf16", th)], results[("bf16", c, th)]
                    print(f"| {c} | {th} | {f['dea']['gen_tokens_per_s']:.0f} | {h['dea']['gen_tokens_per_s']:.0f} | "
                          f"{f['torch']['gen_tokens_per_s']:.0f} | {h['torch']['gen_tokens_per_s']:.0f} | "
                          f"{x['generate']['dea_bf16_over_dea_fp32']:.2f}x | "
                          f"{x['generate']['dea_bf16_over_torch_bf16']:.2f}x |")


def print_markdown_precision(results, configs, threads, prec):
    print("\n| config | threads | dea tok/s | torch tok/s | dea / torch (best) | paired median | dea yardstick "
          "fraction | dea GEMM GFLOP/s | dea phases f / b / o (s) | torch phases f / b / o (s) | peak RSS dea / "
          "torch (MB) | load |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|---|")
    for th in threads:
        for c in configs:
            o = results[(c, prec, th)]
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
            o = results[(c, prec, th)]
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
                e = results[("cost", c, prec, th)]
                print(f"| {c} | {th} | {100 * e['dea']['best']:+.1f} % / {100 * e['dea']['round_median']:+.1f} % | "
                      f"{100 * e['torch']['best']:+.1f} % / {100 * e['torch']['round_median']:+.1f} % |")


if __name__ == "__main__":
    main()
