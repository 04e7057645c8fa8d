"""PyTorch eager re-creation of bench_lm's decoder-only language models, the side-by-side anchor for bench_lm.

The model is written here from the rules of docs/lm.md and docs/token_routed.md, the way a
PyTorch user writes it: eager mode, autograd, CPU, float32.

  h = Emb[ids]; per layer (pre-norm): h += Attn(RMSNorm(h), ids); h += MLP(RMSNorm(h), ids);
  logits = RMSNorm(h) Emb^T (tied); loss = CE(logits[:, :-1], labels[:, :-1]) (pre-shifted labels)
  RMSNorm: x * rsqrt(mean(x^2) + 1e-6) * gain
  Attention (mha): one GEMM on the stacked [W_k; W_q; W_v] (as the reference does), heads, qk RMSNorm over d_h with
    gains shared by the heads, rotate-half RoPE (fp32 table), causal softmax(Q K^T / sqrt(d_h)) V by explicit
    matmul + masked_fill + softmax (torch 1.13 has no scaled_dot_product_attention), O W_o^T.
  tr_mha_v2: candidates p = (t + l) mod E, s = p + 1 mod E; z = prior + sigmoid(x w_g + b_g)
    (x W_r^T / tau); w = softmax(z_p, z_s); per expert the (token, slot) rows routed to it are gathered, run through
    x A_e Bu_e (rank r, out 2D) and scaled by w, scatter-added (index_add) into Delta [N, 2D];
    Q += alpha Delta[:, :D], V += alpha Delta[:, D:]; the telemetry softmax P = softmax(z) is computed (no grad).
  Dense MLP (dense_deterministic): down(silu(gate(x)) * up(x)).
  TR-MoE (tr_hash_engine): routes R[clamp(t)] from the modulo_cyclic table (built here
    with torch.randperm, compared with the table in the weights file); shared SwiGLU on every token plus, per
    expert, the (token, slot) rows routed to it gathered, SwiGLU with input-major [D, w] weights, scaled by the
    slot weight 1/k and index_add-ed back (--moe-eval grouped, the default); --moe-eval masked runs the reference's
    CPU path instead (every expert on all tokens, unrouted rows zeroed).
  AdamW (lr 3e-4, betas 0.9 / 0.999, eps 1e-8, weight decay 0.01 on every parameter), clip_grad_norm_(1.0).

--precision bf16 runs the training step's forward and loss, and generation, under
torch.autocast("cpu", dtype=torch.bfloat16), as a PyTorch user trains in mixed precision on a CPU: autocast runs
the products (linear, matmul) in bf16 and keeps its float list in float; the parameters, the gradients and AdamW's
state stay float32 and backward runs outside the autocast region. The GEMM yardstick is then torch.matmul on bf16
tensors. Every line has "precision".

The weights are the initial parameters bench_lm draws (bench_lm --dump-weights DIR: DIR/<config>.safetensors, read
here without the safetensors package), so both sides start from the same model; the batches are the file of
bench_lm --dump-batches. The parameter count is printed and must equal dea's (it is checked against the file's).

    /usr/bin/python3 bench/torch_lm.py --weights DIR/dense.safetensors --batches batches.jsonl --threads 1

Output: one JSON line "lm_train_step" with bench_lm's fields (impl "torch"): median s/step over --steps steps
after --warmup (min, max), tokens/s, CPU s/step, phases (forward = forward + loss, backward = zero_grad +
backward, optim = clipping + step), first and last loss, the FLOP estimate and GFLOP/s, torch's own GEMM speed on
the yardstick shape (torch.matmul, the three products of a Linear), peak RSS (after building and loading the model,
after each phase of step 1), load average, the BLAS in use; then one "lm_generate" line (unless --gen-new 0):
greedy decoding of batch 1 with a KV cache (keys after norm and RoPE and values appended with torch.cat, under
torch.inference_mode) from the trained model, prompt = the first --gen-prompt ids of step 1's row 0, --gen-reps
runs, medians.

OpenBLAS kernels: on a CPU whose model OpenBLAS cannot see (a virtual machine), Debian's OpenBLAS falls back to its
oldest x86-64 kernels, several times slower at GEMM. With --openblas-coretype auto (default) a core from that
fallback list is replaced, before torch is imported, by the best kernels the CPU flags allow (SkylakeX with
AVX-512, else Haswell with AVX2 + FMA) through OPENBLAS_CORETYPE; a recognised core or a caller's
OPENBLAS_CORETYPE is kept; native never overrides; any other value is used as the core name.
"""
import argparse
import contextlib
import json
import math
import os
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# bench/torch_train.py chooses OPENBLAS_CORETYPE (--openblas-coretype) before torch loads and holds the helpers
# shared by the PyTorch side-by-side scripts (blas_info, load1, peak_rss_mb, median)
import torch_train  # noqa: E402
from torch_train import blas_info, load1, median, peak_rss_mb  # noqa: E402

