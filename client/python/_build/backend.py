"""A minimal in-tree PEP 517 build backend (standard library only).

The client has no dependencies and no compiled parts, so building its wheel
needs nothing but zipfile: `pip install ./client/python` then works on a
machine with no package index (pip would otherwise fetch setuptools first).
"""
import base64
import hashlib
import os
import zipfile

NAME = "ft_launcher_client"
VERSION = "0.1.0"
SUMMARY = "Rank-side client for ft-launcher's rank monitor (drop-in for nvrx RankMonitorClient)"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIST_INFO = f"{NAME}-{VERSION}.dist-info"


def _metadata():
    return (f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {VERSION}\n"
            f"Summary: {SUMMARY}\nRequires-Python: >=3.8\n")


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    d = os.path.join(metadata_directory, DIST_INFO)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "METADATA"), "w") as f:
        f.write(_metadata())
    return DIST_INFO


def _digest(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    name = f"{NAME}-{VERSION}-py3-none-any.whl"
    files = []
    pkg = os.path.join(ROOT, NAME)
    # Every .py of the package, its subpackages' included (state/).
    for d, dirs, fns in os.walk(pkg):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for fn in sorted(fns):
            if fn.endswith(".py"):
                rel = os.path.relpath(os.path.join(d, fn), pkg).replace(os.sep, "/")
                with open(os.path.join(d, fn), "rb") as f:
                    files.append((f"{NAME}/{rel}", f.read()))
    files.append((f"{DIST_INFO}/METADATA", _metadata().encode()))
    files.append((f"{DIST_INFO}/WHEEL", b"Wheel-Version: 1.0\nGenerator: ft-launcher in-tree backend\n"
                  b"Root-Is-Purelib: true\nTag: py3-none-any\n"))
    record = "".join(f"{p},{_digest(b)},{len(b)}\n" for p, b in files) + f"{DIST_INFO}/RECORD,,\n"
    files.append((f"{DIST_INFO}/RECORD", record.encode()))
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for p, b in files:
            z.writestr(p, b)
    return name
