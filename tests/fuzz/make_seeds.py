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

# WordPiece vocabulary (vocab.txt): specials, ## continuations, CRLF and trailing whitespace, a non-ASCII token
put("vocab", "bert_like", "[PAD]\n[unused0]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nparis\nis\nthe\ncapital\nof\nfrance\n"
    "##s\n##ing\n.\n,\n;\nx\ny\n5\n+\n3\n=\n8\ncafe\n")
put("vocab", "crlf_trailing", "[UNK]\r\nhello \r\nworld\t\r\n##ly\r\n\u00e9t\u00e9\r\n\u65e5\r\n")
put("vocab", "no_unk", "a\nb\n##c\n")

# WordPiece input text: accents, CJK, punctuation and symbols, special tokens, controls, a long word, a bad byte
put("wordpiece", "plain", "Paris is the capital of France. Hello, world!")
put("wordpiece", "unicode", "Na\u00efve caf\u00e9 \u00c9T\u00c9 \u6771\u4eac\u3068\u30ab\u30bf\u30ab\u30ca "
    "\ud55c\uad6d \u03a3\u03c3 \u0130stanbul \u20ac5 \u00bd \u2460 \ufb01 \uff21")
put("wordpiece", "specials", "x[MASK]y [CLS] [mask] [SEP][SEP] [PAD]\t[UNK]\n")
put("wordpiece", "controls", "a\u200bb\u00adc\ufeffd\u0085e\u000bf\r\ng\u3000h")
put("wordpiece", "long_word", "a" * 100 + " " + "b" * 101 + " unaffable")
put("wordpiece", "invalid", b"caf\xc3 au lait \xff\xfe")

# SentencePiece models (spm.model): the golden identity-normaliser model, the same cut short, and hand-made
# ModelProtos: no pieces, a BPE model, pieces without [CLS] / [SEP], a character map whose trie size does not fit
def pb_varint(v):
    out = b""
    while True:
        b = v & 0x7F
        v >>= 7
        out += bytes([b | (0x80 if v else 0)])
        if not v:
            return out


def pb_bytes(field, data):
    return pb_varint(field << 3 | 2) + pb_varint(len(data)) + data


def pb_int(field, v):
    return pb_varint(field << 3) + pb_varint(v)


def spm_piece(text, score, kind=1):
    return pb_bytes(1, pb_bytes(1, text.encode()) + pb_varint(2 << 3 | 5) + struct.pack("<f", score) + pb_int(3, kind))


with open(os.path.join(here, "..", "data", "deberta", "spm", "spm_identity.model"), "rb") as f:
    identity = f.read()
