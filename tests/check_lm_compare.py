#!/usr/bin/env python3
"""Checks lm_compare's report and plots (examples/experiments/lm_compare) as a reader would.

    check_lm_compare.py REPORT.json [--variants N] [--seeds N] [--reused]

The report must hold every variant's runs for every seed with finite validation NLL, perplexity = exp(NLL) and a
positive throughput; parameter counts within 1% of the baseline's; every comparison's statistics recomputed here
from its per-seed NLLs (d_s, mean, sd, t, the exact sign test) and its verdict following the stated rule from
those numbers; the bootstrap interval ordered around values d can take. The two SVG files beside the report are
checked by check_svg.py (well-formed, self-contained SVG 1.1) and the curves plot must draw one mean curve per
variant. With --reused every run must say it was reused (a second invocation on the same directory).
Exit status 0 when every check passes, 1 otherwise (the message names the check).
"""
import json
import math
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))


def fail(msg):
    sys.exit(f"check_lm_compare: {msg}")


def main():
    args = sys.argv[1:]
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 1
    path = args[0]
    want_variants = want_seeds = None
    reused = "--reused" in args
    if "--variants" in args:
        want_variants = int(args[args.index("--variants") + 1])
    if "--seeds" in args:
        want_seeds = int(args[args.index("--seeds") + 1])
    with open(path) as f:
        rep = json.load(f)
    variants = rep["variants"]
    seeds = rep["protocol"]["seeds"]
    if want_variants is not None and len(variants) != want_variants:
        fail(f"{len(variants)} variants, expected {want_variants}")
    if want_seeds is not None and len(seeds) != want_seeds:
        fail(f"{len(seeds)} seeds, expected {want_seeds}")
    base_params = variants[0]["parameters"]
    for v in variants:
        if abs(v["parameters"] - base_params) > 0.01 * base_params:
            fail(f"variant {v['name']}: {v['parameters']} parameters, more than 1% from the baseline's {base_params}")
    nll = {}
    for r in rep["runs"]:
        for key in ("val_nll", "val_perplexity", "train_tokens_per_s"):
            if not isinstance(r[key], (int, float)) or not math.isfinite(r[key]):
                fail(f"run {r['variant']} seed {r['seed']}: {key} is {r[key]!r}")
        if abs(math.exp(r["val_nll"]) - r["val_perplexity"]) > 1e-9 * r["val_perplexity"]:
            fail(f"run {r['variant']} seed {r['seed']}: perplexity {r['val_perplexity']} != exp(nll {r['val_nll']})")
        if r["train_tokens_per_s"] <= 0:
            fail(f"run {r['variant']} seed {r['seed']}: throughput {r['train_tokens_per_s']}")
        if not r["curve_step"] or len(r["curve_step"]) != len(r["curve_val_nll"]):
            fail(f"run {r['variant']} seed {r['seed']}: empty or ragged validation curve")
        if r["curve_step"][-1] != rep["protocol"]["steps"]:
            fail(f"run {r['variant']} seed {r['seed']}: the curve ends at step {r['curve_step'][-1]}")
        if reused and not r["reused"]:
            fail(f"run {r['variant']} seed {r['seed']}: trained again, expected reused")
        nll.setdefault(r["variant"], {})[r["seed"]] = r["val_nll"]
    for v in variants:
        if sorted(nll.get(v["name"], {})) != sorted(seeds):
            fail(f"variant {v['name']}: runs for seeds {sorted(nll.get(v['name'], {}))}, expected {sorted(seeds)}")
    if not rep["comparisons"]:
        fail("no comparisons")
    for c in rep["comparisons"]:
        d = [nll[c["idea"]][s] - nll[c["baseline"]][s] for s in seeds]
        if any(abs(a - b) > 1e-12 for a, b in zip(d, c["d_per_seed"])):
            fail(f"{c['idea']} vs {c['baseline']}: d per seed {c['d_per_seed']} != recomputed {d}")
        st = c["statistics"]
        n = len(d)
        mean = sum(d) / n
        sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
        if abs(st["mean_diff"] - mean) > 1e-12:
            fail(f"{c['idea']} vs {c['baseline']}: mean_diff {st['mean_diff']} != {mean}")
        if abs(st["sd_diff"] - sd) > 1e-12:
            fail(f"{c['idea']} vs {c['baseline']}: sd_diff {st['sd_diff']} != {sd}")
        t = st["paired_t"]["t"]
        if sd > 0 and abs(t - mean / (sd / math.sqrt(n))) > 1e-9 * max(1, abs(t)):
            fail(f"{c['idea']} vs {c['baseline']}: t {t} != {mean / (sd / math.sqrt(n))}")
        neg = sum(x < 0 for x in d)
        pos = sum(x > 0 for x in d)
        m = neg + pos
        k = min(neg, pos)
        p_sign = min(1.0, 2 * sum(math.comb(m, i) for i in range(k + 1)) / 2 ** m) if m else 1.0
        if abs(st["sign_test"]["p_two_sided"] - p_sign) > 1e-12:
            fail(f"{c['idea']} vs {c['baseline']}: sign test p {st['sign_test']['p_two_sided']} != {p_sign}")
        lo, hi = st["bootstrap_ci95"]["lo"], st["bootstrap_ci95"]["hi"]
        if not (min(d) - 1e-12 <= lo <= hi <= max(d) + 1e-12):
            fail(f"{c['idea']} vs {c['baseline']}: bootstrap CI [{lo}, {hi}] outside the range of d {d}")
        p = st["paired_t"]["p_two_sided"]
        if mean < 0 and p is not None and p < 0.05 and hi < 0:
            want = "idea lower NLL (significant)"
        elif mean > 0 and p is not None and p < 0.05 and lo > 0:
            want = "idea higher NLL (significant)"
        else:
            want = "no significant difference"
        if c["verdict"] != want:
            fail(f"{c['idea']} vs {c['baseline']}: verdict '{c['verdict']}', the rule gives '{want}'")
        if "agrees_with_framework_direction" in c and c["agrees_with_framework_direction"] != (mean < 0):
            fail(f"{c['idea']} vs {c['baseline']}: agrees_with_framework_direction is wrong for mean d {mean}")
    out = os.path.dirname(os.path.abspath(path))
    svgs = [os.path.join(out, "lm_compare_val_curves.svg"), os.path.join(out, "lm_compare_paired.svg")]
    proc = subprocess.run([sys.executable, os.path.join(HERE, "check_svg.py"), "files"] + svgs)
    if proc.returncode != 0:
        fail("check_svg.py rejected the plots")
    tree = ET.parse(svgs[0])
    means = [g for g in tree.iter("{http://www.w3.org/2000/svg}g") if "mean-curve" in g.get("class", "").split()]
    if len(means) != len(variants):
        fail(f"{svgs[0]}: {len(means)} mean curves, expected one per variant ({len(variants)})")
    print(f"check_lm_compare: {path}: {len(variants)} variants x {len(seeds)} seeds, {len(rep['comparisons'])} "
          f"comparisons: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
