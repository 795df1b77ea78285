#!/usr/bin/env bash
# Build the overlay's image over a MaxText image (image/Containerfile) and
# print its digest.
# Usage: scripts/build-image.sh --base IMAGE@sha256:DIGEST --release DIR|URL [--tag TAG]
#          [--install closure|replace] [--verify-args ARGS] [--offline]
#   --release   a release folder (scripts/build-wheels.sh's dist/: constraints.txt
#               and the wheels) or its URL (constraints.txt, SHA256SUMS and the
#               wheels SHA256SUMS lists are downloaded and checked)
#   --install   closure (default): resolve the closure under the constraints;
#               replace: only the release's wheels, --no-deps (a base that holds it)
#   --offline   the install uses no network (uv --offline; docker: --network none too;
#               podman's chroot isolation has only the host's network)
#   --verify-args  extra arguments of the verify gate (e.g. --files-only over a
#               base that lacks the closure: a stand-in)
# podman or docker, whichever is on PATH (podman first). Exit status: 0 built;
# 1 the build failed (the verify gate says why); 2 usage; 3 cannot build here
# (no podman or docker, a base not pinned by digest, a release without
# constraints.txt).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
me=build-image.sh

# This header, from its second line to the first line that is not a comment.
header() { awk 'NR > 1 { if (!/^#/) exit; sub(/^# ?/, ""); print }' "$0"; }
usage() { header >&2; exit 2; }
cannot() { echo "$me: $*" >&2; exit 3; }

base= release= tag= install=closure verify_args= offline=
while [ $# -gt 0 ]; do
  case "$1" in
    --base|--release|--tag|--install|--verify-args) [ $# -ge 2 ] || { echo "$me: $1 needs a value" >&2; usage; } ;;&
    --base) base=$2; shift 2 ;;
    --release) release=$2; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    --install) install=$2; shift 2 ;;
    --verify-args) verify_args=$2; shift 2 ;;
    --offline) offline=1; shift ;;
    -h|--help) header; exit 0 ;;
    *) echo "$me: unknown argument: $1" >&2; usage ;;
  esac
done
[ -n "$base" ] && [ -n "$release" ] || { echo "$me: --base and --release are required" >&2; usage; }
case "$install" in closure|replace) ;; *) echo "$me: --install $install: use closure or replace" >&2; usage ;; esac

if ! [[ "$base" =~ ^[^@[:space:]]+@sha256:[0-9a-f]{64}$ ]]; then
  cannot "--base $base is not pinned by digest (IMAGE@sha256:<64 hex>); get its digest with: podman image inspect --format '{{.Digest}}' $base  (or: docker buildx imagetools inspect $base)"
fi
if command -v podman >/dev/null; then engine=podman
elif command -v docker >/dev/null; then engine=docker
else cannot "neither podman nor docker is on PATH: install one of them to build the image"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/mrl-image.XXXXXX")
trap 'rm -rf "$work"' EXIT
context=$work/context
mkdir -p "$context/release"

# The release, into the build context.
if [[ "$release" =~ ^https?:// ]]; then
  url=${release%/}
  echo "$me: downloading the release from $url" >&2
  curl -fsSL "$url/constraints.txt" -o "$context/release/constraints.txt" || cannot "cannot download $url/constraints.txt"
  curl -fsSL "$url/SHA256SUMS" -o "$context/release/SHA256SUMS" || cannot "cannot download $url/SHA256SUMS"
  while read -r _ name; do
    [ -n "$name" ] || continue
    curl -fsSL "$url/$name" -o "$context/release/$name" || cannot "cannot download $url/$name"
  done < "$context/release/SHA256SUMS"
  (cd "$context/release" && sha256sum -c --quiet SHA256SUMS >&2) || cannot "the files downloaded from $url do not match its SHA256SUMS"
  # A stand-in release's overrides file, where it has one.
  curl -fsSL "$url/torch-standin-overrides.txt" -o "$context/release/torch-standin-overrides.txt" 2>/dev/null \
    || rm -f "$context/release/torch-standin-overrides.txt"
else
  [ -f "$release/constraints.txt" ] || cannot "$release holds no constraints.txt: give a release folder (scripts/build-wheels.sh's dist/) or its URL"
  cp -p "$release"/constraints.txt "$release"/*.whl "$context/release/"
  [ -f "$release/torch-standin-overrides.txt" ] && cp -p "$release/torch-standin-overrides.txt" "$context/release/"
fi
overlay_wheel=$(ls "$context"/release/maxtext_rl_overlay-*.whl 2>/dev/null | head -1)
[ -n "$overlay_wheel" ] || cannot "the release $release holds no maxtext_rl_overlay wheel: it is not a whole release"
version=$(basename "$overlay_wheel" | cut -d- -f2)
constraints_sha=$(sha256sum "$context/release/constraints.txt" | cut -d' ' -f1)
# The project commit the release's own wheel records (its build manifest).
commit=$(python3 -c 'import json, sys, zipfile
project = json.loads(zipfile.ZipFile(sys.argv[1]).read("maxtext_rl_overlay/manifest.json")).get("project") or {}
print(project.get("commit") or "unknown")' "$overlay_wheel") || cannot "$overlay_wheel carries no readable build manifest: it is not a release wheel"
uv=$(command -v uv || echo "$root/.venv/bin/uv")
[ -x "$uv" ] || cannot "no uv to install with (the build copies it into the context): run scripts/setup.sh"
cp "$uv" "$context/uv"
cp "$root/image/Containerfile" "$context/Containerfile"

args=(build --file "$context/Containerfile" --iidfile "$work/iid"
      --build-arg "BASE_IMAGE=$base" --build-arg "BASE_DIGEST=${base##*@}"
      --build-arg "CONSTRAINTS_SHA256=$constraints_sha" --build-arg "OVERLAY_VERSION=$version"
      --build-arg "PROJECT_COMMIT=$commit" --build-arg "INSTALL=$install" --build-arg "VERIFY_ARGS=$verify_args")
[ -n "$tag" ] && args+=(--tag "$tag")
if [ -n "$offline" ]; then
  args+=(--build-arg OFFLINE=1)
  [ "$engine" = docker ] && args+=(--network none)
fi
if [ "$engine" = podman ]; then
  # podman from Debian builds only with chroot isolation and runs only with
  # runc and explicit ulimits on some kernels: a containers.conf of our own,
  # for this command only; the machine's configuration is not touched.
  if [ -z "${CONTAINERS_CONF:-}" ]; then
    printf '[containers]\ndefault_ulimits = ["nofile=1024:20000", "nproc=4096:4096"]\n\n[engine]\nruntime = "runc"\n' > "$work/containers.conf"
    export CONTAINERS_CONF=$work/containers.conf
    echo "$me: podman with a containers.conf of its own (runtime runc, default_ulimits nofile/nproc) via CONTAINERS_CONF, and --isolation chroot; the machine's configuration is unchanged" >&2
  else
    echo "$me: podman with your CONTAINERS_CONF=$CONTAINERS_CONF, and --isolation chroot" >&2
  fi
  args+=(--isolation chroot)
fi
echo "$me: $engine building maxtext-rl-overlay $version over $base (install: $install${offline:+, no network})" >&2
"$engine" "${args[@]}" "$context" >&2 || { echo "$me: the build failed (the output above says where; a failed verify gate lists what differs)" >&2; exit 1; }
id=$(cat "$work/iid")
digest=$("$engine" image inspect --format '{{.Digest}}' "$id" 2>/dev/null || true)
echo "$me: built ${tag:-an untagged image}: id $id${digest:+, digest $digest}" >&2
echo "${digest:-$id}"
