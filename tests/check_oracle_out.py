#!/usr/bin/env python3
"""Runs `dea oracle` on the public oracle case (golden/bert/oracle/) as a user would and checks what it wrote:

  1. the pairs of oracle_cases.json as a pairs file (half of them under q_text / k_text) -> CACHE.jsonl, whose lines
     must be the pairs in order, under the input's names, with alpha, alpha_raw, phi and sim within TOL of the
     case's values (1e-9 with --double, 1e-5 in float, the golden set's tolerances);
  2. the recovery rule: the cache cut in the middle of a record, and again after whole records, and the command run
     again (another --batch_size and --threads) must give the same bytes; a complete cache is left as it is; a run
     of 3000 pairs killed with SIGKILL while it writes, then run again, gives the bytes of an uninterrupted run;
  3. --calibrate on labels that step from 0.1 to 0.9 at alpha_raw 0.6: every alpha is its pair's label.
Prints "oracle --out: ok" and the worst errors on success.

usage: check_oracle_out.py DEA ORACLE_DIR WORK_DIR [--double]
"""
import json
import os
import shutil
import subprocess
import sys
import time


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    sys.stdout.write(r.stdout)
    sys.stderr.write(r.stderr)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit status {r.returncode}")
    return r


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    dea, oracle_dir, work = sys.argv[1:4]
    double = "--double" in sys.argv[4:]
    tol = 1e-9 if double else 1e-5
    case = json.load(open(os.path.join(oracle_dir, "oracle_cases.json"), encoding="utf-8"))
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    pairs_path = os.path.join(work, "pairs.jsonl")
    names = []
    with open(pairs_path, "w", encoding="utf-8") as f:
        for i, p in enumerate(case["pairs"]):
            a, b = ("q_text", "k_text") if i % 2 else ("premise", "hypothesis")
            names.append((a, b))
            f.write(json.dumps({a: p["q_text"], b: p["k_text"], "label": 1}) + "\n")
            if i == 5:
                f.write("\n")  # blank lines are skipped
    base = [dea, "oracle", "--nli", os.path.join(oracle_dir, "oracle_nli"), "--embedder",
            os.path.join(oracle_dir, "oracle_sim"), "--pairs", pairs_path] + (["--double"] if double else [])
    out = os.path.join(work, "cache.jsonl")
    run(base + ["--out", out, "--batch_size", "5", "--threads", "2"])

    problems = []
    with open(out, "rb") as f:
        full = f.read()
    lines = full.decode("utf-8").split("\n")
    if lines[-1] != "":
        problems.append("the cache does not end with a newline")
    lines = lines[:-1]
    if len(lines) != len(case["pairs"]):
        problems.append(f"{len(lines)} lines for {len(case['pairs'])} pairs")
    worst = {k: 0.0 for k in ("phi", "sim", "alpha_raw", "alpha")}
    for i, (line, p) in enumerate(zip(lines, case["pairs"])):
        rec = json.loads(line)
        a, b = names[i]
        if list(rec.keys()) != [a, b, "alpha", "alpha_raw", "phi", "sim"]:
            problems.append(f"line {i + 1}: fields {list(rec.keys())}")
            continue
        if rec[a] != p["q_text"] or rec[b] != p["k_text"]:
            problems.append(f"line {i + 1}: pair ({rec[a]!r}, {rec[b]!r}), expected ({p['q_text']!r}, {p['k_text']!r})")
        for k in worst:
            e = abs(rec[k] - p[k])
            worst[k] = max(worst[k], e)
            if not e <= tol:
                problems.append(f"line {i + 1}: {k} {rec[k]!r}, the case's {p[k]!r} (|error| {e:.3g} > {tol:g})")

    # the recovery rule
    seventh = sum(len(l) + 1 for l in lines[:7])
    for cut, flags in ((seventh + 20, ["--batch_size", "3", "--threads", "1"]),
                       (seventh, ["--batch_size", "64", "--threads", "2"]),
                       (len(full), ["--batch_size", "2"])):
        with open(out, "wb") as f:
            f.write(full[:cut])
        run(base + ["--out", out, "--quiet"] + flags)
        with open(out, "rb") as f:
            again = f.read()
        if again != full:
            problems.append(f"cut at byte {cut} and resumed with {' '.join(flags)}: the file differs")

    # a run killed (SIGKILL) while it writes, then the same command again: the bytes of an uninterrupted run
    many = os.path.join(work, "many.jsonl")
    with open(many, "w", encoding="utf-8") as f:
        for r in range(250):
            for p in case["pairs"]:
                f.write(json.dumps({"premise": p["q_text"], "hypothesis": f"{p['k_text']} {r}"}) + "\n")
    kbase = [c if c != pairs_path else many for c in base] + ["--quiet"]
    ref = os.path.join(work, "many_ref.jsonl")
    run(kbase + ["--out", ref])
    killed = os.path.join(work, "many_killed.jsonl")
    proc = subprocess.Popen(kbase + ["--out", killed, "--batch_size", "1"], stdout=subprocess.DEVNULL)
    deadline = time.time() + 20
    while proc.poll() is None and time.time() < deadline and (not os.path.exists(killed) or os.path.getsize(killed) < 2000):
        time.sleep(0.001)
    proc.kill()
    proc.wait()
    survived = open(killed, "rb").read().count(b"\n") if os.path.exists(killed) else 0
    run(kbase + ["--out", killed, "--batch_size", "7"])
    if open(killed, "rb").read() != open(ref, "rb").read():
        problems.append(f"killed at {survived} records and resumed: the file differs from an uninterrupted run's")
    if survived >= 250 * len(case["pairs"]):
        problems.append("the run to kill had finished before the kill: nothing was interrupted")

    # --calibrate
    labels = os.path.join(work, "labels.jsonl")
    with open(labels, "w", encoding="utf-8") as f:
        for p in case["pairs"]:
            f.write(json.dumps({"premise": p["q_text"], "hypothesis": p["k_text"],
                                "alpha": 0.9 if p["alpha_raw"] > 0.6 else 0.1}) + "\n")
    cal = os.path.join(work, "calibrated.jsonl")
    run(base + ["--out", cal, "--calibrate", labels])
    with open(cal, encoding="utf-8") as f:
        for i, (line, p) in enumerate(zip(f, case["pairs"])):
            rec = json.loads(line)
            want = 0.9 if p["alpha_raw"] > 0.6 else 0.1
            if abs(rec["alpha"] - want) > 1e-12 or abs(rec["alpha_raw"] - p["alpha_raw"]) > tol:
                problems.append(f"calibrated line {i + 1}: alpha {rec['alpha']!r} (want {want}), "
                                f"alpha_raw {rec['alpha_raw']!r}")

    if problems:
        sys.exit("\n".join(problems))
    print("oracle --out: ok (" + ("double" if double else "float") + ", worst |error| " +
          ", ".join(f"{k} {v:.3g}" for k, v in worst.items()) + f"; tolerance {tol:g}; resumed 3 times to the same bytes; killed at "
          f"{survived} of {250 * len(case['pairs'])} records and resumed to the same bytes; calibrated)")


if __name__ == "__main__":
    main()
