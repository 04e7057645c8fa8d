"""PyTorch side of bench_dea_bert: one DualExpertBert fine-tuning step in eager mode, written by us following the
reference's DualExpertBert (bert.md section 7) and the Dual-Expert Attention specification, the way a PyTorch user
runs it (autograd on CPU).

The model, as the reference builds it from a BertModel (random weights here, HF init: N(0, 0.02) weights, zero
biases, LayerNorm 1 / 0, a zero padding row):
  embeddings: LN(word[ids] + position[0..T-1] + token_type[tt]) (eps 1e-12), dropout
  every layer (post-LN): the self-attention is a Dual-Expert adapter without output projection (bench/torch_dea.py's
  DualExpertLayer with its W_o replaced by the identity, dropout on the attention probabilities as in
  bench/torch_train.py), key mask = attention_mask, every layer given the same oracle and gamma_mix;
  h1 = LN(Dropout(attention.output.dense(ctx)) + h); h2 = LN(Dropout(output.dense(GELU(intermediate.dense(h1)))) + h1)
  the pooler exists and is unused; cls_head = Dropout(0.1), Linear(H, 2) on last_hidden_state[:, 0]
  loss = CE(logits, labels) + (sum of the layers' gate losses) / L
  AdamW groups: gate = every parameter named w_gate / c_gate (lr 1e-3, no weight decay), main = the rest (lr 2e-5,
  weight decay 0.01); each group clipped to norm 1.0 with clip_grad_norm_ before the step.
The batch is bench_dea_bert's (the same formula, see its file comment): --batch rows of --tokens tokens,
[CLS] premise [SEP] hypothesis [SEP], no padding, the oracle NaN except the premise x hypothesis block of each row.

    OPENBLAS_CORETYPE=SkylakeX /usr/bin/python3 bench/torch_dea_bert.py --config base --threads 1 --steps 3 --warmup 1

It prints one JSON line per thread count with the fields of bench_dea_bert (impl "torch"); its yardstick is
torch.mm on 256 x 256 float matrices with the thread count (OpenBLAS's own product), reported as
yardstick_gflops with yardstick "torch.mm 256"; bench/compare_dea_bert.py also gives torch's GFLOP/s as a
fraction of dea's yardstick of the same run. Needs Debian's python3-torch and libopenblas0-pthread; OpenBLAS's
fallback kernels are replaced as bench/torch_train.py does (--openblas-coretype). --precision bf16 runs the forward
and the loss under torch.autocast("cpu", dtype=torch.bfloat16) (bench/torch_train.py's autocast: the products in
bf16, parameters, gradients and AdamW's state float32); the yardstick then multiplies bf16 matrices.
"""
import argparse
import json
import math
import os
import resource
import sys
import time

sys.dont_write_bytecode = True  # no bench/__pycache__ in the source tree


def _pin_blas_threads(argv):
    """With one thread count, OpenBLAS's own pool gets that size before torch loads it (torch.set_num_threads
    alone left OpenBLAS's threads spinning beside the caller here: 256 x 256 products ran 10x slower)."""
    for i, arg in enumerate(argv):
        v = arg.split("=", 1)[1] if arg.startswith("--threads=") else (
            argv[i + 1] if arg == "--threads" and i + 1 < len(argv) else None)
        if v is not None and v.isdigit():
            for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
                os.environ.setdefault(var, v)


_pin_blas_threads(sys.argv[1:])
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_train  # noqa: E402  sets OPENBLAS_CORETYPE before torch loads; adds attention dropout to torch_dea
import torch_dea  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

CONFIGS = {"base": dict(hidden=768, layers=12, heads=12, intermediate=3072),
           "tiny": dict(hidden=128, layers=2, heads=2, intermediate=512)}
VOCAB, POSITIONS, TYPES, EPS, DROPOUT = 30522, 512, 2, 1e-12, 0.1


class DeaSelfAttention(nn.Module):
    """attention.self of a DualExpertBert layer: the adapter around a Dual-Expert layer with out_proj = False."""

    def __init__(self, hidden, heads, p_attn):
        super().__init__()
        self.dea = torch_dea.DualExpertLayer(hidden, heads)
        self.dea.proj[3] = nn.Identity()  # no W_o: BERT's attention.output.dense is the output projection
        self.p_attn = p_attn

    def forward(self, h, key_mask, oracle, gamma):
        torch_train._attn_torch.p, torch_train._attn_torch.training = self.p_attn, self.training
        ctx, _, loss_gate = self.dea(h, key_mask=key_mask, oracle=oracle, gamma=gamma)
        return ctx, loss_gate


