#!/usr/bin/env python3
"""Data-parallel training on localhost (`mpirun -np R dea train`), run by ctest when the build has MPI.

  check_dist.py --dea DEA --mpirun MPIRUN --work DIR --data tests/data CHECK [FAMILY]

Checks (each prints one line ending in "ok" and exits 0, or names what differs and exits 1):
  bitwise lm|encoder|encoder_text|dea_bert
            the same run with --micro_batches 4 as one process (no mpirun) and under mpirun -np 1, 2 and 4 (one
            thread per rank): checkpoint.safetensors byte for byte and train_log.jsonl line for line (apart from the
            measured steps_per_s) identical, with the reduce_scatter exchange in buckets of BUCKET_MB (-np 1, 2,
            4) and in one bucket (the default size), and with the allgather exchange (-np 2, 4)
  resume    a run checkpointed under -np 2 and resumed under -np 4 (small buckets) ends with the bytes of one
            process's uninterrupted run
  kill      rank 1 of -np 2 is SIGKILLed in the middle of the run (its steps exchange many small buckets, so the
            kill lands in a step's exchange or backward): the job ends with a non-zero status within a bounded
            time, the last checkpoint is intact, and --resume ends with the uninterrupted run's bytes
  missing   the corpus missing on rank 1 only (each rank in its own working directory): every rank stops, exit
            status 2, one message naming rank 1 and the file, nothing written
  nonfinite a learning rate that makes the loss non-finite: every rank stops, exit status 1, one message
  nonfinite_rank lm|encoder
            the loss of one micro-batch made NaN (DEA_INJECT_NONFINITE_LOSS=STEP:MICRO): one process names the
            micro-batch; under -np 2 and -np 4 every rank stops with status 1 and one message naming the rank that
            holds it, the last checkpoint is the one before the fault, and --resume (without the fault) ends with
            the uninterrupted run's bytes
  bench     bench_dist (--bench_dist) under -np 2: a step line per exchange and comm lines, fields and bytes consistent
  eval lm|encoder|encoder_text|dea_bert
            the evaluation shared by the ranks: a run whose periodic evaluation has more batches than ranks, under one
            process and -np 2 and 4, logs the same evaluation lines (and checkpoints); then `dea eval --json` of its
            checkpoint under one process and mpirun -np 1, 2, 4 prints the same JSON and writes the same
            eval_<split>.json
  eval_missing
            `dea eval` of a run directory present on rank 0 only (each rank in its own working directory): every rank
            stops, exit status 1, one message naming rank 1 and the missing file
  changed   the LM corpus, read by offset, truncated in place in the middle of a run under -np 2: the job ends within
            a bounded time with status 1 and one message naming the rank that met it and the file; the last
            checkpoint is intact
"""
import argparse
import json
import os
import re
import signal
import struct
import subprocess
import sys
import time

KILL_BOUND_S = 30.0  # the job must end this soon after a rank is killed
# long enough that the kill (just after the first checkpoint) lands mid-run on an idle machine too (200 tiny steps
# once finished before it)
KILL_STEPS = 1000
# a bucket of the reduce_scatter exchange: 500 floats, so that the tiny models' gradients make several buckets and
# a bucket boundary falls inside parameters
BUCKET_MB = "0.002"


def fail(msg):
    print("check_dist: FAILED: " + msg)
    sys.exit(1)


class Runner:
    def __init__(self, a):
        self.dea, self.mpirun, self.work, self.data = a.dea, a.mpirun, a.work, a.data
        self.env = dict(os.environ, OMP_NUM_THREADS="1")

    def mpi(self, ranks):
        return [self.mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(ranks)]

    def run(self, cmd, expect=0, timeout=300, env=None):
        p = subprocess.run(cmd, env=dict(self.env, **(env or {})), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=timeout)
        if expect is not None and p.returncode != expect:
            fail("%s: exit status %d (expected %d)\n%s\n%s" % (" ".join(cmd), p.returncode, expect, p.stdout[-3000:],
                                                              p.stderr[-3000:]))
        return p

    def train(self, args, out, ranks=None, expect=0, env=None):
        cmd = ([] if ranks is None else self.mpi(ranks)) + [self.dea, "train"] + args + ["--out_dir", out]
        return self.run(cmd, expect, env=env)


