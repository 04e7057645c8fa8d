"""PyTorch side of bench_deberta: pairs per second of a DeBERTa-v3-base-sized NLI cross-encoder (12 layers, 768, 12
heads, 3072, vocabulary 128,100, 256 position buckets over 512, shared keys, c2p and p2c, a LayerNorm on the
relative table, 3 labels; random weights), every pair [CLS] q [SEP] k [SEP] of --tokens tokens, in eager mode
without gradients, --batch_size pairs per forward, logits[:, 0].

The model is written here in plain PyTorch the way transformers' DebertaV2ForSequenceClassification computes its
forward in eval mode: word embeddings, LayerNorm (eps 1e-7) and the mask; the log-bucketed relative positions of
every query-key pair (float32, as transformers), the relative table through its LayerNorm and each layer's own key
and query projections, the content-to-position and position-to-content products against the whole table (2 x 256
rows) gathered by bucket, the three terms over sqrt(3 d) in float32, the masked softmax, the post-LN layer, the
ContextPooler (dense + GELU on the first token) and the classifier. On the golden case deberta_seq_cls_ent0 (its
sizes, in double) it gives the stored logits to 1e-15. Run with Debian's python3-torch, with OpenBLAS's kernels named
on a machine whose CPU model it does not recognise (docs/performance.md):

    OPENBLAS_CORETYPE=SkylakeX /usr/bin/python3 bench/torch_deberta.py --threads 1,2 --pairs 16 --tokens 64

It prints one JSON line per thread count with the fields of bench_deberta (impl "torch"): seconds (median of 3
rounds after one warm-up round), pairs/s, the parameter memory, peak RSS and the load average.
"""
import argparse
import json
import os
import resource
import statistics
import time

import torch
from torch import nn


def log_buckets(rel, buckets, max_position):
    """The bucket of each relative distance in `rel` (int64), evaluated in float32 as transformers does."""
    mid = buckets // 2
    sign = torch.sign(rel)
    inside = (rel < mid) & (rel > -mid)
    abs_pos = torch.where(inside, torch.full_like(rel, mid - 1), rel.abs())
    ratio = torch.tensor((max_position - 1) / mid, dtype=torch.float32)
    log_pos = torch.ceil(torch.log(abs_pos.float() / mid) / torch.log(ratio) * (mid - 1)) + mid
    return torch.where(abs_pos <= mid, rel.float(), log_pos * sign).long()


