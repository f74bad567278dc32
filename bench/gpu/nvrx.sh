#!/bin/bash
# Assembles .nvrx/ (git-ignored) for bench/gpu/run.sh: the Python source of
# NVIDIA's nvidia-resiliency-ext at a release tag, from a git checkout, plus
# defusedxml (Debian's python3-defusedxml), the one module its launcher
# imports that the GPU image lacks, and the protobuf/gRPC modules that
# nvrx's build generates (its launcher imports nvrx_interface_pb2 and
# log_aggregation_pb2_grpc): Debian's protoc 3.21 writes the messages (for a
# protobuf runtime >= 4.21), Debian's grpc_tools the gRPC stubs. Its launcher
# is pure Python; the package's compiled part (CUPTI straggler detection) is
# not imported by it. Carry .nvrx to the GPU machine with the run.
# Needs: git, apt-get download, protobuf-compiler, python3-grpc-tools.
#   bench/gpu/nvrx.sh CHECKOUT [TAG]   (TAG default v0.6.0)
set -eu
src=${1:?usage: bench/gpu/nvrx.sh NVIDIA/nvidia-resiliency-ext checkout [tag]}
tag=${2:-v0.6.0}
if ! command -v protoc >/dev/null || ! /usr/bin/python3 -c 'import grpc_tools' 2>/dev/null; then
	echo "bench/gpu/nvrx.sh: needs protoc and grpc_tools: apt-get install -y protobuf-compiler python3-grpc-tools" >&2
	exit 2
fi
dest=$PWD/.nvrx
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git -C "$src" archive "$tag" src/nvidia_resiliency_ext | tar -x -C "$tmp"
(cd "$tmp" && apt-get download python3-defusedxml >/dev/null && dpkg -x python3-defusedxml_*.deb deb)
rm -rf "$dest" && mkdir -p "$dest"
cp -r "$tmp/src/nvidia_resiliency_ext" "$tmp"/deb/usr/lib/python3/dist-packages/defusedxml "$dest"/
proto=nvidia_resiliency_ext/shared_utils/proto
protos=$(cd "$dest" && ls $proto/*.proto)
(cd "$dest" && protoc -I. --python_out=. $protos && /usr/bin/python3 -m grpc_tools.protoc -I. --grpc_python_out=. $protos)
echo "$tag $(git -C "$src" rev-parse "$tag^{commit}")" >"$dest/VERSION"
echo "assembled $dest: $(cat "$dest/VERSION"), $(du -sh "$dest" | cut -f1)"
