#!/usr/bin/env python3
"""dist_model.py: the cost model of data-parallel training (docs/scale.md), its fit and its predictions.

    python3 bench/dist_model.py                          the prediction tables (Markdown) from the constants below
    python3 bench/dist_model.py --fit comm.jsonl ...     alpha, beta, tau refitted from bench_dist comm lines, and the
                                                         model's exchange against bench_dist step lines given too
    python3 bench/dist_model.py --check docs/scale.md    every table row of the predictions is in that page (exit 1
                                                         naming the rows that are not)

Python 3 standard library only. Every figure it prints is predicted, from the constants below; the constants marked
"measured" come from bench_dist on this machine (docs/scale.md has the runs), the others are assumptions stated
where they are set.

The model, for N ranks (one per machine), P float parameters, a network of latency alpha (s) and bandwidth beta
(bytes/s), tau seconds per element of an addition pass, K buckets of the flat gradient:

  allgather       every rank receives the N - 1 other subtree sums, then finishes the whole tree:
                      T = (N - 1)(alpha + 4P/beta) + (N - 1) P tau            after the backward, all of it exposed
  reduce_scatter  per bucket an all-to-all of the slices and an allgather of the summed slices (N - 1 pairwise
                  rounds each), the fixed tree over the N copies of one slice in between:
                      T = 2 (N - 1) K alpha + 2 (N - 1)/N 4P/beta + (N - 1)/N P tau
  ring allreduce  (not bitwise: the order of its additions depends on N) the same bytes and rounds; its additions
                  run while the next chunk travels, so only the slower of the two counts:
                      T = 2 (N - 1) K alpha + (N - 1)/N 4P/beta + (N - 1)/N max(4P/beta, P tau)

The bucketed exchanges run during backward: the buckets become final as backward finishes each layer (the last
layer first; the embeddings only at its end), and a communication thread exchanges them in that order. exposed()
plays that queue: the rank's last micro-batch's backward (a share BACKWARD of its compute) finishes the layers at
even intervals, each bucket takes its share of T, and what is left after the backward ends is exposed.
"""
import argparse
import contextlib
import io
import json
import math
import sys

# --- measured on this machine (bench_dist comm, 2 ranks on loopback; --fit recomputes them) -------------------
LOOPBACK = dict(alpha=1.2e-6, beta=1.0e9, tau=3.0e-9)

# --- the machines of the predictions (assumptions) --------------------------------------------------------------
CORES = 16                 # cores per machine; compute at this machine's per-core rate / CORES (optimistic)
TAU_SERVER = 0.6e-9        # s per element of an addition pass on a server's memory bandwidth, 16 threads
OPT_PER_PARAM = 0.3e-9     # AdamW, memory-bound, s per parameter
BACKWARD = 2.0 / 3.0       # backward's share of a micro-batch's compute
BUCKET_BYTES = 4e6         # --bucket_mb 4, the default
NETWORKS = [("10 GbE", 30e-6, 1.1e9), ("100 Gb/s", 3e-6, 11e9)]

# The models (weak scaling: every machine computes the configuration's batch, M = N). t_ex: seconds per example on
# one core of this machine (measured: the one-thread step of the batch / its examples; bert-base from the
# DualExpertBert fine-tuning step); layers: equal layers final one after the other during backward; tail: the share
# of the parameters final only at the end of backward (the embeddings).
MODELS = [
    dict(name="paper", P=19_957_490, batch=128, t_ex=46.5e-3, layers=6, tail=0.05),
    dict(name="bert-base", P=110_092_466, batch=32, t_ex=12.2 / 32, layers=12, tail=0.216),
]
SIZES = [8, 32, 128]
# bench_dist's configurations (for --fit): layers and the share of the embeddings (vocabulary x D of P)
BENCH_CONFIGS = {"quick": dict(layers=2, tail=0.2), "mid": dict(layers=4, tail=0.11),
                 "paper": dict(layers=6, tail=0.05)}


def t_allgather(N, P, alpha, beta, tau):
    return (N - 1) * (alpha + 4 * P / beta) + (N - 1) * P * tau


def buckets(P, bucket_bytes=BUCKET_BYTES):
    return max(1, math.ceil(4 * P / bucket_bytes))