import torch  # noqa: E402  (after OPENBLAS_CORETYPE)
import torch.nn.functional as F  # noqa: E402

ROUTE_SEED = 0x71D5A17  # the framework's fixed route seed


def fail(msg):
    sys.exit(f'torch_lm: {msg}')


# ------------------------------------------------------------------------------------------------------------------
# safetensors (read only: header length, JSON header, raw little-endian data)

_DTYPES = {'F32': (torch.float32, 4), 'F64': (torch.float64, 8), 'I64': (torch.int64, 8), 'I32': (torch.int32, 4)}


def read_safetensors(path):
    """(tensors by name, metadata dict) of a safetensors file."""
    try:
        with open(path, 'rb') as f:
            raw = f.read()
    except OSError as e:
        fail(f'--weights {path}: {e.strerror}')
    if len(raw) < 8:
        fail(f'{path}: not a safetensors file (too short)')
    (n,) = struct.unpack('<Q', raw[:8])
    try:
        header = json.loads(raw[8:8 + n])
    except ValueError as e:
        fail(f'{path}: bad safetensors header ({e})')
    base = 8 + n
    meta = header.pop('__metadata__', {}) or {}
    out = {}
    for name, e in header.items():
        if e['dtype'] not in _DTYPES:
            fail(f'{path}: tensor {name}: dtype {e["dtype"]} not supported here')
        dt, size = _DTYPES[e['dtype']]
        b0, b1 = e['data_offsets']
        count = (b1 - b0) // size
        t = torch.frombuffer(bytearray(raw[base + b0:base + b1]), dtype=dt, count=count) if count else \
            torch.empty(0, dtype=dt)
        out[name] = t.reshape(e['shape'])
    return out, meta


# ------------------------------------------------------------------------------------------------------------------
# model

