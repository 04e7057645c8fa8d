"""A small test runner for the Python tests (each file is one ctest): runs every function named test_* of the
calling module in order, prints one line per test and exits 0 when all pass, 1 when one fails, and SKIP (77, the
tests' SKIP_RETURN_CODE) when a module they need is missing. Also a reader for the golden .safetensors files."""
import json
import os
import struct
import sys
import time
import traceback

import numpy as np

SKIP = 77
DATA = os.environ.get("DEA_TEST_DATA", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data"))
BENCH = os.environ.get("DEA_BENCH_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))


def skip_unless(module):
    """Imports `module` or exits with SKIP (the test is reported as skipped, not passed)."""
    try:
        return __import__(module)
    except ImportError as e:
        print("SKIPPED: %s is not importable (%s)" % (module, e))
        sys.exit(SKIP)


def run(namespace):
    tests = [(n, f) for n, f in namespace.items() if n.startswith("test_") and callable(f)]
    failed = []
    for name, f in tests:
        t0 = time.time()
        try:
            f()
            print("ok    %-48s %6.2f s" % (name, time.time() - t0), flush=True)
        except Exception:  # noqa: BLE001 (every failure is reported, then the next test runs)
            failed.append(name)
            print("FAIL  %s" % name, flush=True)
            traceback.print_exc()
    print("%d tests, %d failed%s" % (len(tests), len(failed), (": " + ", ".join(failed)) if failed else ""))
    sys.exit(1 if failed else 0)


def raises(exc_type, words, f, *args, **kwargs):
    """Calls f and checks that it raises exc_type with every string of `words` in its message."""
    try:
        f(*args, **kwargs)
    except exc_type as e:
        msg = str(e)
        for w in words:
            assert w in msg, "message %r lacks %r" % (msg, w)
        return msg
    raise AssertionError("expected %s mentioning %s" % (exc_type.__name__, words))


_DTYPES = {"F64": np.float64, "F32": np.float32, "I64": np.int64, "BOOL": np.bool_, "U8": np.uint8}


def load_safetensors(path):
    """(tensors as numpy arrays, metadata) of a .safetensors file."""
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__", {})
    body = blob[8 + n:]
    out = {}
    for name, h in header.items():
        a, b = h["data_offsets"]
        out[name] = np.frombuffer(body[a:b], dtype=_DTYPES[h["dtype"]]).reshape(h["shape"]).copy()
    return out, meta