put("spm_model", "identity", identity)
put("spm_model", "identity_cut", identity[:len(identity) // 3])
put("spm_model", "no_pieces", pb_bytes(2, pb_int(3, 1)))
put("spm_model", "bpe", spm_piece("<unk>", 0, 2) + spm_piece("a", -1) + pb_bytes(2, pb_int(3, 2)))
put("spm_model", "no_specials", spm_piece("[UNK]", 0, 2) + spm_piece("\u2581a", -1) + spm_piece("b", -2)
    + pb_bytes(2, pb_int(3, 1) + pb_int(40, 0)))
put("spm_model", "deberta_tiny", spm_piece("[PAD]", 0, 3) + spm_piece("[CLS]", 0, 3) + spm_piece("[SEP]", 0, 3)
    + spm_piece("[UNK]", 0, 2) + spm_piece("\u2581", -2) + spm_piece("a", -3) + spm_piece("\u2581a", -1.5)
    + pb_bytes(2, pb_int(3, 1) + pb_int(40, 3) + pb_int(41, 1) + pb_int(42, 2) + pb_int(43, 0))
    + pb_bytes(3, pb_bytes(1, b"nmt_nfkc") + pb_bytes(2, struct.pack("<I", 8) + b"\x00" * 8 + b"a\x00")))
# (charsmap_tiny, a unigram model with a small character map of its own, was trained by sentencepiece's spm_train:
#   spm_train --input=corpus.txt --model_prefix=tiny --vocab_size=34 --model_type=unigram
#             --normalization_rule_tsv=rules.tsv --pad_id=0 --bos_id=1 --eos_id=2 --unk_id=3 --pad_piece=[PAD]
#             --bos_piece=[CLS] --eos_piece=[SEP] --unk_piece=[UNK]
#  on five short English lines, with rules mapping U+FF41/FF42, U+FB01, e U+0301, U+3000 and U+200B; it is kept as is.)
put("spm_model", "bad_charsmap", spm_piece("[PAD]", 0, 3) + spm_piece("[CLS]", 0, 3) + spm_piece("[SEP]", 0, 3)
    + spm_piece("[UNK]", 0, 2) + spm_piece("a", -1)
    + pb_bytes(2, pb_int(3, 1) + pb_int(40, 3)) + pb_bytes(3, pb_bytes(2, struct.pack("<I", 4096) + b"xx")))

# SentencePiece input text: what the character map changes (full-width, ligatures, accents as clusters, zero-width
# and other spaces at the ends), emoji sequences, Hangul jamo, special tokens and their look-alikes, a bad byte
put("spm_text", "plain", "The old library has more than 40,000 books.")
put("spm_text", "charsmap", " \uff26\uff55\uff4c\uff4c \ufb01 cafe\u0301\u0301 CAFE\u0301 \u2460 \u3000x\u200b")
put("spm_text", "clusters", "\U0001F44D\U0001F3FD \U0001F469\u200d\U0001F4BB \U0001F1EB\U0001F1F7\U0001F1EC "
    "\u1100\u1161\u11a8 \u0915\u094d\u0937 a\r\nb")
put("spm_text", "specials", "x[MASK]y [CLS][SEP] [sep] \uff3b\uff33\uff25\uff30\uff3d <0x41> [PAD]\t[UNK]")
put("spm_text", "spaces", "\t\u0085 a  \u00a0 b \u200e\ufeff")
put("spm_text", "invalid", b"caf\xc3 au lait \xff\xfe")

# BERT config.json
with open(os.path.join(here, "..", "data", "bert", "hf_fixtures", "f32", "config.json"), "rb") as f:
    put("bert_config", "hf_fixture_f32", f.read())
put("bert_config", "classifier", json.dumps({
    "model_type": "bert", "architectures": ["BertForSequenceClassification"], "vocab_size": 30, "hidden_size": 8,
    "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 16, "max_position_embeddings": 16,
    "hidden_act": "gelu_new", "layer_norm_eps": 1e-12, "pad_token_id": None, "classifier_dropout": 0.2,
    "id2label": {"0": "contradiction", "1": "entailment", "2": "neutral"},
    "label2id": {"contradiction": 0, "entailment": 1, "neutral": 2}, "num_labels": 3}))
put("bert_config", "empty_object", "{}")
# DeBERTa config.json: the hub fixture (v3 layout, pos_att_type as a list), a v2-like one (string, absolute
# positions, token types, embed_proj), the bare defaults
with open(os.path.join(here, "..", "data", "deberta", "deberta_fixtures", "f32", "config.json"), "rb") as f:
    put("deberta_config", "hub_fixture_f32", f.read())
put("deberta_config", "v2like", json.dumps({
    "model_type": "deberta-v2", "vocab_size": 128, "hidden_size": 32, "num_hidden_layers": 2,
    "num_attention_heads": 4, "intermediate_size": 64, "max_position_embeddings": 64, "type_vocab_size": 2,
    "relative_attention": True, "max_relative_positions": 16, "position_buckets": -1, "pos_att_type": "c2p|p2c",
    "share_att_key": False, "norm_rel_ebd": "none", "position_biased_input": True, "embedding_size": 16,
    "hidden_act": "gelu_new", "pooler_hidden_act": "tanh", "conv_kernel_size": 0, "pad_token_id": None,
    "id2label": {"0": "contradiction", "1": "entailment"}}))
put("deberta_config", "empty_object", "{}")
put("config", "files_wordpiece", json.dumps({
    "d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32, "data_source": "dalpha", "dalpha_source": "files",
    "babi": "/data/babi/en", "clutrr": "/data/clutrr.csv", "conceptnet": "", "capitals": "/data/capitals.txt",
    "synthetic_fallback": True, "tokenizer": "wordpiece", "vocab": "/models/bert/vocab.txt", "wiki_alpha": "none",
    "n_docs": 200, "no_isolation_check": True, "oracle": "/data/cache.jsonl", "oracle_fallback": "mock",
    "data_hash": "0123456789abcdef"}) + "\n")