class RMSNorm(torch.nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(head_dim, theta, length):
    """cos, sin [length, head_dim] (fp32) for rotate-half RoPE."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    ang = torch.arange(length, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)


def apply_rope(x, cos, sin):
    """x [B, H, T, dh]; cos, sin [T, dh]."""
    h = x.shape[-1] // 2
    rot = torch.cat([-x[..., h:], x[..., :h]], -1)
    return x * cos + rot * sin


class TrMhaV2Adapter(torch.nn.Module):
    """The routed Q/V delta of tr_mha_v2 (docs/token_routed.md); parameters are owned by the attention module."""

    def __init__(self, d, layer, cfg):
        super().__init__()
        self.E, self.r, self.layer = cfg['tr_mha_num_experts'], cfg['tr_mha_adapter_rank'], layer
        self.targets = cfg['tr_mha_targets']
        self.c_p, self.c_s = cfg['tr_mha_id_primary_logit'], cfg['tr_mha_id_secondary_logit']
        self.c_o = -2.0
        self.tau = cfg['tr_mha_verifier_temperature']
        E, r, n_t = self.E, self.r, len(self.targets)
        self.qv_adapter_down = torch.nn.Parameter(torch.randn(E, d, r) * 0.02)
        self.qv_adapter_up = torch.nn.Parameter(torch.zeros(E, r, n_t * d))
        self.context_router_weight = torch.nn.Parameter(torch.randn(E, d) * 0.002)
        self.verifier_gate_weight = torch.nn.Parameter(torch.zeros(1, d))
        self.verifier_gate_bias = torch.nn.Parameter(torch.tensor(math.log(0.1 / 0.9)))
        self.adapter_output_gate = torch.nn.Parameter(torch.tensor(cfg['tr_mha_adapter_gate_init']))

    def forward(self, x, ids):
        """alpha * Delta [N, T*D] of x [N, D] with routing ids [N]."""
        E = self.E
        p = torch.remainder(ids + self.layer, E)
        s = torch.remainder(p + 1, E)
        prior = (self.c_o + (self.c_p - self.c_o) * F.one_hot(p, E) + (self.c_s - self.c_o) * F.one_hot(s, E)).to(x.dtype)
        c = (x @ self.context_router_weight.t()) / self.tau
        g = torch.sigmoid(x @ self.verifier_gate_weight.t() + self.verifier_gate_bias)
        z = prior + g * c
        with torch.no_grad():
            self.route_probs = torch.softmax(z.float(), -1)  # telemetry only
        idx = torch.stack([p, s], 1)
        w = torch.softmax(z.gather(1, idx), 1)
        delta = x.new_zeros(x.shape[0], self.qv_adapter_up.shape[2])
        for e in range(E):
            tok, slot = torch.nonzero(idx == e, as_tuple=True)
            if tok.numel() == 0:
                continue
            y = (x.index_select(0, tok) @ self.qv_adapter_down[e]) @ self.qv_adapter_up[e]
            delta = delta.index_add(0, tok, y * w[tok, slot].unsqueeze(1))
        return self.adapter_output_gate * delta


class Attention(torch.nn.Module):
    def __init__(self, d, heads, layer, cfg, routed):
        super().__init__()
        self.d, self.h, self.dh = d, heads, d // heads
        self.kqv_proj = torch.nn.Linear(d, 3 * d, bias=False)  # [W_k; W_q; W_v] stacked, one GEMM
        self.o_proj = torch.nn.Linear(d, d, bias=False)
        self.q_norm = RMSNorm(self.dh, cfg['norm_eps'])
        self.k_norm = RMSNorm(self.dh, cfg['norm_eps'])
        self.adapter = TrMhaV2Adapter(d, layer, cfg) if routed else None

    def forward(self, x, ids, cos, sin, past=None):
        """x [B, T, D] at positions past_len .. past_len + T - 1; returns (y, (K, V)) with K, V [B, H, L, dh]."""
        B, T, D = x.shape
        k, q, v = self.kqv_proj(x).split(D, -1)
        if self.adapter is not None:
            delta = self.adapter(x.reshape(B * T, D), ids.reshape(B * T)).view(B, T, -1)
            chunks, i = {}, 0
            for t in self.adapter.targets:
                chunks[t] = delta[..., i * D:(i + 1) * D]
                i += 1
            if 'q' in chunks:
                q = q + chunks['q']
            if 'v' in chunks:
                v = v + chunks['v']
        q = self.q_norm(q.view(B, T, self.h, self.dh).transpose(1, 2))
        k = self.k_norm(k.view(B, T, self.h, self.dh).transpose(1, 2))
        v = v.view(B, T, self.h, self.dh).transpose(1, 2)
        p0 = 0 if past is None else past[0].shape[2]
        q = apply_rope(q, cos[p0:p0 + T], sin[p0:p0 + T])
        k = apply_rope(k, cos[p0:p0 + T], sin[p0:p0 + T])
        if past is not None:
            k = torch.cat([past[0], k], 2)
            v = torch.cat([past[1], v], 2)
        L = k.shape[2]
        scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(self.dh))
        if T > 1:
            scores = scores.masked_fill(torch.ones(T, L, dtype=torch.bool).triu(L - T + 1), float('-inf'))
        o = torch.softmax(scores, -1) @ v
        return self.o_proj(o.transpose(1, 2).reshape(B, T, D)), (k, v)


class DenseSwiGLU(torch.nn.Module):
    def __init__(self, d, width):
        super().__init__()
        self.gate_proj = torch.nn.Linear(d, width, bias=False)
        self.up_proj = torch.nn.Linear(d, width, bias=False)
        self.down_proj = torch.nn.Linear(width, d, bias=False)

    def forward(self, x, ids):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def modulo_cyclic_table(vocab, experts, top_k, layer):
    """R [V, k] of modulo_cyclic (docs/lm.md): R[t][j] = (perm[t mod E] + j) mod E."""
    gen = torch.Generator().manual_seed((ROUTE_SEED ^ 0xC0DE) + 104729 * layer)
    perm = torch.randperm(experts, generator=gen)
    t = torch.arange(vocab)
    return torch.remainder(perm[t % experts][:, None] + torch.arange(top_k)[None, :], experts)


class TrMoeEngine(torch.nn.Module):
    def __init__(self, d, cfg, layer, grouped):
        super().__init__()
        E, k, I, Ws, V = cfg['experts'], cfg['top_k'], cfg['routed'], cfg['shared'], cfg['vocab']
        w = I // E
        self.E, self.k, self.V, self.grouped = E, k, V, grouped
        sigma, sigma_res = 0.02, 0.02 / math.sqrt(2 * cfg['layers'])
        self.expert_gate = torch.nn.Parameter(torch.randn(E, d, w) * sigma)
        self.expert_up = torch.nn.Parameter(torch.randn(E, d, w) * sigma)
        self.expert_down = torch.nn.Parameter(torch.randn(E, w, d) * sigma_res)
        self.shared_gate = torch.nn.Linear(d, Ws, bias=False)
        self.shared_up = torch.nn.Linear(d, Ws, bias=False)
        self.shared_down = torch.nn.Linear(Ws, d, bias=False)
        self.register_buffer('routes_by_token', modulo_cyclic_table(V, E, k, layer))
        self.register_buffer('slot_weight', torch.full((k,), 1.0 / k))

    def forward(self, x, ids):
        B, T, D = x.shape
        xf = x.reshape(B * T, D)
        routes = self.routes_by_token[ids.reshape(-1).clamp(0, self.V - 1)]  # [N, k]
        y = self.shared_down(F.silu(self.shared_gate(xf)) * self.shared_up(xf))
        if self.grouped:
            routed = torch.zeros_like(xf)
            for e in range(self.E):
                tok, slot = torch.nonzero(routes == e, as_tuple=True)
                if tok.numel() == 0:
                    continue
                xe = xf.index_select(0, tok)
                h = F.silu(xe @ self.expert_gate[e]) * (xe @ self.expert_up[e])
                routed = routed.index_add(0, tok, (h @ self.expert_down[e]) * self.slot_weight[slot].unsqueeze(1))
            y = y + routed
        else:  # the reference's CPU loop: every expert on all tokens, the unrouted ones zeroed
            for e in range(self.E):
                tau = ((routes == e).to(xf.dtype) * self.slot_weight).sum(1, keepdim=True)
                xm = xf * (tau != 0).to(xf.dtype)
                h = F.silu(xm @ self.expert_gate[e]) * (xm @ self.expert_up[e])
                y = y + tau * (h @ self.expert_down[e])
        return y.view(B, T, D)


class TrMoeMlp(torch.nn.Module):
    def __init__(self, d, cfg, layer, grouped):
        super().__init__()
        self.engine = TrMoeEngine(d, cfg, layer, grouped)

    def forward(self, x, ids):
        return self.engine(x, ids)


class Block(torch.nn.Module):
    def __init__(self, d, cfg, layer, grouped):
        super().__init__()
        self.input_layernorm = RMSNorm(d, cfg['norm_eps'])
        self.self_attn = Attention(d, cfg['heads'], layer, cfg, cfg['attention'] == 'tr_mha_v2')
        self.post_attention_layernorm = RMSNorm(d, cfg['norm_eps'])
        self.mlp = TrMoeMlp(d, cfg, layer, grouped) if cfg['mlp'] == 'tr_hash_engine' else DenseSwiGLU(d, cfg['ffn'])

    def forward(self, h, ids, cos, sin, past=None):
        a, kv = self.self_attn(self.input_layernorm(h), ids, cos, sin, past)
        h = h + a
        return h + self.mlp(self.post_attention_layernorm(h), ids), kv


class DecoderLM(torch.nn.Module):
    def __init__(self, cfg, grouped=True, max_len=4096):
        super().__init__()
        d = cfg['hidden']
        self.embed_tokens = torch.nn.Embedding(cfg['vocab'], d)
        self.layers = torch.nn.ModuleList(Block(d, cfg, l, grouped) for l in range(cfg['layers']))
        self.norm = RMSNorm(d, cfg['norm_eps'])
        cos, sin = rope_tables(d // cfg['heads'], cfg['rope_theta'], max_len)
        self.register_buffer('rope_cos', cos)
        self.register_buffer('rope_sin', sin)

    def forward(self, ids, past=None):
        """logits [B, T, V] of ids [B, T]; with past (a list of per-layer (K, V)), the next positions. Returns
        (logits, the new per-layer (K, V))."""
        h = self.embed_tokens(ids)
        new = []
        for l, layer in enumerate(self.layers):
            h, kv = layer(h, ids, self.rope_cos, self.rope_sin, None if past is None else past[l])
            new.append(kv)
        return F.linear(self.norm(h), self.embed_tokens.weight), new


def load_weights(model, tensors, cfg):
    """Copies bench_lm's parameters (state_dict names) into the model: k/q/v into the stacked kqv_proj, the adapter
    parameters of self_attn.X into self_attn.adapter.X, the route tables compared with the ones built here."""
    params = dict(model.named_parameters())
    filled = {n: torch.zeros(p.numel(), dtype=torch.int64) for n, p in params.items()}
    D = cfg['hidden']
    with torch.no_grad():
        for name, t in tensors.items():
            if name.endswith('engine.route_table'):  # [k, V] slot-major
                mine = model.get_submodule(name.rsplit('.', 1)[0]).routes_by_token
                if not torch.equal(mine.t().contiguous(), t):
                    fail(f'{name}: the modulo_cyclic route table built here differs from the file\'s')
                continue
            target, rows = name, None
            for j, proj in enumerate(('k_proj', 'q_proj', 'v_proj')):
                if name.endswith(f'self_attn.{proj}.weight'):
                    target, rows = name.replace(f'{proj}.weight', 'kqv_proj.weight'), slice(j * D, (j + 1) * D)
            if '.self_attn.' in name and target not in params:
                target = name.replace('.self_attn.', '.self_attn.adapter.')
            if target not in params:
                fail(f'the weights file holds {name} ({tuple(t.shape)}), which this model does not have')
            p = params[target]
            dst = p.data if rows is None else p.data[rows]
            if tuple(dst.shape) != tuple(t.shape):
                fail(f'{name}: shape {tuple(t.shape)} in the file, {tuple(dst.shape)} here')
            dst.copy_(t.to(torch.float32))
            if rows is None:
                filled[target] += 1
            else:
                filled[target].view(3 * D, -1)[rows] += 1
    for n, f in filled.items():
        if not torch.all(f == 1):
            fail(f'parameter {n} was not filled exactly once from the weights file')


# ------------------------------------------------------------------------------------------------------------------
# measurement

def forward_product_flops(cfg, B, T):
    """bench_lm's FLOP estimate of the forward's matrix products (a step is 3 times this)."""
    N, D, V = B * T, cfg['hidden'], cfg['vocab']
    layer = 2 * N * D * 4 * D + 4 * B * T * T * D
    if cfg['attention'] == 'tr_mha_v2':
        E, r, nt = cfg['tr_mha_num_experts'], cfg['tr_mha_adapter_rank'], len(cfg['tr_mha_targets'])
        layer += 2 * N * D * E + 2 * N * D + 2 * (2 * N) * D * r + 2 * (2 * N) * r * nt * D
    if cfg['mlp'] == 'tr_hash_engine':
        w = cfg['routed'] // cfg['experts']
        layer += 6 * N * D * cfg['shared'] + 6 * N * cfg['top_k'] * D * w
    else:
        layer += 6 * N * D * cfg['ffn']
    return cfg['layers'] * layer + 2 * N * D * V


def autocast(precision):
    """The mixed-precision region of --precision: bf16 autocast on the CPU, or nothing for fp32."""
    if precision == 'bf16':
        return torch.autocast('cpu', dtype=torch.bfloat16)
    return contextlib.nullcontext()


def torch_gemm_gflops(M, N, K, rounds, dtype=torch.float32):
    """torch.matmul GFLOP/s on the three products of a Linear [M, K] -> [M, N] (median of rounds, best of 3), on
    tensors of `dtype`."""
    g = torch.Generator().manual_seed(7)
    x, W, dy = torch.randn(M, K, generator=g), torch.randn(N, K, generator=g), torch.randn(M, N, generator=g)
    x, W, dy = x.to(dtype), W.to(dtype), dy.to(dtype)
    dW = torch.zeros(N, K, dtype=dtype)

    def best(f):
        b = float('inf')
        for _ in range(3):
            t0 = time.perf_counter()
            f()
            b = min(b, time.perf_counter() - t0)
        return b

    gf = 2.0 * M * N * K / 1e9
    res = {'forward': [], 'input_grad': [], 'weight_grad': [], 'all': []}
    for _ in range(rounds):
        tf = best(lambda: torch.matmul(x, W.t()))
        ti = best(lambda: torch.matmul(dy, W))
        tw = best(lambda: dW.addmm_(dy.t(), x))
        res['forward'].append(gf / tf)
        res['input_grad'].append(gf / ti)
        res['weight_grad'].append(gf / tw)
        res['all'].append(3 * gf / (tf + ti + tw))
    return {k: round(median(v), 1) for k, v in res.items()}


def rss_now_mb():
    try:
        with open('/proc/self/status') as f:
            for line in f:
                if line.startswith('VmRSS:'):
                    return round(int(line.split()[1]) / 1024)
    except OSError:
        pass
    return -1


def read_batches(path, cfg):
    try:
        with open(path) as f:
            lines = [json.loads(ln) for ln in f if ln.strip()]
    except OSError as e:
        fail(f'--batches {path}: {e.strerror}')
    except ValueError as e:
        fail(f'--batches {path}: not JSON lines ({e})')
    if not lines or 'step' in lines[0]:
        fail(f'{path}: expected the file of bench_lm --dump-batches (a header line, then one line per step)')
    head, steps = lines[0], lines[1:]
    for key in ('batch', 'seq', 'vocab'):
        if head[key] != cfg[key]:
            fail(f'{path}: {key} {head[key]}, the weights are for {key} {cfg[key]}')
    B, T = head['batch'], head['seq']
    return head, [(torch.tensor(s['ids'], dtype=torch.long).view(B, T),
                   torch.tensor(s['labels'], dtype=torch.long).view(B, T)) for s in steps]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--weights', required=True, help='DIR/<config>.safetensors written by bench_lm --dump-weights')
    ap.add_argument('--batches', required=True, help='file written by bench_lm --dump-batches')
    ap.add_argument('--threads', type=int, default=1)
    ap.add_argument('--steps', type=int, default=10)
    ap.add_argument('--warmup', type=int, default=2)
    ap.add_argument('--gen-prompt', type=int, default=16)
    ap.add_argument('--gen-new', type=int, default=240, help='0: no generation')
    ap.add_argument('--gen-reps', type=int, default=3)
    ap.add_argument('--yardstick-rounds', type=int, default=5)
    ap.add_argument('--moe-eval', choices=('grouped', 'masked'), default='grouped',
                    help='TR-MoE experts on their own rows (grouped) or on all rows, unrouted ones zeroed (masked)')
    ap.add_argument('--openblas-coretype', default='auto',
                    help='auto (default: replace a pre-AVX2 fallback core), native (never override) or a core name')
    ap.add_argument('--precision', choices=('fp32', 'bf16'), default='fp32',
                    help='bf16: forward, loss and generation under torch.autocast("cpu", dtype=torch.bfloat16)')
    args = ap.parse_args()
    for flag, v, lo in (('--threads', args.threads, 1), ('--steps', args.steps, 1), ('--warmup', args.warmup, 0),
                        ('--gen-prompt', args.gen_prompt, 1), ('--gen-new', args.gen_new, 0),
                        ('--gen-reps', args.gen_reps, 1), ('--yardstick-rounds', args.yardstick_rounds, 1)):
        if v < lo:
            ap.error(f'{flag} must be >= {lo}, got {v}')
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)

    tensors, meta = read_safetensors(args.weights)
    if 'bench_lm' not in meta:
        fail(f'{args.weights}: no "bench_lm" metadata (write the file with bench_lm --dump-weights)')
    cfg = json.loads(meta['bench_lm'])
    head, batches = read_batches(args.batches, cfg)
    total = args.warmup + args.steps
    if len(batches) < total:
        fail(f'{args.batches} holds {len(batches)} batches, --warmup + --steps needs {total}')
    if args.gen_new and args.gen_prompt > cfg['seq']:
        fail(f'--gen-prompt {args.gen_prompt} exceeds the sequence length {cfg["seq"]}')
    B, T = cfg['batch'], cfg['seq']
    load_before = load1()
    torch.manual_seed(0)
    model = DecoderLM(cfg, grouped=args.moe_eval == 'grouped', max_len=max(T, args.gen_prompt + args.gen_new))
    load_weights(model, tensors, cfg)
    del tensors
    n_params = sum(p.numel() for p in model.parameters())
    print(f'[torch {cfg["config"]}] {n_params} parameters (dea: {cfg["params"]})', file=sys.stderr, flush=True)
    if n_params != cfg['params']:
        fail(f'{n_params} parameters here, {cfg["params"]} in dea\'s model')
    model.train()
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=cfg['lr'], betas=(0.9, 0.999), eps=1e-8, weight_decay=cfg['weight_decay'])
    gemm_dtype = torch.bfloat16 if args.precision == 'bf16' else torch.float32
    yard0 = torch_gemm_gflops(B * T, cfg['ffn'], cfg['hidden'], args.yardstick_rounds, gemm_dtype)

    t_total, t_cpu, t_fwd, t_bwd, t_opt = [], [], [], [], []
    rss_step1 = {'init': peak_rss_mb()}
    first = last = None
    V = cfg['vocab']
    for s in range(1, total + 1):
        ids, labels = batches[s - 1]
        c0, a = time.process_time(), time.perf_counter()
        with autocast(args.precision):
            logits, _ = model(ids)
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, V), labels[:, :-1].reshape(-1))
        ft = time.perf_counter()
        if s == 1:
            rss_step1['forward'] = peak_rss_mb()
        opt.zero_grad()
        loss.backward()
        bw = time.perf_counter()
        if s == 1:
            rss_step1['backward'] = peak_rss_mb()
        torch.nn.utils.clip_grad_norm_(params, cfg['grad_clip'])
        opt.step()
        e, c1 = time.perf_counter(), time.process_time()
        lv = loss.item()
        if not math.isfinite(lv):
            fail(f'non-finite loss at step {s}')
        if s == 1:
            first = lv
            rss_step1['optim'] = peak_rss_mb()
        last = lv
        warm = ' (warm-up)' if s <= args.warmup else ''
        print(f'[torch {cfg["config"]} threads={args.threads}] step {s}/{total}{warm}: {e - a:.3f} s (loss {lv:.5f})',
              file=sys.stderr, flush=True)
        if s <= args.warmup:
            continue
        t_total.append(e - a)
        t_cpu.append(c1 - c0)
        t_fwd.append(ft - a)
        t_bwd.append(bw - ft)
        t_opt.append(e - bw)

    gen = None
    if args.gen_new:
        model.eval()
        prompt = batches[0][0][:1, :args.gen_prompt].clone()
        g_total, g_prefill, g_decode = [], [], []
        out = []
        with torch.inference_mode(), autocast(args.precision):
            for rep in range(args.gen_reps):
                out = []
                a = time.perf_counter()
                logits, past = model(prompt)
                out.append(int(torch.argmax(logits[0, -1])))  # the first maximum: the lowest id on a tie
                p = time.perf_counter()
                for _ in range(1, args.gen_new):
                    logits, past = model(torch.tensor([[out[-1]]]), past)
                    out.append(int(torch.argmax(logits[0, -1])))
                e = time.perf_counter()
                g_total.append(e - a)
                g_prefill.append(p - a)
                g_decode.append(e - p)
                print(f'[torch {cfg["config"]} threads={args.threads}] generate {rep + 1}/{args.gen_reps}: '
                      f'{args.gen_prompt} + {args.gen_new} tokens in {e - a:.3f} s', file=sys.stderr, flush=True)
        gen = dict(bench='lm_generate', impl='torch', precision=args.precision, config=cfg['config'],
                   threads=args.threads, params=n_params,
                   prompt_len=args.gen_prompt, new_tokens=args.gen_new, reps=args.gen_reps, s_total=median(g_total),
                   s_prefill=median(g_prefill), s_decode=median(g_decode),
                   tokens_per_s=args.gen_new / median(g_total),
                   decode_tokens_per_s=(args.gen_new - 1) / median(g_decode) if args.gen_new > 1 else 0.0,
                   ids=out, rss_mb=rss_now_mb(), peak_rss_mb=peak_rss_mb())
    yard1 = torch_gemm_gflops(B * T, cfg['ffn'], cfg['hidden'], args.yardstick_rounds, gemm_dtype)

    med = median(t_total)
    gflop = 3 * forward_product_flops(cfg, B, T) / 1e9
    out = dict(cfg)
    out.update(bench='lm_train_step', impl='torch', precision=args.precision, torch_version=torch.__version__,
               params=n_params,
               threads=args.threads, steps=args.steps, warmup=args.warmup, moe_eval=args.moe_eval,
               s_per_step=med, s_min=min(t_total), s_max=max(t_total), tokens_per_s=B * T / med,
               cpu_s_per_step=median(t_cpu),
               phase_s=dict(forward=median(t_fwd), backward=median(t_bwd), optim=median(t_opt)),
               first_loss=first, last_loss=last, gflop_per_step=round(gflop, 2),
               achieved_gflops=round(gflop / med, 1), yardstick_shape=f'{B * T}x{cfg["ffn"]}x{cfg["hidden"]}',
               torch_gemm_gflops_before=yard0, torch_gemm_gflops_after=yard1,
               peak_rss_mb=peak_rss_mb(), peak_rss_step1_mb=rss_step1, load1_before=load_before,
               load1_after=load1(), blas=blas_info())
    print(json.dumps(out), flush=True)
    if gen is not None:
        gen['load1_after'] = load1()
        print(json.dumps(gen), flush=True)


if __name__ == '__main__':
    main()
