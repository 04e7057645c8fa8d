#!/usr/bin/env python3
"""Runs `dea oracle` with the public DeBERTa oracle case (tests/data/deberta/oracle/: a DeBERTa-v3-shaped NLI model
with its spm.model, the BERT embedder of the BERT case) as a user would and checks what it wrote:

  1. the case's pairs -> CACHE.jsonl, whose lines must be the pairs in order with alpha, alpha_raw, phi and sim within
     TOL of the case's values (1e-9 with --double, 1e-5 in float);
  2. the same command on 1 thread with batches of 3 pairs, and on 2 threads with one batch, writes the same bytes;
  3. the cache cut after 5 records and the command run again gives the same bytes.
Prints "oracle deberta --out: ok" and the worst errors on success.

usage: check_oracle_deberta_out.py DEA DATA_DIR WORK_DIR [--double]
  (DATA_DIR is tests/data: the case is DATA_DIR/deberta/oracle, the embedder DATA_DIR/bert/oracle/oracle_sim)
"""
import json
import os
import shutil
import subprocess
import sys


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    sys.stderr.write(r.stderr)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit status {r.returncode}")
    return r


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    dea, data, work = sys.argv[1:4]
    double = "--double" in sys.argv[4:]
    tol = 1e-9 if double else 1e-5
    case = os.path.join(data, "deberta", "oracle")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    with open(os.path.join(case, "expected.jsonl")) as f:
        expected = [json.loads(line) for line in f if line.strip()]
    base = [dea, "oracle", "--nli", os.path.join(case, "nli"), "--embedder",
            os.path.join(data, "bert", "oracle", "oracle_sim"), "--pairs", os.path.join(case, "pairs.jsonl")]
    if double:
        base.append("--double")

    out = os.path.join(work, "cache.jsonl")
    r = run(base + ["--out", out, "--threads", "2", "--batch_size", "128"])
    if "DeBERTa, fast tokenizer" not in r.stderr:
        sys.exit("the progress lines do not say the NLI model is a DeBERTa model with the fast tokenizer")
    with open(out) as f:
        got = [json.loads(line) for line in f]
    if len(got) != len(expected):
        sys.exit(f"{len(got)} records for {len(expected)} pairs")
    worst = {k: 0.0 for k in ("phi", "sim", "alpha_raw", "alpha")}
    for i, (g, e) in enumerate(zip(got, expected)):
        if (g.get("q_text"), g.get("k_text")) != (e["q_text"], e["k_text"]):
            sys.exit(f"record {i} is not pair {i}")
        for k in worst:
            err = abs(g[k] - e[k]) / max(1.0, abs(e[k]))
            worst[k] = max(worst[k], err)
            if err > tol:
                sys.exit(f"record {i}: {k} {g[k]!r}, expected {e[k]!r} (relative error {err:.3g} > {tol})")
    with open(out, "rb") as f:
        ref = f.read()

    other = os.path.join(work, "other.jsonl")
    run(base + ["--out", other, "--threads", "1", "--batch_size", "3", "--quiet"])
    with open(other, "rb") as f:
        if f.read() != ref:
            sys.exit("1 thread with batches of 3 pairs wrote other bytes than 2 threads with one batch")

    with open(other, "wb") as f:
        f.write(b"".join(ref.splitlines(keepends=True)[:5]))
    r = run(base + ["--out", other, "--threads", "2"])
    if "resuming" not in r.stderr:
        sys.exit("the second run did not say it resumed")
    with open(other, "rb") as f:
        if f.read() != ref:
            sys.exit("the resumed cache differs from the uninterrupted one")
    print("oracle deberta --out: ok (" + ", ".join(f"{k} {v:.3g}" for k, v in worst.items()) + f"; tolerance {tol})")


if __name__ == "__main__":
    main()
