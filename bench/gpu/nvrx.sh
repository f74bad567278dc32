#!/bin/bash
# Assembles .nvrx/ (git-ignored) for bench/gpu/run.sh: the Python source of
# NVIDIA's nvidia-resiliency-ext at a release tag, from a git checkout, plus
# defusedxml (Debian's python3-defusedxml), the one module its launcher
# imports that the GPU image lacks. Its launcher is pure Python; the
# package's compiled parts (CUPTI straggler detection) are not imported by
# it. Carry .nvrx to the GPU machine with the run.
#   bench/gpu/nvrx.sh CHECKOUT [TAG]   (TAG default v0.6.0)
set -eu
src=${1:?usage: bench/gpu/nvrx.sh NVIDIA/nvidia-resiliency-ext checkout [tag]}
tag=${2:-v0.6.0}
dest=$PWD/.nvrx
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git -C "$src" archive "$tag" src/nvidia_resiliency_ext | tar -x -C "$tmp"
(cd "$tmp" && apt-get download python3-defusedxml >/dev/null && dpkg -x python3-defusedxml_*.deb deb)
rm -rf "$dest" && mkdir -p "$dest"
cp -r "$tmp/src/nvidia_resiliency_ext" "$tmp"/deb/usr/lib/python3/dist-packages/defusedxml "$dest"/
echo "$tag $(git -C "$src" rev-parse "$tag^{commit}")" >"$dest/VERSION"
echo "assembled $dest: $(cat "$dest/VERSION"), $(du -sh "$dest" | cut -f1)"
