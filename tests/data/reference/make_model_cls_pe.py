"""Writes model_cls_pe.safetensors: the sinusoidal positional table of the model_cls golden case, built the way
the reference's PositionalEncoding builds it (float32 on PyTorch's CPU kernels), widened to float64.

The golden case does not store this buffer; PyTorch's vectorised float exp/sin/cos are not correctly rounded in
every cell, so a table computed with another libm differs in a few cells by one float32 ulp.
Run with Debian's python3-torch (1.13): /usr/bin/python3 make_model_cls_pe.py
"""
import json
import math
import struct

import torch

D, MAX_LEN = 32, 64  # model_cls metadata: d_model, max_len
pe = torch.zeros(MAX_LEN, D)
position = torch.arange(0, MAX_LEN, dtype=torch.float).unsqueeze(1)
div_term = torch.exp(torch.arange(0, D, 2).float() * (-math.log(10000.0) / D))
pe[:, 0::2] = torch.sin(position * div_term)
pe[:, 1::2] = torch.cos(position * div_term)
data = pe.double().numpy().tobytes()
header = json.dumps({
    "pe": {"dtype": "F64", "shape": [MAX_LEN, D], "data_offsets": [0, len(data)]},
    "__metadata__": {"what": "sinusoidal positional table as the reference builds it (float32, PyTorch 1.13 CPU), widened to float64"},
}).encode()
header += b" " * ((8 - len(header) % 8) % 8)
with open("model_cls_pe.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(header)) + header + data)
