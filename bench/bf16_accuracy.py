#!/usr/bin/env python3
"""The bf16 accuracy bar: trains the mid encoder run with `dea train` in fp32 and in bf16 from the same seeds, evaluates
each checkpoint on the test split with `dea eval`, prints the accuracies side by side and checks the bar: every bf16
run must reach --bar test accuracy (0.62, what the fp32 run of seed 42 clears with a margin).

    /usr/bin/python3 bench/bf16_accuracy.py --dea build/release/examples/dea --seeds 42 --threads 2

The mid run is `dea train --d_model 256 --n_heads 8 --n_layers 4 --d_ff 1024 --batch_size 64 --steps 500
--gamma_steps 400 --eval_every 250` on the generated D_alpha data (about a minute per run on two free Zen 5 cores).
--steps and --gamma_steps shorten it (the bar then means little: the smoke test uses them with --bar 0). Exit status:
0 when every bf16 run reaches the bar, 1 when one does not, 2 on a bad argument or a failed run.
Standard library only."""

import argparse
import json
import os
import subprocess
import sys
import tempfile


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dea", required=True, help="the dea program (build/release/examples/dea)")
    p.add_argument("--seeds", default="42", help="comma-separated seeds (default 42)")
    p.add_argument("--precision", default="fp32,bf16", help="precisions to run, of fp32,bf16 (default both)")
    p.add_argument("--threads", type=int, default=2, help="threads per run (the bits do not depend on it; default 2)")
    p.add_argument("--steps", type=int, default=500, help="training steps (default 500, the mid run)")
    p.add_argument("--gamma_steps", type=int, default=400, help="steps of the gamma_mix ramp (default 400)")
    p.add_argument("--micro_batches", type=int, default=1, help="micro-batches per step (default 1)")
    p.add_argument("--bar", type=float, default=0.62, help="test accuracy every bf16 run must reach (default 0.62)")
    p.add_argument("--out_dir", default="", help="where the runs go (default: a temporary directory, removed)")
    a = p.parse_args()
    try:
        a.seed_list = [int(s) for s in a.seeds.split(",") if s]
    except ValueError:
        p.error(f"--seeds: expected comma-separated integers, got {a.seeds!r}")
    a.precisions = [s for s in a.precision.split(",") if s]
    for s in a.precisions:
        if s not in ("fp32", "bf16"):
            p.error(f"--precision: {s!r} is not one of fp32, bf16")
    if not a.seed_list or not a.precisions:
        p.error("--seeds and --precision need at least one value each")
    if a.steps < 1 or a.gamma_steps < 0 or a.gamma_steps > a.steps:
        p.error(f"--steps {a.steps} / --gamma_steps {a.gamma_steps}: need steps >= 1 and 0 <= gamma_steps <= steps")
    if not (os.path.isfile(a.dea) and os.access(a.dea, os.X_OK)):
        p.error(f"--dea: {a.dea!r} is not an executable file")
    return a


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.stderr.write(f"bf16_accuracy: {' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-2000:]}")
        sys.exit(2)
    return r.stdout


def main():
    a = parse_args()
    tmp = None
    root = a.out_dir
    if not root:
        tmp = tempfile.TemporaryDirectory(prefix="dea_bf16_accuracy_")
        root = tmp.name
    acc = {}
    for seed in a.seed_list:
        for prec in a.precisions:
            out = os.path.join(root, f"{prec}_seed{seed}")
            sys.stderr.write(f"[seed {seed} {prec}] training ({a.steps} steps) ...\n")
            run([a.dea, "train", "--d_model", "256", "--n_heads", "8", "--n_layers", "4", "--d_ff", "1024",
                 "--batch_size", "64", "--steps", str(a.steps), "--gamma_steps", str(a.gamma_steps),
                 "--eval_every", str(max(1, a.steps // 2)), "--micro_batches", str(a.micro_batches),
                 "--seed", str(seed), "--threads", str(a.threads), "--precision", prec, "--out_dir", out])
            run([a.dea, "eval", "--ckpt", out, "--split", "test", "--threads", str(a.threads), "--no-plots"])
            with open(os.path.join(out, "eval_test.json")) as f:
                acc[(seed, prec)] = float(json.load(f)["accuracy"])
            print(json.dumps({"bench": "bf16_accuracy", "seed": seed, "precision": prec, "steps": a.steps,
                              "micro_batches": a.micro_batches, "test_accuracy": acc[(seed, prec)]}), flush=True)
    print("\n| seed | " + " | ".join(a.precisions) + " |")
    print("| --- | " + " | ".join("---" for _ in a.precisions) + " |")
    for seed in a.seed_list:
        print(f"| {seed} | " + " | ".join(f"{acc[(seed, p)]:.3f}" for p in a.precisions) + " |")
    below = [(s, acc[(s, "bf16")]) for s in a.seed_list if "bf16" in a.precisions and acc[(s, "bf16")] < a.bar]
    if "bf16" in a.precisions:
        verdict = "every bf16 run reaches" if not below else f"{len(below)} bf16 run(s) below"
        print(f"\nbar: {verdict} test accuracy {a.bar}" + ("" if not below else f": {below}"))
    if tmp:
        tmp.cleanup()
    return 1 if below else 0


if __name__ == "__main__":
    sys.exit(main())
