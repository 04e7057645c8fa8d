#!/usr/bin/env python3
"""Turns a checkpoint of the PyTorch reference (runs/dea/checkpoint.pt: state_dict, cfg, tokenizer state, step)
into a directory that dea's `eval` (and `train --resume`, as a fresh start) reads:

    OUT_DIR/checkpoint.safetensors   the state_dict as float32 under its own names (tied mlm_head.weight and
                                     the positional buffer included; dea checks and uses both)
    OUT_DIR/config.json              the run's cfg (the reference's flag names are dea's)
    OUT_DIR/tokenizer.txt            the SimpleTokenizer vocabulary, one token per line in id order

Usage: python3 import_reference_checkpoint.py runs/dea/checkpoint.pt OUT_DIR
Needs PyTorch (Debian: python3-torch). Only the state_dict is needed from PyTorch; the file is written without the
safetensors package. The tokenizer state may be a token -> id mapping, an id -> token list, or a dict holding
one of those (keys such as 'vocab', 'stoi', 'itos', 'word2id', 'id2word', 'token_to_id').
"""
import json
import os
import struct
import sys


def fail(msg):
    sys.stderr.write(f"import_reference_checkpoint: {msg}\n")
    sys.exit(2)


def vocabulary(state):
    """The tokens in id order, from any of the layouts the docstring names."""
    if isinstance(state, (list, tuple)):
        return [str(t) for t in state]
    if isinstance(state, dict):
        if state and all(isinstance(v, int) for v in state.values()):
            inv = sorted(state.items(), key=lambda kv: kv[1])
            if [i for _, i in inv] != list(range(len(inv))):
                fail("tokenizer: the token -> id mapping does not cover 0..n-1 exactly once")
            return [t for t, _ in inv]
        for key in ("itos", "id2word", "id_to_token", "vocab", "stoi", "word2id", "token_to_id"):
            if key in state:
                return vocabulary(state[key])
    for attr in ("itos", "id2word", "vocab", "stoi", "word2id"):
        if hasattr(state, attr):
            return vocabulary(getattr(state, attr))
    fail(f"tokenizer: cannot read a vocabulary from a {type(state).__name__}")


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        data = tensors[name].detach().to("cpu").float().contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = {"format": "reference-state-dict"}
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    write_atomic(path, [struct.pack("<Q", len(h)) + h] + blobs)


def write_atomic(path, pieces):
    """Writes the byte strings `pieces` to `path` through a temporary file, fsync and rename: a crash leaves the
    old file or the new one, never half of it."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            for b in pieces:
                f.write(b)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def main():
    if len(sys.argv) != 3:
        fail("usage: import_reference_checkpoint.py CHECKPOINT.pt OUT_DIR")
    try:
        import torch
    except ImportError:
        fail("needs PyTorch to read a .pt checkpoint (Debian: apt-get install python3-torch)")

    src, out = sys.argv[1], sys.argv[2]
    if os.path.exists(out) and not os.path.isdir(out):
        fail(f"{out}: exists and is not a directory")
    old = [f for f in ("checkpoint.safetensors", "config.json", "tokenizer.txt", "train_log.jsonl")
           if os.path.exists(os.path.join(out, f))]
    if old:
        fail(f"{out}: already holds a run ({old[0]}); choose a new directory")
    try:
        ck = torch.load(src, map_location="cpu")
    except Exception as e:  # a missing or unreadable file: say which
        fail(f"{src}: cannot load ({e})")
    if not isinstance(ck, dict):
        fail(f"{src}: expected a dict with 'state_dict', 'cfg' and 'tokenizer', got {type(ck).__name__}")
    sd = ck.get("state_dict") or ck.get("model")
    if sd is None:
        fail(f"{src}: no 'state_dict' entry (keys: {sorted(ck)})")
    cfg = ck.get("cfg") or ck.get("config") or {}
    if not isinstance(cfg, dict):
        cfg = vars(cfg)
    tok = ck.get("tokenizer") or ck.get("tokenizer_state")
    if tok is None:
        fail(f"{src}: no tokenizer state (keys: {sorted(ck)})")
    # everything is read and checked before the first file is written
    vocab = vocabulary(tok)
    cfg = {k: v for k, v in cfg.items() if isinstance(v, (int, float, str, bool, list, type(None)))}
    cfg.pop("resume", None)
    os.makedirs(out, exist_ok=True)
    write_safetensors(os.path.join(out, "checkpoint.safetensors"), sd)
    write_atomic(os.path.join(out, "config.json"), [json.dumps(cfg, indent=2).encode()])
    write_atomic(os.path.join(out, "tokenizer.txt"), ["".join(t + "\n" for t in vocab).encode()])
    print(f"wrote {out}/checkpoint.safetensors ({len(sd)} tensors), config.json, tokenizer.txt; step {ck.get('step')}")


if __name__ == "__main__":
    main()