def t_reduce_scatter(N, P, alpha, beta, tau, K):
    return 2 * (N - 1) * K * alpha + 2 * (N - 1) / N * 4 * P / beta + (N - 1) / N * P * tau


def t_ring(N, P, alpha, beta, tau, K):
    return 2 * (N - 1) * K * alpha + (N - 1) / N * 4 * P / beta + (N - 1) / N * max(4 * P / beta, P * tau)


def exposed(T, K, window, layers, tail):
    """The exchange T (K equal buckets) left after a backward of `window` seconds: the buckets in exchange order
    (from the end of the flat gradient) become final as the layers finish (layer i of `layers` at (i+1)/layers of
    the window, the last `tail` share of the buffer at its end), and one thread exchanges them in order."""
    if K <= 0 or T <= 0:
        return 0.0
    body = 1.0 - tail
    free = 0.0  # when the communication thread is next free
    for i in range(K):
        low = 1.0 - (i + 1) / K  # the bucket's lowest element, as a share of the buffer from its start
        if low < tail - 1e-12:
            ready = window
        else:  # the layers cover (tail, 1], the last layer at the buffer's end finishes first
            done = (1.0 - low) / body  # share of the layers that must be final
            ready = window * min(1.0, math.ceil(done * layers - 1e-9) / layers)
        free = max(free, ready) + T / K
    return max(free - window, 0.0)


def crossing(f, compute, hi=1 << 20):
    """The N >= 1 where f(N) = compute (linear interpolation between integers), or None below hi."""
    prev = 1
    if f(1) >= compute:
        return 1.0
    n = 2
    while n <= hi:
        if f(n) >= compute:
            lo = n // 2 if n > 2 else 1
            while n - lo > 1:
                mid = (lo + n) // 2
                if f(mid) >= compute:
                    n = mid
                else:
                    lo = mid
            a, b = f(lo) - compute, f(n) - compute
            return lo + (-a) / (b - a) if b != a else float(n)
        prev = n
        n *= 2
    return None


def weak(model, net, N):
    """(compute, step allgather, step reduce_scatter, step ring, exchange totals) at N machines."""
    _, alpha, beta = net
    P, K = model["P"], buckets(model["P"])
    compute = model["batch"] * model["t_ex"] / CORES
    opt = OPT_PER_PARAM * P
    window = BACKWARD * compute  # M = N: one micro-batch per rank, its backward
    ag = t_allgather(N, P, alpha, beta, TAU_SERVER)
    rs = t_reduce_scatter(N, P, alpha, beta, TAU_SERVER, K)
    ring = t_ring(N, P, alpha, beta, TAU_SERVER, K)
    e_rs = exposed(rs, K, window, model["layers"], model["tail"])
    e_ring = exposed(ring, K, window, model["layers"], model["tail"])
    return dict(compute=compute, ag=compute + ag + opt, rs=compute + e_rs + opt, ring=compute + e_ring + opt,
                t_ag=ag, t_rs=rs, t_ring=ring, e_rs=e_rs, e_ring=e_ring)


