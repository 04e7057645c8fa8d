"""Runs examples/python/train_torch.py with the given arguments, or exits SKIP (77) when torch is not installed."""
import os
import runpy
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

harness.skip_unless("torch")
example = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "python", "train_torch.py")
sys.argv = [example] + sys.argv[1:]
runpy.run_path(example, run_name="__main__")