class Layer(nn.Module):
    def __init__(self, hidden, heads, inter):
        super().__init__()
        self.attn = DeaSelfAttention(hidden, heads, DROPOUT)
        self.attn_dense = nn.Linear(hidden, hidden)
        self.attn_ln = nn.LayerNorm(hidden, eps=EPS)
        self.inter = nn.Linear(hidden, inter)
        self.out = nn.Linear(inter, hidden)
        self.out_ln = nn.LayerNorm(hidden, eps=EPS)

    def forward(self, h, key_mask, oracle, gamma):
        ctx, loss_gate = self.attn(h, key_mask, oracle, gamma)
        h1 = self.attn_ln(F.dropout(self.attn_dense(ctx), DROPOUT, self.training) + h)
        h2 = self.out_ln(F.dropout(self.out(F.gelu(self.inter(h1))), DROPOUT, self.training) + h1)
        return h2, loss_gate


class DualExpertBert(nn.Module):
    def __init__(self, hidden, layers, heads, intermediate, n_classes=2):
        super().__init__()
        self.word = nn.Embedding(VOCAB, hidden, padding_idx=0)
        self.pos = nn.Embedding(POSITIONS, hidden)
        self.token_type = nn.Embedding(TYPES, hidden)
        self.emb_ln = nn.LayerNorm(hidden, eps=EPS)
        self.layers = nn.ModuleList(Layer(hidden, heads, intermediate) for _ in range(layers))
        self.pooler = nn.Linear(hidden, hidden)  # kept, unused
        self.cls = nn.Linear(hidden, n_classes)  # cls_head.1 (PyTorch's default init)
        self._bert_init()

    def _bert_init(self):
        for name, m in self.named_modules():
            if name == "cls":
                continue
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
                if isinstance(m, nn.Linear):
                    nn.init.zeros_(m.bias)
        with torch.no_grad():
            self.word.weight[0].zero_()

    def forward(self, ids, tt, am, oracle, gamma, labels):
        T = ids.shape[1]
        x = self.emb_ln(self.word(ids) + self.pos(torch.arange(T))[None] + self.token_type(tt))
        x = F.dropout(x, DROPOUT, self.training)
        km = am.bool()
        gate = []
        for layer in self.layers:
            x, lg = layer(x, km, oracle, gamma)
            gate.append(lg)
        logits = self.cls(F.dropout(x[:, 0], 0.1, self.training))
        return F.cross_entropy(logits, labels), torch.stack(gate).sum() / len(self.layers)


def make_batch(B, T):
    """bench_dea_bert's batch (its file comment gives the formula)."""
    na = (T - 3) // 2
    sep1 = 1 + na
    r = torch.arange(B).view(B, 1)
    t = torch.arange(T).view(1, T)
    ids = 1000 + (7919 * r + 104729 * t) % 29000
    ids[:, 0] = 101
    ids[:, sep1] = 102
    ids[:, T - 1] = 102
    tt = (t > sep1).long().expand(B, T).contiguous()
    am = torch.ones(B, T, dtype=torch.long)
    labels = torch.arange(B) % 2
    oracle = torch.full((B, T, T), float("nan"))
    for b in range(B):
        oracle[b, 1:sep1, sep1 + 1:T - 1] = 0.05 + 0.9 * ((37 * b) % 32) / 31.0
    return ids, tt, am, oracle, labels


def step_gflop(c, B, T, n_classes=2):
    N, H, I, d = B * T, c["hidden"], c["intermediate"], c["hidden"] / c["heads"]
    linear = c["layers"] * 6 * N * (4 * H * H + 2 * H * I) + 6 * B * H * n_classes
    attention = c["layers"] * 3 * B * c["heads"] * (6 * T * T * d + 2 * T * d * d)
    return linear / 1e9, attention / 1e9


