"""PyTorch re-creation of the reference's transformer training step (the Dual-Expert Attention specification, sections
2-5), the side-by-side anchor for bench_train: the same model, loss, clipping and optimiser as the reference's
transformer.py / train.py, run the way a PyTorch user runs them (eager mode, autograd, CPU).

The attention layer is bench/torch_dea.py's DualExpertLayer (an independent implementation, numerically identical
to the reference's DualExpertAttention) with the reference's dropout on the attention probabilities added; around
it, as transformer.py builds it:
  x = Dropout(tok_emb[ids] * sqrt(D) + seg_emb[token_type_ids] + PE[:T])     tok_emb N(0, 1/D), padding_idx 0
  each layer (pre-LN): x += Dropout(Attn(LN1(x))); x += Dropout(FFN(LN2(x))), FFN = Linear, exact GELU, Dropout,
  Linear; final LayerNorm; cls head Linear(D, D), tanh, Dropout, Linear(D, 2) on position 0; the mlm head's own
  bias (its weight is tok_emb's) exists but gets no gradient;
  loss = CE(logits, labels) + sum of the layers' gate losses / n_layers (every layer gets the oracle);
  AdamW, groups "gate" (W_gate, c_gate: lr 1e-3, no weight decay) and "main" (lr 3e-4, weight decay 0.01), each
  group's gradient clipped to norm 1.0 with clip_grad_norm_ before the step.

The batches come from a file written by `bench_train --dump-batches FILE` (the D_alpha training batches of the
same run, so both sides train on the same tokens). Run with Debian's python3-torch:

    /usr/bin/python3 bench/torch_train.py --batches quick.jsonl --threads 1 --steps 10 --warmup 2

It prints one JSON line with the fields of bench_train (impl "torch"): s/step (median over --steps steps after
--warmup), examples/s, CPU time per step, phases, mean T, the losses of step 1, peak RSS (also after building the
model and after each phase of step 1) and the load average.
--check also prints the parameter counts (total, main group, gate group) to stderr.
--precision bf16 runs the forward and the loss under torch.autocast("cpu", dtype=torch.bfloat16), as a PyTorch user
trains in mixed precision on a CPU (autocast's bf16 list, the products, in bf16; its float list in float; the
parameters, gradients and AdamW's state float32; backward outside the region); the line has "precision".

OpenBLAS kernels: Debian's OpenBLAS picks its kernels from the CPU model, and on a virtual machine that hides the
model (CPUID "Intel(R) Xeon(R) Processor") it falls back to its oldest x86-64 kernels ("Prescott", SSE3), about 4x
slower at GEMM (25 against 115 GFLOP/s on one core here). That would flatter the C++ side, so by default
(--openblas-coretype auto) a fallback core is replaced, before torch loads OpenBLAS, by the best kernels the CPU's
flags allow (SkylakeX with AVX-512 F/BW/VL/DQ, else Haswell with AVX2 + FMA) through OPENBLAS_CORETYPE. A core
OpenBLAS recognised, or OPENBLAS_CORETYPE set by the caller, is left alone; --openblas-coretype native never
overrides, NAME always sets NAME. The JSON line reports the kernels used ("blas").
"""
import argparse
import contextlib
import ctypes
import json
import math
import os
import resource
import subprocess
import sys
import time

# cores of OpenBLAS's DYNAMIC_ARCH list that use neither AVX2 nor AVX-512: what it falls back to on a hidden CPU
_OPENBLAS_OLD_CORES = {'Katmai', 'Coppermine', 'Northwood', 'Prescott', 'Banias', 'Core2', 'Penryn', 'Dunnington',
                       'Nehalem', 'Atom', 'Sandybridge', 'Opteron', 'Opteron_SSE3', 'Barcelona', 'Bobcat', 'Bulldozer',
                       'Piledriver', 'Steamroller', 'Excavator'}
_PROBE = ("import ctypes; lib = ctypes.CDLL('libblas.so.3'); f = lib.openblas_get_corename; "
          "f.restype = ctypes.c_char_p; print(f().decode())")


def _cpu_flags():
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('flags'):
                    return set(line.split(':', 1)[1].split())
    except OSError:
        pass
    return set()


