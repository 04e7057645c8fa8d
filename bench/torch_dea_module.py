"""The PyTorch training step of the reference's TransformerModel with its own Dual-Expert layer (PyTorch eager mode,
bench/torch_train.py's model and bench/torch_dea.py's layer) against the same model with dea.torch's layer
(examples/python/train_torch.py's model): seconds per step and peak memory, on 1 and 2 threads.

Each measurement runs in a process of its own (so its peak RSS is its own), the two sides alternating, configuration
by configuration, --reps times; the table gives the median of the reps. A step is what the reference's train.py does:
forward with an oracle block per sequence and gamma_mix 0.5, loss = task_loss + loss_gate, backward, clipping of
each group to norm 1, AdamW. The table gives wall time and the process's CPU time per step (the sum over its
threads: on one thread the less load-sensitive figure). The batches are D_alpha-shaped: [CLS] A [SEP] B [SEP] with the oracle on the A x B
block, every sequence T tokens. Threads: OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, torch.set_num_threads and
dea.set_num_threads; OMP_WAIT_POLICY=PASSIVE (unless set) and OPENBLAS_CORETYPE=SkylakeX (--openblas-coretype).

    PYTHONPATH=build/release/python /usr/bin/python3 bench/torch_dea_module.py --reps 3

prints one JSON line per measurement and a Markdown table.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = {  # name: (d_model, heads, layers, d_ff, batch, T)
    "quick": (128, 4, 2, 256, 32, 32),
    "mid": (256, 8, 4, 1024, 64, 64),
}


def child(impl, config, threads, steps, warmup, seed):
    sys.dont_write_bytecode = True
    sys.path.insert(0, HERE)
    sys.path.insert(0, os.path.join(HERE, "..", "examples", "python"))
    sys.argv = [sys.argv[0]]  # torch_train reads its own flags at import
    import torch_train  # noqa: E402  (sets OPENBLAS_CORETYPE if unset, before torch is imported)
    import torch  # noqa: E402
    import dea  # noqa: E402
    import dea.torch  # noqa: E402
    import train_torch  # noqa: E402  (the model with dea's layer)

    torch.set_num_threads(threads)
    dea.set_num_threads(threads)
    D, H, L, F, B, T = CONFIGS[config]
    vocab, dropout = 1000, 0.1
    torch.manual_seed(seed)
    if impl == "torch":
        model = torch_train.TransformerModel(vocab, D, H, L, F, 512, dropout)
        run = lambda ids, tt, am, oracle, labels: model(ids, tt, am, oracle, 0.5, labels)  # noqa: E731
    else:  # "dea" or "dea-tiled" (the layer's tiled kernel: row statistics instead of the [T, T] maps)
        kernel = "tiled" if impl == "dea-tiled" else "reference"
        attention = lambda d, h, dropout: dea.torch.DualExpertAttention(d, h, dropout=dropout, kernel=kernel)  # noqa
        model = train_torch.TransformerModel(vocab, D, H, L, F, 512, dropout, attention=attention)
        run = lambda ids, tt, am, oracle, labels: model(ids, tt, am, oracle, 0.5, labels)[1:3]  # noqa: E731
    is_gate = lambda n: n.split(".")[-1] in ("W_gate", "w_gate", "c_gate")  # noqa: E731
    groups = [{"params": [p for n, p in model.named_parameters() if not is_gate(n)], "lr": 3e-4, "weight_decay": 0.01},
              {"params": [p for n, p in model.named_parameters() if is_gate(n)], "lr": 1e-3, "weight_decay": 0.0}]
    assert len(groups[1]["params"]) == 2 * L
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    opt = torch.optim.AdamW(groups)
    rss_model = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    g = torch.Generator().manual_seed(seed + 1)
    model.train()
    times, cpu = [], []
    for step in range(warmup + steps):
        ids = torch.randint(5, vocab, (B, T), generator=g)
        a = T // 2 - 1  # [CLS] A [SEP] B [SEP]: A = tokens 1..a, B = tokens a+2..T-2
        ids[:, 0], ids[:, a + 1], ids[:, T - 1] = 2, 3, 3
        tt = torch.zeros(B, T, dtype=torch.long)
        tt[:, a + 2:] = 1
        am = torch.ones(B, T, dtype=torch.long)
        oracle = torch.full((B, T, T), float("nan"))
        oracle[:, 1:a + 1, a + 2:T - 1] = torch.rand(B, 1, 1, generator=g) * 0.95
        labels = torch.randint(0, 2, (B,), generator=g)
        t0, c0 = time.perf_counter(), time.process_time()
        task, loss_gate = run(ids, tt, am, oracle, labels)
        opt.zero_grad()
        (task + loss_gate).backward()
        for group in opt.param_groups:
            torch.nn.utils.clip_grad_norm_(group["params"], 1.0)
        opt.step()
        if step >= warmup:
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    print(json.dumps({"impl": impl, "config": config, "threads": threads, "shape": "D%d H%d L%d F%d B%d T%d" % (
        D, H, L, F, B, T), "s_per_step": statistics.median(times), "cpu_s_per_step": statistics.median(cpu), "steps": steps,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "rss_after_model_mb": round(rss_model), "blas": torch_train.blas_info().get("core"),
        "task_loss_last": float(task)}))


def load():
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="quick,mid")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--impls", default="torch,dea", help="torch (the reference layer), dea, dea-tiled")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--openblas-coretype", default="SkylakeX",
                    help="OPENBLAS_CORETYPE of the measured processes (the kernels torch's products run on)")
    ap.add_argument("--child", nargs=3, metavar=("IMPL", "CONFIG", "THREADS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        impl, config, threads = args.child
        return child(impl, config, int(threads), args.steps, args.warmup, args.seed)
    results = {}
    impls = args.impls.split(",")
    assert impls[0] == "torch" and set(impls) <= {"torch", "dea", "dea-tiled"}, "--impls: torch first, then dea[-tiled]"
    print("# load average at start: %s" % load(), flush=True)
    for config in args.configs.split(","):
        for rep in range(args.reps):
            for threads in [int(t) for t in args.threads.split(",")]:
                for impl in impls:  # alternating, one process each
                    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
                               OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"),
                               OPENBLAS_CORETYPE=args.openblas_coretype,
                               PYTHONDONTWRITEBYTECODE="1")
                    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", impl, config,
                                          str(threads), "--steps", str(args.steps), "--warmup", str(args.warmup),
                                          "--seed", str(args.seed)], env=env, capture_output=True, text=True)
                    if out.returncode != 0:
                        sys.exit("torch_dea_module: %s %s %s failed:\n%s" % (impl, config, threads, out.stderr))
                    line = json.loads(out.stdout.strip().splitlines()[-1])
                    line["rep"], line["load"] = rep, load()
                    print(json.dumps(line), flush=True)
                    results.setdefault((config, threads, impl), []).append(line)
    print("# load average at end: %s" % load())
    print("\n| configuration | threads | layer | s/step | speed-up over the reference layer | CPU s/step | peak RSS MB |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for config in args.configs.split(","):
        for threads in [int(t) for t in args.threads.split(",")]:
            ts = statistics.median(x["s_per_step"] for x in results[(config, threads, "torch")])
            for impl in impls:
                r = results[(config, threads, impl)]
                s = statistics.median(x["s_per_step"] for x in r)
                print("| %s (%s) | %d | %s | %.3f | %.2fx | %.3f | %d |" % (
                    config, r[0]["shape"], threads, {"torch": "reference (PyTorch)", "dea": "dea.torch",
                                                     "dea-tiled": "dea.torch, tiled"}[impl],
                    s, ts / s, statistics.median(x["cpu_s_per_step"] for x in r),
                    statistics.median(x["peak_rss_mb"] for x in r)))


if __name__ == "__main__":
    main()