def strong(model, net, N, M=128):
    """The configuration at its own global batch (M micro-batches of batch/M examples) on N machines: step times
    allgather, reduce_scatter, ring. Only the backward of the rank's last micro-batch hides the exchange."""
    _, alpha, beta = net
    P, K = model["P"], buckets(model["P"])
    compute = model["batch"] * model["t_ex"] / CORES / N
    window = BACKWARD * compute / (M // N)
    opt = OPT_PER_PARAM * P
    if N == 1:
        return compute + opt, compute + opt, compute + opt
    rs = exposed(t_reduce_scatter(N, P, alpha, beta, TAU_SERVER, K), K, window, model["layers"], model["tail"])
    ring = exposed(t_ring(N, P, alpha, beta, TAU_SERVER, K), K, window, model["layers"], model["tail"])
    return compute + t_allgather(N, P, alpha, beta, TAU_SERVER) + opt, compute + rs + opt, compute + ring + opt


def fmt_s(t):
    return "%.2f s" % t if t < 10 else "%.1f s" % t


def fmt_n(x):
    return "never (< 2^20)" if x is None else ("%.0f" % x if x >= 20 else "%.1f" % x)


def tables():
    print("Weak scaling (M = N), step time (efficiency = compute / step): allgather + tree | reduce-scatter by bucket "
          "overlapped with backward | ring allreduce overlapped (not bitwise)\n")
    print("| model | network | compute | N | allgather | reduce_scatter | ring allreduce | exposed rs / ring |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for m in MODELS:
        for net in NETWORKS:
            for N in SIZES:
                w = weak(m, net, N)
                c = w["compute"]
                print("| %s | %s | %.2f s | %d | %s (%.0f%%) | %s (%.0f%%) | %s (%.0f%%) | %.0f / %.0f ms |" % (
                    m["name"], net[0], c, N, fmt_s(w["ag"]), 100 * c / w["ag"], fmt_s(w["rs"]), 100 * c / w["rs"],
                    fmt_s(w["ring"]), 100 * c / w["ring"], 1e3 * w["e_rs"], 1e3 * w["e_ring"]))
    print("\nN where the exchange equals the compute (its whole time; and, for the overlapped exchanges, the N where"
          " what stays exposed does):\n")
    print("| model | network | allgather | reduce_scatter | exposed reduce_scatter | ring allreduce | exposed ring |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for m in MODELS:
        for net in NETWORKS:
            P, K = m["P"], buckets(m["P"])
            _, alpha, beta = net
            c = m["batch"] * m["t_ex"] / CORES
            win = BACKWARD * c
            ag = crossing(lambda n: t_allgather(n, P, alpha, beta, TAU_SERVER), c)
            rs = crossing(lambda n: t_reduce_scatter(n, P, alpha, beta, TAU_SERVER, K), c)
            ring = crossing(lambda n: t_ring(n, P, alpha, beta, TAU_SERVER, K), c)
            ers = crossing(lambda n: exposed(t_reduce_scatter(n, P, alpha, beta, TAU_SERVER, K), K, win, m["layers"],
                                             m["tail"]), c)
            ering = crossing(lambda n: exposed(t_ring(n, P, alpha, beta, TAU_SERVER, K), K, win, m["layers"],
                                               m["tail"]), c)
            print("| %s | %s | %s | %s | %s | %s | %s |" % (m["name"], net[0], fmt_n(ag), fmt_n(rs), fmt_n(ers),
                                                            fmt_n(ring), fmt_n(ering)))
    print("\nThe price of the fixed order: reduce-scatter against ring allreduce, step time at N (overlapped):\n")
    print("| model | network | N = 8 | N = 32 | N = 128 |")
    print("| --- | --- | --- | --- | --- |")
    for m in MODELS:
        for net in NETWORKS:
            cells = []
            for N in SIZES:
                w = weak(m, net, N)
                cells.append("+%.1f ms (%.1f%%)" % (1e3 * (w["rs"] - w["ring"]), 100 * (w["rs"] / w["ring"] - 1)))
            print("| %s | %s | %s |" % (m["name"], net[0], " | ".join(cells)))
    print("\nStrong scaling, %s at its global batch of %d (M = %d), step time allgather / reduce_scatter / ring:\n"
          % (MODELS[0]["name"], MODELS[0]["batch"], MODELS[0]["batch"]))
    print("| network | N = 1 | N = 8 | N = 32 | N = 128 |")
    print("| --- | --- | --- | --- | --- |")
    for net in NETWORKS:
        cells = []
        for N in [1] + SIZES:
            a, r, g = strong(MODELS[0], net, N, MODELS[0]["batch"])
            cells.append("%.3g s" % a if N == 1 else "%.3g / %.3g / %.3g s" % (a, r, g))
        print("| %s | %s |" % (net[0], " | ".join(cells)))
    print("\nConstants: cores %d, tau %.2g s/element, AdamW %.2g s/parameter, backward %.2f of compute, buckets of "
          "%.0f MB (paper %d, bert-base %d)" % (CORES, TAU_SERVER, OPT_PER_PARAM, BACKWARD, BUCKET_BYTES / 1e6,
                                                buckets(MODELS[0]["P"]), buckets(MODELS[1]["P"])))


def fit(paths):
    comm, step = [], []
    for p in paths:
        with open(p) as f:
            for line in f:
                if line.strip():
                    j = json.loads(line)
                    (comm if j.get("bench") == "comm" else step).append(j)
    fitted = {}
    for R in sorted({c["ranks"] for c in comm}):
        cs = sorted((c for c in comm if c["ranks"] == R), key=lambda c: c["floats"])
        small = cs[0]
        big = [c for c in cs if 4 * c["floats"] >= 4 << 20]
        # alpha: the smallest buffer's time per round; beta: bytes per second of the large buffers (per round);
        # tau: the tree's seconds per element added, large buffers
        alpha_ag = small["allgather_s"] / (R - 1)
        alpha_a2a = small["alltoall_s"] / (R - 1)
        beta_ag = sum(4 * c["floats"] * (R - 1) for c in big) / sum(c["allgather_s"] for c in big)
        per = [4 * math.ceil(c["floats"] / R) * (R - 1) for c in big]
        beta_a2a = sum(per) / sum(c["alltoall_s"] for c in big)
        beta_sag = sum(per) / sum(c["slice_allgather_s"] for c in big)
        tau = sum(c["tree_s"] for c in big) / sum(c["floats"] * (R - 1) for c in big)
        tau_slice = sum(c["slice_tree_s"] for c in big) / sum(math.ceil(c["floats"] / R) * (R - 1) for c in big)
        fitted[R] = dict(alpha=alpha_ag, beta=beta_ag, tau=tau)
        print("R = %d: alpha %.2f us (allgather) %.2f us (alltoall); beta %.2f GB/s (allgather) %.2f GB/s (alltoall)"
              " %.2f GB/s (slice allgather); tau %.2f ns (tree) %.2f ns (slice tree)" % (
                  R, 1e6 * alpha_ag, 1e6 * alpha_a2a, beta_ag / 1e9, beta_a2a / 1e9, beta_sag / 1e9, 1e9 * tau,
                  1e9 * tau_slice))
        for c in cs:
            n = c["floats"]
            K = c.get("buckets", 1)
            print("  %10d floats: allgather+tree %.3g s (model %.3g), reduce-scatter %.3g s (model %.3g)" % (
                n, c["reducer_allgather_s"], t_allgather(R, n, alpha_ag, beta_ag, tau), c["reducer_reduce_scatter_s"],
                t_reduce_scatter(R, n, alpha_a2a, 0.5 * (beta_a2a + beta_sag), tau_slice, K)))
    for s in step:
        R, P = s["ranks"], s["parameters"]
        k = fitted.get(R) or (fitted and fitted[min(fitted)]) or LOOPBACK
        cfg = BENCH_CONFIGS.get(s["config"], dict(layers=1, tail=1.0))
        window = BACKWARD * s["compute_s"] / (s["micro_batches"] // R)  # the backward of the rank's last micro-batch
        if s["exchange"] == "allgather":
            model = t_allgather(R, P, k["alpha"], k["beta"], k["tau"])
            model_exposed = model
        else:
            model = t_reduce_scatter(R, P, k["alpha"], k["beta"], k["tau"], s["buckets"])
            model_exposed = exposed(model, s["buckets"], window, cfg["layers"], cfg["tail"])
        print("step %s R = %d %s: step %.3f s, compute %.3f s, exposed %.1f ms (%.1f%% of the step), hidden %.1f ms "
              "(%.0f%% of the exchange); model: exchange %.1f ms, exposed %.1f ms" % (
                  s["config"], R, s["exchange"], s["s_per_step"], s["compute_s"], 1e3 * s["exposed_s"],
                  100 * s["exposed_share"], 1e3 * s["hidden_s"], 100 * s["hidden_share"], 1e3 * model,
                  1e3 * model_exposed))


def check(doc):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        tables()
    rows = [l.strip() for l in out.getvalue().splitlines() if l.startswith("|")]
    with open(doc) as f:
        have = {l.strip() for l in f}
    missing = [r for r in rows if r not in have]
    if missing:
        print("dist model: %d of the %d table rows of the predictions are not in %s:\n%s" % (
            len(missing), len(rows), doc, "\n".join(missing)))
        return 1
    print("dist model: the %d table rows of the predictions are in %s: ok" % (len(rows), doc))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fit", nargs="+", metavar="JSONL", help="bench_dist output: refit the loopback constants")
    ap.add_argument("--check", metavar="MARKDOWN", help="the page whose tables must be this model's output")
    a = ap.parse_args()
    if a.check:
        return check(a.check)
    if a.fit:
        fit(a.fit)
    else:
        tables()
    return 0


if __name__ == "__main__":
    sys.exit(main())
