"""The reference's PyTorch TransformerModel with dea's Dual-Expert Attention swapped in, trained for a few steps on a
small D_alpha built from the sample files in tests/data/dalpha.

The model is the reference's (pre-LayerNorm encoder, sinusoidal positions, a [CLS] classifier, the MLM head tied to
the token embedding), its parameter names included, so a reference checkpoint loads with load_state_dict; the only
change is `attention=dea.torch.DualExpertAttention`. The loss is task_loss + loss_gate, the optimiser AdamW with the
reference's two groups (W_gate and c_gate: lr 1e-3, no weight decay; the rest: lr 3e-4, weight decay 0.01), each
group clipped to norm 1, and gamma_mix falls linearly from 1 to 0.

    PYTHONPATH=build/release/python /usr/bin/python3 examples/python/train_torch.py --steps 20

--check first runs the reference's golden TransformerModel case (tests/data/golden/model_cls.safetensors: its
parameters loaded with load_state_dict, in double) and compares logits, losses and every gradient with the
reference's numbers (exit 1 above 1e-9 relative).
"""
import argparse
import json
import math
import os
import random
import re
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

import dea
import dea.torch

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "..", "tests", "data")


# ---- the model (the reference's transformer.py, with the attention class as a parameter)

class PositionalEncoding(torch.nn.Module):
    def __init__(self, d_model, max_len):
        super().__init__()
        pos = torch.arange(max_len, dtype=torch.float32).unsqueeze(1)
        div = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, d_model)
        pe[:, 0::2] = torch.sin(pos * div)
        pe[:, 1::2] = torch.cos(pos * div)
        self.register_buffer("pe", pe.unsqueeze(0), persistent=False)

    def forward(self, x):
        return x + self.pe[:, :x.size(1)].to(x.dtype)


class EncoderLayer(torch.nn.Module):
    def __init__(self, d_model, heads, d_ff, dropout, attention):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(d_model)
        self.attn = attention(d_model, heads, dropout=dropout)
        self.ln2 = torch.nn.LayerNorm(d_model)
        self.ff = torch.nn.Sequential(torch.nn.Linear(d_model, d_ff), torch.nn.GELU(), torch.nn.Dropout(dropout),
                                      torch.nn.Linear(d_ff, d_model))
        self.drop1 = torch.nn.Dropout(dropout)
        self.drop2 = torch.nn.Dropout(dropout)

    def forward(self, x, key_mask, oracle, gamma):
        r = self.attn(self.ln1(x), key_mask=key_mask, alpha_oracle=oracle, gamma_mix=gamma)
        x = x + self.drop1(r["output"])
        x = x + self.drop2(self.ff(self.ln2(x)))
        return x, r


class TransformerModel(torch.nn.Module):
    def __init__(self, vocab, d_model, heads, n_layers, d_ff, max_len, dropout, n_classes=2, pad_id=0,
                 attention=dea.torch.DualExpertAttention):
        super().__init__()
        self.d_model = d_model
        self.tok_emb = torch.nn.Embedding(vocab, d_model, padding_idx=pad_id)
        torch.nn.init.normal_(self.tok_emb.weight, 0.0, d_model ** -0.5)  # the whole table, pad row included
        self.seg_emb = torch.nn.Embedding(2, d_model)
        self.pos = PositionalEncoding(d_model, max_len)
        self.drop = torch.nn.Dropout(dropout)
        self.layers = torch.nn.ModuleList(EncoderLayer(d_model, heads, d_ff, dropout, attention)
                                          for _ in range(n_layers))
        self.ln_f = torch.nn.LayerNorm(d_model)
        self.cls_head = torch.nn.Sequential(torch.nn.Linear(d_model, d_model), torch.nn.Tanh(),
                                            torch.nn.Dropout(dropout), torch.nn.Linear(d_model, n_classes))
        self.mlm_head = torch.nn.Linear(d_model, vocab)
        self.mlm_head.weight = self.tok_emb.weight  # tied, as in the reference

    def forward(self, ids, token_type_ids, attention_mask, oracle=None, gamma=0.0, labels=None):
        km = attention_mask.bool()
        x = self.tok_emb(ids) * math.sqrt(self.d_model) + self.seg_emb(token_type_ids)
        x = self.drop(self.pos(x))
        gate, details = [], []
        for layer in self.layers:
            x, r = layer(x, km, oracle, gamma)
            gate.append(r["loss_gate"])
            details.append(r)
        logits = self.cls_head(self.ln_f(x)[:, 0])
        task = None if labels is None else F.cross_entropy(logits, labels)
        loss_gate = torch.stack(gate).sum() / max(1, len(self.layers))  # every layer supervised
        return logits, task, loss_gate, details