def torch_yardstick(reps=3, iters=40, dtype=None):
    a, b = torch.randn(256, 256, dtype=dtype), torch.randn(256, 256, dtype=dtype)
    torch.mm(a, b)
    rates = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(iters):
            torch.mm(a, b)
        rates.append(2.0 * 256 ** 3 * iters / (time.perf_counter() - t0) / 1e9)
    return sorted(rates)[len(rates) // 2]


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", choices=sorted(CONFIGS), default="base")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--gamma", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--openblas-coretype", default="auto",
                    help="auto (default: replace a fallback core), native (never override) or an OpenBLAS core name")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                    help='bf16: forward and loss under torch.autocast("cpu", dtype=torch.bfloat16)')
    a = ap.parse_args()
    if a.steps < 1 or a.warmup < 0 or a.batch < 1 or not 5 <= a.tokens <= POSITIONS or not 0 <= a.gamma <= 1:
        ap.error("--steps >= 1, --warmup >= 0, --batch >= 1, --tokens in [5, 512], --gamma in [0, 1]")
    c = CONFIGS[a.config]
    gl, ga = step_gflop(c, a.batch, a.tokens)
    for th in [int(x) for x in a.threads.split(",") if x]:
        torch.set_num_threads(th)
        torch.manual_seed(a.seed)
        t0 = time.perf_counter()
        model = DualExpertBert(**c)
        model.train()
        named = list(model.named_parameters())
        gate = [p for n, p in named if "w_gate" in n or "c_gate" in n]
        main_ = [p for n, p in named if not ("w_gate" in n or "c_gate" in n)]
        opt = torch.optim.AdamW([{"params": main_, "lr": 2e-5, "weight_decay": 0.01},
                                 {"params": gate, "lr": 1e-3, "weight_decay": 0.0}])
        n_params = sum(p.numel() for _, p in named)
        print(f"[torch {a.config} threads={th}] model built: {n_params} parameters ({time.perf_counter() - t0:.2f} s)",
              file=sys.stderr, flush=True)
        yard = torch_yardstick(dtype=torch.bfloat16 if a.precision == "bf16" else torch.float32)
        t_total, t_cpu, t_fwd, t_bwd, t_opt = [], [], [], [], []
        first = None
        load_before = torch_train.load1()
        for s in range(1, a.warmup + a.steps + 1):
            ids, tt, am, oracle, labels = make_batch(a.batch, a.tokens)
            c0, t0 = time.process_time(), time.perf_counter()
            with torch_train.autocast(a.precision):
                task, lg = model(ids, tt, am, oracle, a.gamma, labels)
                loss = task + lg
            ft = time.perf_counter()
            opt.zero_grad()
            loss.backward()
            bw = time.perf_counter()
            torch.nn.utils.clip_grad_norm_(main_, 1.0)
            torch.nn.utils.clip_grad_norm_(gate, 1.0)
            opt.step()
            e, c1 = time.perf_counter(), time.process_time()
            tl, glv = task.item(), lg.item()
            if not (math.isfinite(tl) and math.isfinite(glv)):
                sys.exit(f"torch_dea_bert: non-finite loss at step {s}")
            if s == 1:
                first = (tl, glv)
            warm = " (warm-up)" if s <= a.warmup else ""
            print(f"[torch {a.config} threads={th}] step {s}/{a.warmup + a.steps}{warm}: {e - t0:.3f} s (forward "
                  f"{ft - t0:.3f}, backward {bw - ft:.3f}, optim {e - bw:.3f}; task {tl:.4f}, gate {glv:.4f})",
                  file=sys.stderr, flush=True)
            if s <= a.warmup:
                continue
            t_total.append(e - t0)
            t_cpu.append(c1 - c0)
            t_fwd.append(ft - t0)
            t_bwd.append(bw - ft)
            t_opt.append(e - bw)
        med = median(t_total)
        print(json.dumps(dict(
            bench="dea_bert_step", impl="torch", precision=a.precision, torch_version=torch.__version__,
            config=a.config, **c,
            vocab_size=VOCAB, batch=a.batch, tokens=a.tokens, params=n_params, threads=th, steps=a.steps,
            warmup=a.warmup, gamma=a.gamma, s_per_step=med, s_min=min(t_total), s_max=max(t_total),
            cpu_s_per_step=median(t_cpu),
            phase_s=dict(forward=median(t_fwd), backward=median(t_bwd), optim=median(t_opt)),
            gflop=round(gl + ga, 3), gflop_linear=round(gl, 3), gflop_attention=round(ga, 3),
            gflops=(gl + ga) / med, yardstick="torch.mm 256" + (" bf16" if a.precision == "bf16" else ""),
            yardstick_gflops=yard,
            frac_yardstick=(gl + ga) / med / yard, first_task_loss=first[0], first_loss_gate=first[1],
            peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            load1_before=load_before, load1_after=torch_train.load1(), blas=torch_train.blas_info())), flush=True)
        del model, opt


if __name__ == "__main__":
    main()