def family_args(r, family):
    corpus = os.path.join(r.data, "lm", "tiny_corpus.txt")
    if family == "lm":
        return ["--model", "lm", "--data_source", "text", "--text", corpus, "--d_model", "16", "--n_heads", "2",
                "--n_layers", "1", "--d_ff", "32", "--max_len", "16", "--batch_size", "8", "--lr_main", "3e-3",
                "--log_every", "1", "--eval_every", "3", "--eval_batches", "2", "--seed", "7"]
    if family == "encoder":  # D_alpha, dropout
        return ["--d_model", "16", "--n_heads", "2", "--n_layers", "1", "--d_ff", "32", "--batch_size", "8",
                "--gamma_steps", "2", "--log_every", "1", "--eval_every", "3", "--eval_batches", "2",
                "--n_per_source", "20", "--no-plots"]
    if family == "encoder_text":  # masked LM: masking streams, and a short last batch of the epoch (11 chunks)
        return ["--data_source", "text", "--text", corpus, "--d_model", "16", "--n_heads", "2", "--n_layers", "1",
                "--d_ff", "32", "--batch_size", "8", "--gamma_steps", "2", "--log_every", "1", "--eval_every", "3",
                "--no-plots"]
    if family == "dea_bert":
        return ["--model", "dea_bert", "--hf_model", os.path.join(r.data, "bert", "oracle", "oracle_sim"),
                "--batch_size", "8", "--max_len", "32", "--n_per_source", "20", "--log_every", "1", "--eval_every",
                "3", "--eval_batches", "2", "--no-plots"]
    fail("unknown family " + family)


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def log_lines(run_dir):
    with open(os.path.join(run_dir, "train_log.jsonl")) as f:
        return [re.sub(r',?"steps_per_s":[-+.eE0-9]+', "", line) for line in f]


def same_run(a, b, what):
    if read_bytes(os.path.join(a, "checkpoint.safetensors")) != read_bytes(os.path.join(b, "checkpoint.safetensors")):
        fail("%s: the checkpoints of %s and %s differ" % (what, a, b))
    la, lb = log_lines(a), log_lines(b)
    if la != lb:
        diff = next((i for i in range(min(len(la), len(lb))) if la[i] != lb[i]), min(len(la), len(lb)))
        fail("%s: the logs of %s and %s differ at line %d:\n%s\n%s" % (what, a, b, diff + 1,
                                                                      la[diff] if diff < len(la) else "(none)",
                                                                      lb[diff] if diff < len(lb) else "(none)"))


def checkpoint_step(path):
    b = read_bytes(path)
    n = struct.unpack("<Q", b[:8])[0]
    return int(json.loads(b[8:8 + n])["__metadata__"]["step"])


def error_lines(stderr):
    return [l for l in stderr.splitlines() if l.startswith("dea train:")]


def check_bitwise(r, family):
    args = family_args(r, family) + ["--steps", "6", "--micro_batches", "4"]
    base = os.path.join(r.work, family)
    r.train(args, base + "_single")
    runs = []
    # the default exchange (reduce_scatter) with buckets of BUCKET_MB (many per step), with one bucket per step
    # (the default size), and the allgather exchange
    for ranks in (1, 2, 4):
        runs.append(("np%d" % ranks, ranks, ["--bucket_mb", BUCKET_MB]))
    for ranks in (2, 4):
        runs.append(("np%d_one_bucket" % ranks, ranks, []))
        runs.append(("np%d_allgather" % ranks, ranks, ["--exchange", "allgather"]))
    for name, ranks, extra in runs:
        r.train(args + extra, "%s_%s" % (base, name), ranks)
        same_run(base + "_single", "%s_%s" % (base, name), "%s, mpirun -np %d %s" % (family, ranks, " ".join(extra)))
    steps = len([l for l in log_lines(base + "_single") if '"event"' not in l])
    print("dist bitwise %s: --micro_batches 4, one process and mpirun -np 1, 2, 4 (reduce_scatter with --bucket_mb "
          "%s and with one bucket, allgather): checkpoints and logs identical (%d logged steps): ok"
          % (family, BUCKET_MB, steps))


def check_resume(r):
    args = family_args(r, "lm") + ["--micro_batches", "4"]
    straight, resumed = os.path.join(r.work, "straight"), os.path.join(r.work, "resumed")
    r.train(args + ["--steps", "12"], straight)
    r.train(args + ["--steps", "6", "--bucket_mb", BUCKET_MB], resumed, 2)
    r.run(r.mpi(4) + [r.dea, "train", "--resume", "--steps", "12", "--bucket_mb", BUCKET_MB, "--out_dir", resumed])
    same_run(straight, resumed, "6 steps on -np 2 resumed to 12 on -np 4")
    print("dist resume: 6 steps under -np 2 resumed to 12 under -np 4 = 12 steps in one process, bit for bit: ok")


