"""Unpickle payloads produced by the Go encoder and print what Python sees.

Usage: /usr/bin/python3 testdata/verify_encoder.py NAME=FILE...
Prints one JSON object {NAME: description}. Uses the stand-in classes, so
objects come back as the exact nvrx class names. Standard library only.
"""

import json
import os
import pickle
import signal
import sys

sys.dont_write_bytecode = True  # keep testdata free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import standins  # noqa: E402,F401  (registers the nvrx modules)


def describe(v):
    if isinstance(v, signal.Signals):
        return {"signal": v.name, "value": int(v)}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, bytes):
        return {"bytes": v.hex()}
    if isinstance(v, dict):
        return {str(k): describe(x) for k, x in v.items()}
    return {"class": type(v).__module__ + "." + type(v).__qualname__,
            "attrs": {k: describe(x) for k, x in vars(v).items()}}


def main():
    out = {}
    for arg in sys.argv[1:]:
        name, path = arg.split("=", 1)
        with open(path, "rb") as fh:
            out[name] = describe(pickle.loads(fh.read()))
    json.dump(out, sys.stdout, sort_keys=True)


if __name__ == "__main__":
    main()
