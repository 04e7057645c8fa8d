#!/usr/bin/env python3
"""Runs `dea interop CASE --out OUT --compare [FLAG...]` and checks the file it wrote: it must hold, under the
case's names and shapes, every out.* and grad.* tensor the case stores (the reference's results, so a program that
is not ours can compare them), and --compare must pass. Prints "interop --out: ok (N tensors)" on success.

usage: check_interop_out.py DEA CASE.safetensors OUT.safetensors [FLAG...]   (--pe TABLE.safetensors, --hf_model DIR)
"""
import json
import struct
import subprocess
import sys


def header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    h.pop("__metadata__", None)
    return h


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    dea, case, out = sys.argv[1:4]
    extra = sys.argv[4:]
    r = subprocess.run([dea, "interop", case, "--out", out, "--compare"] + extra, capture_output=True, text=True)
    sys.stdout.write(r.stdout)
    sys.stderr.write(r.stderr)
    if r.returncode != 0:
        sys.exit(f"dea interop exited {r.returncode}")
    want = {k: v for k, v in header(case).items() if k.startswith("out.") or k.startswith("grad.")}
    got = header(out)
    problems = []
    for name, e in sorted(want.items()):
        if name not in got:
            problems.append(f"{name}: missing from {out}")
        elif got[name]["shape"] != e["shape"]:
            problems.append(f"{name}: shape {got[name]['shape']}, the case's {e['shape']}")
    extra_names = [k for k in got if not (k.startswith("out.") or k.startswith("grad."))]
    if extra_names:
        problems.append(f"names other than out.* / grad.*: {extra_names[:5]}")
    if not want:
        problems.append(f"{case} holds no out.* / grad.* tensor")
    if problems:
        sys.exit("interop --out: FAILED\n  " + "\n  ".join(problems))
    print(f"interop --out: ok ({len(want)} tensors of the case, {len(got)} written)")


if __name__ == "__main__":
    main()
