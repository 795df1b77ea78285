"""What torch a build venv holds, in that venv: its version, its CUDA
version ("" for a CPU build) and its requirements (a CUDA build pins the
toolkit the build needs). Prints one JSON line, {"version", "cuda",
"requires"}.

Standard library and torch only (see probes/__init__.py); started by path,
never imported by the tool."""

import importlib.metadata as md
import json

if __name__ == "__main__":
    import torch

    print(json.dumps({"version": md.version("torch"), "cuda": torch.version.cuda or "", "requires": md.requires("torch") or []}))
