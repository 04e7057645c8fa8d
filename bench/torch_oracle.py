"""PyTorch side of bench_oracle's "nli_only" line: pairs per second of a bert-base-sized NLI cross-encoder
(12 layers, 768, 12 heads, 3072, vocab 30522, 3 labels; random weights), every pair [CLS] q [SEP] k [SEP] of
--tokens tokens, run as a PyTorch user runs the reference's precompute_oracle_alpha: eager mode, no grad, batches of
--batch_size pairs, logits[:, entailment].

With Hugging Face transformers installed the model is transformers' BertForSequenceClassification(BertConfig());
without it, the same computation in plain PyTorch: embeddings (word + position + token type, LayerNorm eps 1e-12),
12 post-LN nn.TransformerEncoderLayer (exact GELU, eps 1e-12; BERT's layer), the tanh pooler on position 0 and the
classifier. Run with Debian's python3-torch (see docs/performance.md for OPENBLAS_CORETYPE):

    /usr/bin/python3 bench/torch_oracle.py --threads 1,2 --pairs 16 --tokens 64

It prints one JSON line per thread count with the fields of bench_oracle (impl "torch"): seconds (median of 3
rounds after one warm-up batch), pairs/s, peak RSS and the load average.
"""
import argparse
import json
import os
import resource
import statistics
import time

import torch
from torch import nn


class PlainBertForSequenceClassification(nn.Module):
    def __init__(self, vocab=30522, hidden=768, layers=12, heads=12, inter=3072, positions=512, labels=3):
        super().__init__()
        self.word = nn.Embedding(vocab, hidden, padding_idx=0)
        self.pos = nn.Embedding(positions, hidden)
        self.token_type = nn.Embedding(2, hidden)
        self.ln = nn.LayerNorm(hidden, eps=1e-12)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(hidden, heads, inter, dropout=0.0, activation="gelu", layer_norm_eps=1e-12,
                                       batch_first=True, norm_first=False) for _ in range(layers))
        self.pooler = nn.Linear(hidden, hidden)
        self.classifier = nn.Linear(hidden, labels)

    def forward(self, input_ids, token_type_ids, attention_mask):
        t = torch.arange(input_ids.shape[1])
        x = self.ln(self.word(input_ids) + self.pos(t)[None] + self.token_type(token_type_ids))
        pad = attention_mask == 0
        for layer in self.layers:
            x = layer(x, src_key_padding_mask=pad)
        return self.classifier(torch.tanh(self.pooler(x[:, 0])))


def build_model():
    try:
        from transformers import BertConfig, BertForSequenceClassification
        cfg = BertConfig(num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        return BertForSequenceClassification(cfg).eval(), "transformers"
    except ImportError:
        return PlainBertForSequenceClassification().eval(), "plain torch"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--pairs", type=int, default=16)
    ap.add_argument("--batch_size", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=42)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    model, kind = build_model()
    na = (a.tokens - 3) // 2
    ids = torch.randint(5, 30522, (a.pairs, a.tokens))
    ids[:, 0] = 101
    ids[:, 1 + na] = 102
    ids[:, -1] = 102
    types = torch.zeros_like(ids)
    types[:, 2 + na:] = 1
    mask = torch.ones_like(ids)

    def once():
        with torch.inference_mode():
            for b in range(0, a.pairs, a.batch_size):
                s = slice(b, b + a.batch_size)
                out = model(input_ids=ids[s], token_type_ids=types[s], attention_mask=mask[s])
                logits = out.logits if hasattr(out, "logits") else out
                _ = logits[:, 1].float()

    for t in [int(x) for x in a.threads.split(",")]:
        torch.set_num_threads(t)
        with open("/proc/loadavg") as f:
            load0 = float(f.read().split()[0])
        once()
        secs = []
        for _ in range(3):
            t0 = time.perf_counter()
            once()
            secs.append(time.perf_counter() - t0)
        med = statistics.median(secs)
        with open("/proc/loadavg") as f:
            load1 = float(f.read().split()[0])
        print(json.dumps({"bench": "oracle", "impl": "torch", "model": kind, "mode": "nli_only", "threads": t,
                          "pairs": a.pairs, "tokens": a.tokens, "batch_size": a.batch_size, "seconds": med,
                          "seconds_min": min(secs), "seconds_max": max(secs), "pairs_per_s": a.pairs / med,
                          "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                          "load_before": load0, "load_after": load1, "torch": torch.__version__,
                          "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE")}), flush=True)


if __name__ == "__main__":
    main()