def parameter_groups(model, lr_main=3e-4, lr_gate=1e-3, weight_decay=0.01):
    """The reference's AdamW groups: names containing W_gate or c_gate form the gate group."""
    gate, main = [], []
    for name, p in model.named_parameters():
        (gate if "W_gate" in name or "c_gate" in name else main).append(p)
    return [{"params": main, "lr": lr_main, "weight_decay": weight_decay},
            {"params": gate, "lr": lr_gate, "weight_decay": 0.0}]


# ---- a small D_alpha: positive pairs from the sample files, one random negative each, the mock oracle

TOKEN = re.compile(r"\d+(?:[+\-*/]\d+)+|\w+|[^\w\s]")
PAD, UNK, CLS, SEP = 0, 1, 2, 3


def positives(data_dir):
    pairs = []
    with open(os.path.join(data_dir, "dalpha", "capitals.txt")) as f:
        for line in f:
            if line.startswith("#") or line.strip().lower() in ("", "capital,country"):
                continue
            capital, country = line.rstrip("\n").split("\t")
            pairs.append((capital, country))
    concept = lambda uri: uri.split("/")[3].replace("_", " ")  # noqa: E731  (/c/en/ice_cream/n -> "ice cream")
    with open(os.path.join(data_dir, "dalpha", "conceptnet_assertions.csv")) as f:
        for line in f:
            _, rel, start, end, _ = line.split("\t")
            if rel in ("/r/IsA", "/r/PartOf") and start.startswith("/c/en/") and end.startswith("/c/en/"):
                pairs.append((concept(start), concept(end)))
    return pairs


def dalpha(data_dir, seed):
    """Records (a, b, label, alpha): each positive ("strong", alpha in [0.75, 0.95)) and the same a with another
    positive's b ("none", alpha in [0, 0.05))."""
    rng = random.Random(seed)
    pos = positives(data_dir)
    recs = []
    for i, (a, b) in enumerate(pos):
        recs.append((a, b, 1, rng.uniform(0.75, 0.95)))
        j = rng.randrange(len(pos) - 1)
        recs.append((a, pos[j + (j >= i)][1], 0, rng.uniform(0.0, 0.05)))
    rng.shuffle(recs)
    return recs


def encode_batch(recs, vocab, max_len, dtype):
    """[CLS] A [SEP] B [SEP], right-padded; the oracle is NaN except the block A tokens (queries) x B tokens (keys)."""
    enc = []
    for a, b, label, alpha in recs:
        ta = [vocab.get(w, UNK) for w in TOKEN.findall(a.lower())]
        tb = [vocab.get(w, UNK) for w in TOKEN.findall(b.lower())]
        while len(ta) + len(tb) > max_len - 3:
            (ta if len(ta) >= len(tb) else tb).pop()
        enc.append((ta, tb, label, alpha))
    T = max(len(ta) + len(tb) + 3 for ta, tb, _, _ in enc)
    B = len(enc)
    ids = torch.full((B, T), PAD, dtype=torch.long)
    tt = torch.zeros(B, T, dtype=torch.long)
    am = torch.zeros(B, T, dtype=torch.long)
    oracle = torch.full((B, T, T), float("nan"), dtype=dtype)
    for r, (ta, tb, _, alpha) in enumerate(enc):
        seq = [CLS] + ta + [SEP] + tb + [SEP]
        ids[r, :len(seq)] = torch.tensor(seq)
        tt[r, len(ta) + 2:len(seq)] = 1
        am[r, :len(seq)] = 1
        oracle[r, 1:1 + len(ta), len(ta) + 2:len(ta) + 2 + len(tb)] = alpha
    labels = torch.tensor([e[2] for e in enc])
    return ids, tt, am, oracle, labels


# ---- the golden model case


def load_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    kinds = {"F64": np.float64, "F32": np.float32, "I64": np.int64, "BOOL": np.bool_}
    return {k: torch.from_numpy(np.frombuffer(blob[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]],
                                              kinds[v["dtype"]]).reshape(v["shape"]).copy())
            for k, v in header.items()}


