#!/usr/bin/env python3
"""Writes the hand-made seed corpora of the fuzz targets into tests/fuzz/corpus/<target>/ (run from anywhere).

The checkpoint seed is the real checkpoint of fuzz_checkpoint's tiny model:
    DEA_FUZZ_WRITE_SEED=tests/fuzz/corpus/checkpoint build/fuzz/tests/fuzz/fuzz_checkpoint
(then rename checkpoint.safetensors to seed_real). Seeds are small so the fuzzer's default input size covers them.
"""
import json
import os
import struct

here = os.path.dirname(os.path.abspath(__file__))


def put(target, name, data):
    d = os.path.join(here, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode("utf-8"))


def safetensors(tensors, metadata=None):
    """tensors: name -> (dtype, shape, raw bytes)"""
    header, blob = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, (dt, shape, raw) in tensors.items():
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(blob), len(blob) + len(raw)]}
        blob += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + blob


# safetensors
put("safetensors", "f32_matrix", safetensors({"W_q.weight": ("F32", [2, 3], struct.pack("<6f", *range(6)))},
                                             {"format": "pt"}))
put("safetensors", "all_dtypes", safetensors({
    "a": ("F64", [2], struct.pack("<2d", 1.5, -2.0)),
    "b": ("I32", [3], struct.pack("<3i", 1, -2, 3)),
    "c": ("I64", [], struct.pack("<q", 7)),
    "d": ("U8", [4], bytes([0, 1, 2, 255])),
    "e": ("BOOL", [2], bytes([0, 1])),
    "f": ("F32", [0, 5], b""),
}))
put("safetensors", "empty_header", safetensors({}))
put("safetensors", "metadata_only", safetensors({}, {"step": "3", "note": "caf\u00e9"}))
put("safetensors", "nan_inf", safetensors({"x": ("F32", [3], struct.pack("<3f", float("nan"), float("inf"), -0.0))}))

# alpha cache / records (JSONL)
put("alpha_cache", "cache", "\n".join([
    json.dumps({"premise": "Paris is the capital of France", "hypothesis": "France", "alpha": 0.87, "phi": 3.1,
                "sim": 0.42}),
    json.dumps({"q_text": "dog", "k_text": "animal", "alpha": 0.5, "phi": None}),
    "",
    json.dumps({"premise": "a", "hypothesis": "b", "alpha": 0}),
]) + "\n")
put("alpha_cache", "records", "\n".join([
    json.dumps({"q_text": "Mary went to the kitchen. Where is Mary?", "k_text": "kitchen", "label": 1,
                "source": "babi", "relation": "qa16", "strength": "strong", "alpha": 0.9}),
    json.dumps({"q_text": "x", "k_text": "y", "label": False}),
]) + "\r\n")

# tokenizer
put("tokenizer", "text", "Paris is the capital of France. 5+3=8, 12*4-1 = 47!")
put("tokenizer", "unicode", "Paris\u2192France caf\u00e9 \u0436\u0443\u043a \u65e5\u672c \u00d7 \u2013 \ufffd\xff")
put("tokenizer", "vocab", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nparis\nis\nthe\n,\n5+3\n")

# bAbI
put("babi", "qa16", "1 Lily is a frog.\n2 Bernhard is a swan.\n3 Lily is white.\n"
    "4 What color is Bernhard?\twhite\t3 1\n1 Greg is a lion.\n2 What is Greg?\tlion\t1\n")
put("babi", "qa18", "1 The box is bigger than the chest.\r\n2 Does the chest fit in the box?\tyes\t1\r\n")

# CLUTRR
put("clutrr", "clean", "id,story,query,target,clean_story\n"
    "0,\"[Anna] is [Bob]'s mother.\",\"('Bob', 'Anna')\",mother,\"Anna is Bob's mother.\"\n"
    "1,\"[Carl] and his son [Dan], \"\"quoted\"\"\n went out.\",\"('Dan', 'Carl')\",father,\n")
put("clutrr", "target_text", "\ufeffstory,query,target_text\n[A] likes [B].,\"('A', 'B')\",friend\n")

# ConceptNet assertions and capitals (one target reads both)
put("conceptnet", "assertions", "/a/[/r/IsA/,/c/en/dog/,/c/en/animal/]\t/r/IsA\t/c/en/dog\t/c/en/animal\t{}\n"
    "/a/x\t/r/PartOf\t/c/en/wheel/n\t/c/en/car\t{\"weight\": 1.0}\n"
    "/a/y\t/r/RelatedTo\t/c/fr/chien\t/c/en/dog\t{}\n")
put("conceptnet", "capitals", "capital,country\n# comment\nParis,France\nBerlin\tGermany\n")

# config.json
put("config", "config", json.dumps({
    "quick": False, "d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32, "dropout": 0.1, "max_len": 64,
    "batch_size": 8, "lr_main": 0.0003, "lr_gate": 0.001, "weight_decay": 0.01, "grad_clip": 1.0, "steps": 4,
    "gamma_steps": 2, "log_every": 2, "eval_every": 4, "seed": 42, "out_dir": "runs/dea", "data_source": "dalpha",
    "text": "", "oracle": "mock", "n_per_source": 20, "supervise_layers": [0, -1], "threads": 0, "resume": False,
    "eval_batches": 50}, indent=2) + "\n")
put("config", "minimal", "{}")