def rank_pids(mpirun_pid):
    """{rank: pid} of the processes mpirun started (their environment names their rank)."""
    out = {}
    for pid in subprocess.run(["pgrep", "-P", str(mpirun_pid)], stdout=subprocess.PIPE, text=True).stdout.split():
        try:
            with open("/proc/%s/environ" % pid, "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        if b"OMPI_COMM_WORLD_RANK" in env:
            out[int(env[b"OMPI_COMM_WORLD_RANK"])] = int(pid)
    return out


def check_kill(r):
    args = family_args(r, "lm") + ["--micro_batches", "4", "--steps", str(KILL_STEPS), "--eval_every", "20",
                                   "--log_every", "10", "--bucket_mb", BUCKET_MB]
    straight, killed = os.path.join(r.work, "straight"), os.path.join(r.work, "killed")
    r.train(args, straight)
    ckpt = os.path.join(killed, "checkpoint.safetensors")
    cmd = r.mpi(2) + [r.dea, "train"] + args + ["--out_dir", killed]
    p = subprocess.Popen(cmd, env=r.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t_end = time.time() + 120
    while not os.path.exists(ckpt):
        if p.poll() is not None or time.time() > t_end:
            fail("the run ended (or took too long) before its first checkpoint: %s" % p.communicate()[1][-2000:])
        time.sleep(0.02)
    time.sleep(0.05)  # somewhere in a later step
    pids = rank_pids(p.pid)
    if 1 not in pids:
        fail("rank 1 of mpirun (pid %d) not found among %s" % (p.pid, pids))
    os.kill(pids[1], signal.SIGKILL)
    t_kill = time.time()
    try:
        _, err = p.communicate(timeout=KILL_BOUND_S)
    except subprocess.TimeoutExpired:
        p.kill()
        fail("the job did not end within %.0f s of rank 1's death" % KILL_BOUND_S)
    waited = time.time() - t_kill
    if p.returncode == 0:
        fail("the job ended with status 0 after rank 1 was killed")
    if "rank 1" not in err or "signal 9" not in err:
        fail("mpirun's message does not say that rank 1 died of signal 9:\n" + err[-2000:])
    step = checkpoint_step(ckpt)
    if step % 20 != 0 or step >= KILL_STEPS:
        fail("the checkpoint left behind is of step %d" % step)
    r.run(r.mpi(2) + [r.dea, "train", "--resume", "--out_dir", killed])
    same_run(straight, killed, "killed at step > %d and resumed" % step)
    print("dist kill: rank 1 SIGKILLed, job ended with status %d in %.2f s (bound %.0f s), checkpoint of step %d "
          "intact, --resume = the uninterrupted run bit for bit: ok" % (p.returncode, waited, KILL_BOUND_S, step))


def check_missing(r):
    have, lack = os.path.join(r.work, "with_corpus"), os.path.join(r.work, "without_corpus")
    os.makedirs(have)
    os.makedirs(lack)
    with open(os.path.join(r.data, "lm", "tiny_corpus.txt"), "rb") as f, \
            open(os.path.join(have, "corpus.txt"), "wb") as g:
        g.write(f.read())
    out = os.path.join(r.work, "run")
    args = [x if x != os.path.join(r.data, "lm", "tiny_corpus.txt") else "corpus.txt" for x in family_args(r, "lm")]
    args += ["--micro_batches", "2", "--steps", "4", "--out_dir", out]
    cmd = ([r.mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "1", "--wdir", have,
            r.dea, "train"] + args + [":", "-np", "1", "--wdir", lack, r.dea, "train"] + args)
    t0 = time.time()
    p = r.run(cmd, expect=2)
    lines = error_lines(p.stderr)
    if len(lines) != 1 or "rank 1 of 2" not in lines[0] or os.path.join(lack, "corpus.txt") not in lines[0]:
        fail("expected one message naming rank 1 and its missing file, got:\n" + p.stderr)
    if os.path.exists(out):
        fail("a run directory was written: " + out)
    print("dist missing: the corpus missing on rank 1: every rank stopped with status 2 in %.1f s, one message "
          "('%s'): ok" % (time.time() - t0, lines[0]))


def check_nonfinite(r):
    args = family_args(r, "lm") + ["--micro_batches", "4", "--steps", "40", "--lr_main", "1e6", "--eval_every", "100",
                                   "--bucket_mb", BUCKET_MB]
    p = r.train(args, os.path.join(r.work, "run"), 2, expect=1)
    lines = error_lines(p.stderr)
    if len(lines) != 1 or "non-finite" not in lines[0]:
        fail("expected one message about a non-finite value, got:\n" + p.stderr)
    print("dist nonfinite: every rank stopped with status 1, one message ('%s'): ok" % lines[0])


def check_nonfinite_rank(r, family):
    fault_step = 5  # after the checkpoint of step 4
    args = family_args(r, family) + ["--micro_batches", "4", "--steps", "8", "--eval_every", "2",
                                     "--bucket_mb", BUCKET_MB]
    straight = os.path.join(r.work, "straight")
    r.train(args, straight)
    seen = []
    # micro-batch k of 4 is on rank k // (4 / R)
    for ranks, micro, holder in ((None, 3, None), (2, 3, 1), (4, 2, 2)):
        out = os.path.join(r.work, "fault_" + ("single" if ranks is None else "np%d" % ranks))
        p = r.train(args, out, ranks, expect=1, env={"DEA_INJECT_NONFINITE_LOSS": "%d:%d" % (fault_step, micro)})
        lines = error_lines(p.stderr)
        where = "micro-batch %d of 4" % micro + ("" if holder is None else " (rank %d of %d)" % (holder, ranks))
        what = "one process" if ranks is None else "-np %d" % ranks
        if len(lines) != 1 or "non-finite loss at step %d" % fault_step not in lines[0] or where not in lines[0]:
            fail("%s, the loss of micro-batch %d NaN: expected one message naming step %d and '%s', got:\n%s"
                 % (what, micro, fault_step, where, p.stderr))
        if holder is None and "(rank " in lines[0]:
            fail("one process: the message names a rank: " + lines[0])
        step = checkpoint_step(os.path.join(out, "checkpoint.safetensors"))
        if step != fault_step - 1:
            fail("%s: the checkpoint left behind is of step %d, not %d" % (what, step, fault_step - 1))
        r.run(([] if ranks is None else r.mpi(ranks)) + [r.dea, "train", "--resume", "--out_dir", out])
        same_run(straight, out, "%s, stopped by a NaN loss at step %d and resumed" % (what, fault_step))
        seen.append("  %s: status 1, one message ('%s'), checkpoint of step %d kept, --resume = the uninterrupted run"
                    % (what, lines[0], step))
    print("dist nonfinite_rank %s: a NaN loss on one micro-batch stops one process and every rank of -np 2 and 4 "
          "with one message naming its rank; --resume continues bit for bit: ok" % family)
    print("\n".join(seen))


def check_bench(r, bench_dist):
    if not bench_dist:
        fail("bench needs --bench_dist")
    lines = []
    for cmd in (["step", "--config", "quick", "--steps", "2", "--warmup", "1", "--micro_batches", "4"],
                ["comm", "--sizes", "1024,65536", "--reps", "2"]):
        p = r.run(r.mpi(2) + [bench_dist] + cmd)
        try:
            got = [json.loads(l) for l in p.stdout.splitlines() if l.strip()]
        except ValueError as e:
            fail("bench_dist %s: stdout is not JSON lines (%s):\n%s" % (cmd[0], e, p.stdout))
        lines += got
    step = [j for j in lines if j.get("bench") == "step"]
    comm = [j for j in lines if j.get("bench") == "comm"]
    if [j.get("exchange") for j in step] != ["allgather", "reduce_scatter"] or len(comm) != 2:
        fail("expected an allgather and a reduce_scatter step line and two comm lines, got %s" % lines)
    # each phase is the rank with the longest compute's, so each is at most the step (the step the maximum over ranks)
    for s in step:
        phases = [s[k] for k in ("compute_s", "exposed_s", "hidden_s", "status_s", "finish_s", "optim_s")]
        if not (s["ranks"] == 2 and s["micro_batches"] == 4 and s["s_per_step"] > 0 and 0 <= s["exposed_share"] <= 1
                and s["grad_bytes"] == 4 * s["parameters"] and all(0 <= t <= s["s_per_step"] for t in phases)):
            fail("inconsistent step line: %s" % s)
    ag, rs = step
    # the allgather sends its whole buffer to the other rank; the reduce-scatter half of it twice (slices padded)
    if not (ag["bytes_sent"] == ag["bytes_received"] == ag["grad_bytes"] and ag["hidden_s"] == 0
            and ag["grad_bytes"] <= rs["bytes_sent"] < ag["grad_bytes"] + 8 * rs["buckets"]):
        fail("inconsistent bytes or overlap: %s" % step)
    for c, n in zip(comm, (1024, 65536)):
        if not (c["ranks"] == 2 and c["floats"] == n and c["bytes_received_per_rank"] == 4 * n and c["allgather_s"] > 0
                and c["rs_bytes_sent_per_rank"] == 4 * n and c["alltoall_s"] > 0 and c["slice_allgather_s"] > 0):
            fail("inconsistent comm line: %s" % c)
    print("dist bench: bench_dist -np 2: step %.3f s (allgather, exposed %.3f) and %.3f s (reduce_scatter, exposed "
          "%.3f), allgather of 256 KiB %.2f ms, alltoall %.2f ms: ok"
          % (ag["s_per_step"], ag["exposed_share"], rs["s_per_step"], rs["exposed_share"], 1e3 * comm[1]["allgather_s"],
             1e3 * comm[1]["alltoall_s"]))


def eval_args(r, family):
    """family_args with small batches, so that the evaluation has more batches (the pieces the ranks share) than
    ranks, and every validation batch evaluated."""
    args = family_args(r, family)
    small = {"--batch_size": "2" if family in ("lm", "encoder_text") else "4", "--eval_batches": "1000"}
    out, i = [], 0
    while i < len(args):
        if args[i] in small:
            out += [args[i], small.pop(args[i])]
            i += 2
        else:
            out.append(args[i])
            i += 1
    for k, v in small.items():
        out += [k, v]
    return out


def eval_lines(run_dir):
    return [l for l in log_lines(run_dir) if '"event":"eval"' in l]


def check_eval(r, family):
    micro = "2" if family in ("lm", "encoder_text") else "4"
    args = eval_args(r, family) + ["--steps", "4", "--eval_every", "2", "--micro_batches", micro]
    base = os.path.join(r.work, family)
    r.train(args, base + "_single")
    want = eval_lines(base + "_single")
    if len(want) != 2:
        fail("%s: expected 2 evaluation lines in the log, got %d" % (family, len(want)))
    for ranks in (2, 4) if micro == "4" else (2,):
        r.train(args, "%s_np%d" % (base, ranks), ranks)
        same_run(base + "_single", "%s_np%d" % (base, ranks), "%s, mpirun -np %d" % (family, ranks))
        if eval_lines("%s_np%d" % (base, ranks)) != want:
            fail("%s, mpirun -np %d: the evaluation lines differ" % (family, ranks))
    # the masked-LM corpus is small: its training split has the most batches
    split = {"lm": "val", "encoder_text": "train"}.get(family, "test")
    cmd = [r.dea, "eval", "--ckpt", base + "_single", "--json", "--split", split]
    if family != "lm":
        cmd.append("--no-plots")
    out_file = os.path.join(base + "_single", "eval_%s.json" % split)
    one = r.run(cmd).stdout
    one_file = read_bytes(out_file)
    doc = json.loads(one)
    batches = doc["n_batches"] if "n_batches" in doc else (doc["n_windows"] + 1) // 2
    if batches < 4:
        fail("%s: dea eval covers %d batches, fewer than the ranks that share them" % (family, batches))
    for ranks in (1, 2, 4):
        os.remove(out_file)
        got = r.run(r.mpi(ranks) + cmd).stdout
        if got != one:
            fail("%s: dea eval under mpirun -np %d prints other JSON:\n%s\n%s" % (family, ranks, one, got))
        if read_bytes(out_file) != one_file:
            fail("%s: dea eval under mpirun -np %d writes another %s" % (family, ranks, out_file))
    print("dist eval %s: periodic evaluation (%d lines) identical for one process and -np 2%s; dea eval --split %s "
          "(%d batches) one process = mpirun -np 1, 2, 4, JSON byte for byte: ok"
          % (family, len(want), ", 4" if micro == "4" else "", split, batches))


def check_eval_missing(r):
    have, lack = os.path.join(r.work, "with_run"), os.path.join(r.work, "without_run")
    os.makedirs(lack)
    r.train(family_args(r, "lm") + ["--steps", "2"], os.path.join(have, "run"))
    cmd = ([r.mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "1", "--wdir", have,
            r.dea, "eval", "--ckpt", "run", "--split", "val", ":", "-np", "1", "--wdir", lack, r.dea, "eval", "--ckpt",
            "run", "--split", "val"])
    t0 = time.time()
    p = r.run(cmd, expect=1)
    lines = [l for l in p.stderr.splitlines() if l.startswith("dea eval:")]
    if len(lines) != 1 or "rank 1 of 2" not in lines[0] or "run/config.json" not in lines[0]:
        fail("expected one message naming rank 1 and its missing file, got:\n" + p.stderr)
    if p.stdout.strip():
        fail("a result was printed:\n" + p.stdout)
    print("dist eval_missing: the run directory missing on rank 1: every rank stopped with status 1 in %.1f s, one "
          "message ('%s'): ok" % (time.time() - t0, lines[0]))


def check_changed(r):
    corpus = os.path.join(r.work, "corpus.txt")
    with open(os.path.join(r.data, "lm", "tiny_corpus.txt"), "rb") as f, open(corpus, "wb") as g:
        g.write(f.read())
    out = os.path.join(r.work, "run")
    ckpt = os.path.join(out, "checkpoint.safetensors")
    args = [x if x != os.path.join(r.data, "lm", "tiny_corpus.txt") else corpus for x in family_args(r, "lm")]
    args += ["--micro_batches", "2", "--steps", str(KILL_STEPS), "--eval_every", "20", "--log_every", "10",
             "--out_dir", out]
    p = subprocess.Popen(r.mpi(2) + [r.dea, "train"] + args, env=r.env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    t_end = time.time() + 120
    while not os.path.exists(ckpt):
        if p.poll() is not None or time.time() > t_end:
            fail("the run ended (or took too long) before its first checkpoint: %s" % p.communicate()[1][-2000:])
        time.sleep(0.02)
    with open(corpus, "r+b") as f:  # in place: the ranks' open files see it
        f.truncate(1000)
    t_change = time.time()
    try:
        _, err = p.communicate(timeout=KILL_BOUND_S)
    except subprocess.TimeoutExpired:
        p.kill()
        fail("the job did not end within %.0f s of the change" % KILL_BOUND_S)
    waited = time.time() - t_change
    if p.returncode != 1:
        fail("exit status %d (expected 1):\n%s" % (p.returncode, err[-2000:]))
    lines = error_lines(err)
    if len(lines) != 1 or not re.search(r"rank \d of 2", lines[0]) or corpus not in lines[0] or \
            "changed while in use" not in lines[0]:
        fail("expected one message naming a rank and the changed file, got:\n" + err)
    step = checkpoint_step(ckpt)
    if step % 20 != 0 or step >= KILL_STEPS:
        fail("the checkpoint left behind is of step %d" % step)
    print("dist changed: the corpus truncated in the middle of a -np 2 run: status 1 in %.2f s (bound %.0f s), one "
          "message ('%s'), checkpoint of step %d intact: ok" % (waited, KILL_BOUND_S, lines[0], step))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dea", required=True)
    ap.add_argument("--mpirun", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--data", required=True, help="tests/data")
    ap.add_argument("--bench_dist", help="the bench_dist program (check bench)")
    ap.add_argument("check", choices=["bitwise", "resume", "kill", "missing", "nonfinite", "nonfinite_rank", "bench",
                                      "eval", "eval_missing", "changed"])
    ap.add_argument("family", nargs="?", default="lm")
    a = ap.parse_args()
    r = Runner(a)
    subprocess.run(["rm", "-rf", a.work], check=True)
    os.makedirs(a.work)
    if a.check == "bitwise":
        check_bitwise(r, a.family)
    elif a.check == "resume":
        check_resume(r)
    elif a.check == "kill":
        check_kill(r)
    elif a.check == "missing":
        check_missing(r)
    elif a.check == "nonfinite_rank":
        check_nonfinite_rank(r, a.family)
    elif a.check == "bench":
        check_bench(r, a.bench_dist)
    elif a.check == "eval":
        check_eval(r, a.family)
    elif a.check == "eval_missing":
        check_eval_missing(r)
    elif a.check == "changed":
        check_changed(r)
    else:
        check_nonfinite(r)


if __name__ == "__main__":
    main()