def check_golden(data_dir):
    t = load_safetensors(os.path.join(data_dir, "golden", "model_cls.safetensors"))
    pe = load_safetensors(os.path.join(data_dir, "reference", "model_cls_pe.safetensors"))["pe"]
    model = TransformerModel(50, 32, 4, 2, 64, 64, 0.0).double()
    missing, unexpected = model.load_state_dict({k: v for k, v in t.items() if not k.startswith(("in.", "out.",
                                                                                                  "grad."))},
                                                strict=False)
    assert missing == ["mlm_head.weight"] and not unexpected, (missing, unexpected)  # the tied weight is tok_emb's
    model.pos.pe = pe[:64].unsqueeze(0)  # the table the reference used, in double
    logits, task, loss_gate, _ = model(t["in.input_ids"], t["in.token_type_ids"], t["in.attention_mask"],
                                       t["in.alpha_oracle"], 0.7, t["in.labels"])
    (task + loss_gate).backward()
    got = {"out.logits": logits, "out.task_loss": task, "out.loss_gate": loss_gate}
    got.update({"grad." + n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    worst, name = 0.0, ""
    for k, want in t.items():
        if not k.startswith(("out.", "grad.")) or k not in got:
            continue
        err = float((got[k].detach() - want).abs().max()) / max(float(want.abs().max()), 1e-12)
        worst, name = max((worst, name), (err, k))
    compared = sum(k in got for k in t if k.startswith(("out.", "grad.")))
    print("golden model_cls: %d tensors compared, worst relative error %.2e (%s)" % (compared, worst, name))
    return worst <= 1e-9 and compared >= 40


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--d_model", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--d_ff", type=int, default=128)
    ap.add_argument("--max_len", type=int, default=64)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=0, help="threads of dea and of torch (0: leave both alone)")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--data", default=DATA, help="the tests/data directory (dalpha/ and golden/)")
    ap.add_argument("--check", action="store_true", help="first reproduce the reference's golden model case")
    args = ap.parse_args()
    if args.threads > 0:
        dea.set_num_threads(args.threads)
        torch.set_num_threads(args.threads)
    if args.check and not check_golden(args.data):
        sys.exit("train_torch: the golden model case does not match")

    torch.manual_seed(args.seed)
    recs = dalpha(args.data, args.seed)
    words = {}
    for a, b, _, _ in recs:
        for w in TOKEN.findall(a.lower()) + TOKEN.findall(b.lower()):
            words[w] = words.get(w, 0) + 1
    vocab = {w: i + 5 for i, w in enumerate(sorted(words, key=lambda w: (-words[w], w)))}  # 0-4: the specials
    model = TransformerModel(len(vocab) + 5, args.d_model, args.heads, args.layers, args.d_ff, args.max_len,
                             args.dropout)
    opt = torch.optim.AdamW(parameter_groups(model))
    print("D_alpha: %d records, vocabulary %d; model: %d parameters" % (
        len(recs), len(vocab) + 5, sum(p.numel() for p in model.parameters())))
    model.train()
    first = None
    for step in range(1, args.steps + 1):
        gamma = max(0.0, 1.0 - (step - 1) / args.steps)
        start = ((step - 1) * args.batch) % len(recs)
        batch = (recs + recs)[start:start + args.batch]
        ids, tt, am, oracle, labels = encode_batch(batch, vocab, args.max_len, torch.float32)
        t0 = time.perf_counter()
        logits, task, loss_gate, details = model(ids, tt, am, oracle, gamma, labels)
        loss = task + loss_gate
        opt.zero_grad()
        loss.backward()
        for group in opt.param_groups:
            torch.nn.utils.clip_grad_norm_(group["params"], 1.0)
        opt.step()
        ms = (time.perf_counter() - t0) * 1e3
        stats = details[-1]["stats"]
        first = first or (float(task), float(loss_gate))
        print("step %3d  gamma %.2f  task_loss %.4f  loss_gate %.4f  side_acc %.2f  %.1f ms" % (
            step, gamma, float(task), float(loss_gate), stats.get("decision_side_acc", float("nan")), ms))
        if not (math.isfinite(float(task)) and math.isfinite(float(loss_gate))):
            sys.exit("train_torch: a non-finite loss at step %d" % step)
    print("trained %d steps: loss_gate %.4f -> %.4f" % (args.steps, first[1], float(loss_gate)))


if __name__ == "__main__":
    main()