def _setup_openblas(argv):
    """Sets OPENBLAS_CORETYPE (see the module comment) before torch is imported; returns what was decided."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument('--openblas-coretype', default='auto')
    choice = pre.parse_known_args(argv)[0].openblas_coretype
    info = {'requested': choice}
    if choice == 'native' or 'OPENBLAS_CORETYPE' in os.environ:
        info['coretype_env'] = os.environ.get('OPENBLAS_CORETYPE')
        return info
    if choice != 'auto':
        os.environ['OPENBLAS_CORETYPE'] = info['coretype_env'] = choice
        return info
    try:  # the core OpenBLAS detects by itself, asked in a separate process (a loaded library keeps its choice)
        detected = subprocess.run([sys.executable, '-c', _PROBE], capture_output=True, text=True,
                                  timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        detected = ''
    info['detected'] = detected or None
    flags = _cpu_flags()
    if detected in _OPENBLAS_OLD_CORES:
        if {'avx512f', 'avx512bw', 'avx512vl', 'avx512dq'} <= flags:
            os.environ['OPENBLAS_CORETYPE'] = info['coretype_env'] = 'SkylakeX'
        elif {'avx2', 'fma'} <= flags:
            os.environ['OPENBLAS_CORETYPE'] = info['coretype_env'] = 'Haswell'
    return info


_BLAS = _setup_openblas(sys.argv[1:])

import torch  # noqa: E402  (after OPENBLAS_CORETYPE is set)
import torch.nn.functional as F  # noqa: E402

sys.dont_write_bytecode = True  # no bench/__pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_dea  # noqa: E402  (bench/torch_dea.py)


class _TorchWithAttentionDropout:
    """Stands in for the `torch` module inside torch_dea, so that DualExpertLayer's `torch.softmax(s, -1) @ v`
    becomes `Dropout(softmax(s)) @ v` as in the reference (dropout on the attention probabilities, inverted
    scaling, training only). Every other attribute is torch's own, so the layer's maths is untouched."""

    p = 0.0
    training = False

    def __getattr__(self, name):
        return getattr(torch, name)

    def softmax(self, x, dim):
        return F.dropout(torch.softmax(x, dim), self.p, self.training)


_attn_torch = _TorchWithAttentionDropout()
torch_dea.torch = _attn_torch


class PositionalEncoding(torch.nn.Module):
    def __init__(self, d_model, max_len):
        super().__init__()
        pos = torch.arange(max_len, dtype=torch.float32).unsqueeze(1)
        div = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, d_model)
        pe[:, 0::2] = torch.sin(pos * div)
        pe[:, 1::2] = torch.cos(pos * div)
        self.register_buffer('pe', pe.unsqueeze(0))

    def forward(self, x):
        return x + self.pe[:, :x.size(1)]


class EncoderLayer(torch.nn.Module):
    def __init__(self, d_model, heads, d_ff, dropout):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(d_model)
        self.attn = torch_dea.DualExpertLayer(d_model, heads)
        self.ln2 = torch.nn.LayerNorm(d_model)
        self.ff = torch.nn.Sequential(torch.nn.Linear(d_model, d_ff), torch.nn.GELU(), torch.nn.Dropout(dropout),
                                      torch.nn.Linear(d_ff, d_model))
        self.drop1 = torch.nn.Dropout(dropout)
        self.drop2 = torch.nn.Dropout(dropout)
        self.p_attn = dropout

    def forward(self, x, key_mask, oracle, gamma):
        _attn_torch.p, _attn_torch.training = self.p_attn, self.training
        a, _, loss_gate = self.attn(self.ln1(x), key_mask=key_mask, oracle=oracle, gamma=gamma)
        x = x + self.drop1(a)
        x = x + self.drop2(self.ff(self.ln2(x)))
        return x, loss_gate


class TransformerModel(torch.nn.Module):
    def __init__(self, vocab, d_model, heads, n_layers, d_ff, max_len, dropout, n_classes=2, pad_id=0):
        super().__init__()
        self.d_model = d_model
        self.tok_emb = torch.nn.Embedding(vocab, d_model, padding_idx=pad_id)
        torch.nn.init.normal_(self.tok_emb.weight, 0.0, d_model ** -0.5)  # the whole table, pad row included
        self.seg_emb = torch.nn.Embedding(2, d_model)
        self.pos = PositionalEncoding(d_model, max_len)
        self.drop = torch.nn.Dropout(dropout)
        self.layers = torch.nn.ModuleList(EncoderLayer(d_model, heads, d_ff, dropout) for _ in range(n_layers))
        self.ln_f = torch.nn.LayerNorm(d_model)
        self.cls_head = torch.nn.Sequential(torch.nn.Linear(d_model, d_model), torch.nn.Tanh(),
                                            torch.nn.Dropout(dropout), torch.nn.Linear(d_model, n_classes))
        self.mlm_head = torch.nn.Linear(d_model, vocab)
        self.mlm_head.weight = self.tok_emb.weight  # tied

    def forward(self, ids, token_type_ids, attention_mask, oracle, gamma, labels):
        km = attention_mask.bool()
        x = self.tok_emb(ids) * math.sqrt(self.d_model) + self.seg_emb(token_type_ids)
        x = self.drop(self.pos(x))
        gate = []
        for layer in self.layers:
            x, lg = layer(x, km, oracle, gamma)
            gate.append(lg)
        logits = self.cls_head(self.ln_f(x)[:, 0])
        task = F.cross_entropy(logits, labels)
        loss_gate = torch.stack(gate).sum() / max(1, len(self.layers))
        return task, loss_gate


def blas_info():
    """The BLAS torch runs on: the OpenBLAS library loaded in this process and its kernels (core name)."""
    info = dict(_BLAS)
    with open('/proc/self/maps') as f:
        libs = sorted({line.split()[-1] for line in f if 'openblas' in line and line.split()[-1].startswith('/')})
    for path in libs:
        try:
            lib = ctypes.CDLL(path)
            lib.openblas_get_corename.restype = ctypes.c_char_p
            info.update(lib=path, core=lib.openblas_get_corename().decode())
            break
        except (OSError, AttributeError):
            continue
    else:
        info['core'] = None  # not OpenBLAS (or not loaded yet)
    return info


def load_batches(path):
    with open(path) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    if not lines or 'config' not in lines[0] or any('config' in b for b in lines[1:]):
        sys.exit(f'torch_train: {path}: expected the dump of one configuration (bench_train --config C --dump-batches)')
    return lines[0], lines[1:]


def to_tensors(b):
    B, T = b['B'], b['T']
    ids = torch.tensor(b['input_ids'], dtype=torch.long).view(B, T)
    tt = torch.tensor(b['token_type_ids'], dtype=torch.long).view(B, T)
    am = torch.tensor(b['attention_mask'], dtype=torch.long).view(B, T)
    labels = torch.tensor(b['labels'], dtype=torch.long)
    oracle = torch.full((B, T, T), float('nan'))
    for r, q0, q1, k0, k1, a in b['oracle_blocks']:
        oracle[r, q0:q1, k0:k1] = a
    return ids, tt, am, oracle, labels


def load1():
    try:
        with open('/proc/loadavg') as f:
            return float(f.read().split()[0])
    except OSError:
        return -1.0


def peak_rss_mb():
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def autocast(precision):
    """The mixed-precision region of the side-by-side scripts' --precision: bf16 autocast on the CPU (as a PyTorch
    user trains in bf16), or nothing for fp32."""
    if precision == 'bf16':
        return torch.autocast('cpu', dtype=torch.bfloat16)
    if precision != 'fp32':
        raise ValueError(f'precision {precision!r}: expected fp32 or bf16')
    return contextlib.nullcontext()


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--batches', required=True, help='file written by bench_train --dump-batches (one configuration)')
    ap.add_argument('--threads', type=int, default=1)
    ap.add_argument('--steps', type=int, default=10)
    ap.add_argument('--warmup', type=int, default=2)
    ap.add_argument('--gamma', type=float, default=0.5)
    ap.add_argument('--seed', type=int, default=42)
    ap.add_argument('--check', action='store_true', help='print the parameter counts to stderr')
    ap.add_argument('--openblas-coretype', default='auto',
                    help='auto (default: replace a fallback core), native (never override) or an OpenBLAS core name')
    ap.add_argument('--precision', choices=('fp32', 'bf16'), default='fp32',
                    help='bf16: forward and loss under torch.autocast("cpu", dtype=torch.bfloat16)')
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    head, batches = load_batches(args.batches)
    total = args.warmup + args.steps
    if len(batches) < total:
        sys.exit(f'torch_train: {args.batches} holds {len(batches)} batches, --warmup + --steps needs {total}')
    torch.manual_seed(args.seed)
    model = TransformerModel(head['vocab_size'], head['d_model'], head['n_heads'], head['n_layers'], head['d_ff'],
                             head['max_len'], head['dropout'], head['n_classes'], head['pad_id'])
    model.train()
    named = list(model.named_parameters())  # the tied mlm_head.weight is listed once (as tok_emb.weight)
    gate = [p for n, p in named if 'w_gate' in n or 'c_gate' in n]
    main_ = [p for n, p in named if not ('w_gate' in n or 'c_gate' in n)]
    opt = torch.optim.AdamW([{'params': main_, 'lr': 3e-4, 'weight_decay': 0.01},
                             {'params': gate, 'lr': 1e-3, 'weight_decay': 0.0}])
    n_params = sum(p.numel() for _, p in named)
    if args.check:
        print(json.dumps({'params': n_params, 'main': sum(p.numel() for p in main_),
                          'gate': sum(p.numel() for p in gate), 'tensors': len(named)}), file=sys.stderr)

    t_total, t_cpu, t_batch, t_fwd, t_bwd, t_opt, seq = [], [], [], [], [], [], []
    first = None
    rss_step1 = {'init': peak_rss_mb()}  # after building the model and optimiser, then after each phase of step 1
    load_before = load1()
    for s in range(1, total + 1):
        b = batches[s - 1]
        c0, a = time.process_time(), time.perf_counter()
        ids, tt, am, oracle, labels = to_tensors(b)
        bt = time.perf_counter()
        with autocast(args.precision):
            task, lg = model(ids, tt, am, oracle, args.gamma, labels)
            loss = task + lg
        ft = time.perf_counter()
        if s == 1:
            rss_step1['forward'] = peak_rss_mb()
        opt.zero_grad()
        loss.backward()
        bw = time.perf_counter()
        if s == 1:
            rss_step1['backward'] = peak_rss_mb()
        torch.nn.utils.clip_grad_norm_(main_, 1.0)
        torch.nn.utils.clip_grad_norm_(gate, 1.0)
        opt.step()
        e, c1 = time.perf_counter(), time.process_time()
        tl, gl = task.item(), lg.item()
        if not (math.isfinite(tl) and math.isfinite(gl)):
            sys.exit(f'torch_train: non-finite loss at step {s}')
        if s == 1:
            first = (tl, gl)
            rss_step1['optim'] = peak_rss_mb()
        warm = ' (warm-up)' if s <= args.warmup else ''
        print(f"[torch {head['config']} threads={args.threads}] step {s}/{total}{warm}: {e - a:.3f} s "
              f"(T={b['T']}, task {tl:.4f}, gate {gl:.4f})", file=sys.stderr, flush=True)
        if s <= args.warmup:
            continue
        t_total.append(e - a)
        t_cpu.append(c1 - c0)
        t_batch.append(bt - a)
        t_fwd.append(ft - bt)
        t_bwd.append(bw - ft)
        t_opt.append(e - bw)
        seq.append(b['T'])
    med = median(t_total)
    out = dict(bench='train_step', impl='torch', precision=args.precision, torch_version=torch.__version__,
               config=head['config'],
               d_model=head['d_model'], n_heads=head['n_heads'], n_layers=head['n_layers'], d_ff=head['d_ff'],
               batch=head['batch_size'], max_len=head['max_len'], vocab_size=head['vocab_size'], params=n_params,
               threads=args.threads, steps=args.steps, warmup=args.warmup, gamma=args.gamma,
               mean_T=round(sum(seq) / len(seq), 2), s_per_step=med, s_min=min(t_total), s_max=max(t_total),
               examples_per_s=head['batch_size'] / med, cpu_s_per_step=median(t_cpu),
               phase_s=dict(batch=median(t_batch), forward=median(t_fwd), backward=median(t_bwd),
                            optim=median(t_opt)),
               first_task_loss=first[0], first_loss_gate=first[1],
               peak_rss_mb=peak_rss_mb(), peak_rss_step1_mb=rss_step1,
               load1_before=load_before, load1_after=load1(), blas=blas_info())
    print(json.dumps(out), flush=True)


if __name__ == '__main__':
    main()