class Layer(nn.Module):
    def __init__(self, hidden, heads, inter, eps):
        super().__init__()
        self.heads = heads
        self.query_proj = nn.Linear(hidden, hidden)
        self.key_proj = nn.Linear(hidden, hidden)
        self.value_proj = nn.Linear(hidden, hidden)
        self.attn_out = nn.Linear(hidden, hidden)
        self.attn_ln = nn.LayerNorm(hidden, eps=eps)
        self.inter = nn.Linear(hidden, inter)
        self.out = nn.Linear(inter, hidden)
        self.out_ln = nn.LayerNorm(hidden, eps=eps)

    def split(self, x):  # [B, T, H] -> [B, A, T, d]
        b, t, h = x.shape
        return x.view(b, t, self.heads, h // self.heads).transpose(1, 2)

    def forward(self, x, pair_mask, rel_table, c2p_index, p2c_index):
        q, k, v = self.split(self.query_proj(x)), self.split(self.key_proj(x)), self.split(self.value_proj(x))
        d = q.shape[-1]
        scale = torch.sqrt(torch.tensor(d, dtype=torch.float) * 3).to(q.dtype)
        scores = q @ (k / scale).transpose(-1, -2)
        # relative terms: the shared projections of the whole table, gathered by bucket
        pk = self.key_proj(rel_table).view(rel_table.shape[0], self.heads, d).transpose(0, 1)  # [A, 2S, d]
        pq = self.query_proj(rel_table).view(rel_table.shape[0], self.heads, d).transpose(0, 1)
        bsz, heads, t, _ = q.shape
        c2p = torch.gather(q @ pk.transpose(-1, -2), -1, c2p_index.expand(bsz, heads, t, t))
        p2c = torch.gather(k @ pq.transpose(-1, -2), -1, p2c_index.expand(bsz, heads, t, t)).transpose(-1, -2)
        scores = scores + c2p / scale + p2c / scale
        masked = ~pair_mask
        scores = scores.masked_fill(masked, torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores, -1).masked_fill(masked, 0.0)
        ctx = (probs @ v).transpose(1, 2).reshape(x.shape)
        h1 = self.attn_ln(self.attn_out(ctx) + x)
        return self.out_ln(self.out(nn.functional.gelu(self.inter(h1))) + h1)


class DebertaV3ForSequenceClassification(nn.Module):
    def __init__(self, vocab=128100, hidden=768, layers=12, heads=12, inter=3072, buckets=256, max_position=512,
                 labels=3, eps=1e-7):
        super().__init__()
        self.buckets, self.max_position = buckets, max_position
        self.word = nn.Embedding(vocab, hidden, padding_idx=0)
        self.emb_ln = nn.LayerNorm(hidden, eps=eps)
        self.rel = nn.Embedding(2 * buckets, hidden)
        self.rel_ln = nn.LayerNorm(hidden, eps=eps)
        self.layers = nn.ModuleList(Layer(hidden, heads, inter, eps) for _ in range(layers))
        self.pooler = nn.Linear(hidden, hidden)
        self.classifier = nn.Linear(hidden, labels)

    def forward(self, input_ids, attention_mask):
        t = input_ids.shape[1]
        m = attention_mask.to(torch.float32)
        x = self.emb_ln(self.word(input_ids)) * m[..., None]
        pos = torch.arange(t)
        rel = log_buckets(pos[:, None] - pos[None, :], self.buckets, self.max_position)
        c2p_index = torch.clamp(rel + self.buckets, 0, 2 * self.buckets - 1)[None, None]
        p2c_index = torch.clamp(-rel + self.buckets, 0, 2 * self.buckets - 1)[None, None]
        pair_mask = (m[:, None, :, None] * m[:, None, None, :]).bool()
        rel_table = self.rel_ln(self.rel.weight)
        for layer in self.layers:
            x = layer(x, pair_mask, rel_table, c2p_index, p2c_index)
        return self.classifier(nn.functional.gelu(self.pooler(x[:, 0])))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--pairs", type=int, default=16)
    ap.add_argument("--batch_size", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--seed", type=int, default=42)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    model = DebertaV3ForSequenceClassification(layers=a.layers).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "ln" not in name:
                p.normal_(0.0, 0.02)
    n_params = sum(p.numel() for p in model.parameters())
    na = (a.tokens - 3) // 2

    def pairs(n):
        ids = torch.randint(4, 128100, (n, a.tokens))
        ids[:, 0] = 1
        ids[:, 1 + na] = 2
        ids[:, -1] = 2
        return ids

    warm, timed = pairs(a.warmup), pairs(a.pairs)

    def once(ids):
        with torch.inference_mode():
            for b in range(0, ids.shape[0], a.batch_size):
                chunk = ids[b:b + a.batch_size]
                _ = model(chunk, torch.ones_like(chunk))[:, 0].float()

    for t in [int(x) for x in a.threads.split(",")]:
        torch.set_num_threads(t)
        with open("/proc/loadavg") as f:
            load0 = float(f.read().split()[0])
        once(warm)
        secs, cpu = [], []
        for _ in range(3):
            t0, c0 = time.perf_counter(), time.process_time()
            once(timed)
            secs.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        med = statistics.median(secs)
        with open("/proc/loadavg") as f:
            load1 = float(f.read().split()[0])
        print(json.dumps({"bench": "deberta", "impl": "torch", "threads": t, "pairs": a.pairs, "tokens": a.tokens,
                          "batch_size": a.batch_size, "model": f"{a.layers}x768x12x3072, vocab 128100, buckets 256/512",
                          "seconds": med, "seconds_min": min(secs), "seconds_max": max(secs),
                          "pairs_per_s": a.pairs / med, "cpu_seconds": statistics.median(cpu),
                          "cpu_seconds_per_pair": statistics.median(cpu) / a.pairs, "params_mb": n_params * 4 / 2**20,
                          "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                          "load_before": load0, "load_after": load1, "torch": torch.__version__,
                          "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE")}), flush=True)


if __name__ == "__main__":
    main()
