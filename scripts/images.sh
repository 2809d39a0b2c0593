#!/usr/bin/env bash
# Builds the three module images from the Dockerfiles users build (amd64, arm64v8, arm32v7) and
# runs them: the amd64 container as IoT Edge runs it (UID 2000, named volumes, published ports,
# SIGTERM, a new container on the same volumes), the ARM ones under qemu (binfmt_misc). Then the
# repository's compose.yaml, as a user outside IoT Edge runs it (podman-compose).
#
#   scripts/images.sh [build|run|compose|record|all]     (default: all)
#
#   build     the three images, then `record`;  run  the scenarios on them (scenario.py)
#   record    write the sizes of the three images present to docs/images-run.json
#             ($GRIDLET_IMAGES_RECORD), which scripts/update-figures.py puts in the README and docs
#   compose   compose.yaml alone: podman-compose builds gridlet (Dockerfile.amd64) and the sample
#             subscriber, then scripts/images/compose.sh runs the stack (no ARM image is built)
#
# No registry is reachable here, so the base image the Dockerfiles name (rust:1.95-bookworm) is
# made locally from Debian's archive (mmdebstrap) plus rustup-init, and tagged with that name.
# What a rerun on the same machine can reuse is kept: the Debian root tarball under
# $GRIDLET_IMAGE_CACHE (default ~/.cache/gridlet/images), the builder image, and podman's layer
# cache (the dependency layer of each Dockerfile survives a source change).
#
# HTTPS from inside a build passes this machine's outbound proxy, whose CA only the host trusts:
# the host's CA bundle is mounted into the build steps, as users behind a TLS proxy do.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
CACHE=${GRIDLET_IMAGE_CACHE:-$HOME/.cache/gridlet/images}
CA=/etc/ssl/certs/ca-certificates.crt
BUILDER=docker.io/library/rust:1.95-bookworm
PODMAN=(podman --runtime runc)
# Raising an rlimit is not permitted in these sandboxes: run containers at or below the host's.
LIMITS=(--ulimit "nofile=$(ulimit -n):$(ulimit -n)" --ulimit "nproc=4096:4096")
REPORT=${GRIDLET_IMAGE_REPORT:-target/images-report.md}
RECORD=${GRIDLET_IMAGES_RECORD:-docs/images-run.json}
mkdir -p "$CACHE" "$(dirname "$REPORT")"

log() { echo "== images: $*"; }
fail() { echo "images: FAILED: $*" >&2; exit 1; }

# The ARM images' QEMU only when they are run.
install_tools() {
    local missing=() arm=()
    [ "$what" = compose ] || arm=(qemu-aarch64-static:qemu-user-static update-binfmts:binfmt-support)
    for tool in podman:podman buildah:buildah runc:runc mmdebstrap:mmdebstrap "${arm[@]}" \
                curl:curl python3:python3 setpriv:util-linux podman-compose:podman-compose \
                /usr/lib/podman/netavark:netavark /usr/lib/podman/aardvark-dns:aardvark-dns \
                iptables:iptables; do
        command -v "${tool%%:*}" >/dev/null 2>&1 || missing+=("${tool##*:}")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        log "installing ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
}

# The builder image, made once per machine.
ensure_builder() {
    if podman image exists "$BUILDER"; then return; fi
    local root="$CACHE/rust-builder-base-amd64.tar"
    if [ ! -s "$root" ]; then
        log "making a Debian bookworm root for the builder (mmdebstrap)"
        mmdebstrap --quiet --format=tar --variant=minbase --include=ca-certificates,curl,gcc,libc6-dev \
            bookworm "$root.tmp" http://deb.debian.org/debian
        mv "$root.tmp" "$root"
    fi
    podman import --quiet "$root" localhost/gridlet-builder-base:bookworm >/dev/null
    log "making $BUILDER (rustup-init, toolchain 1.95.0)"
    podman build --quiet --isolation chroot -v "$CA:$CA:ro" \
        -f scripts/images/rust-builder.Containerfile -t "$BUILDER" scripts/images >/dev/null
}

# build PLATFORM DOCKERFILE OCI_PLATFORM: the image as a user builds it, tagged gridlet:PLATFORM.
# The build stage runs on this host's architecture and cross-compiles. Docker's BuildKit does that
# with `--platform linux/arm64` and the Dockerfile's `FROM --platform=$BUILDPLATFORM`; the
# buildah/podman 4.3 of Debian bookworm ignores the FROM flag and would look for an ARM Rust image,
# so here the image is built for the host and then labelled with its real platform.
build() {
    local platform=$1 dockerfile=$2 oci=$3 start end size ctr
    start=$(date +%s)
    log "building gridlet:$platform from $dockerfile"
    podman build --isolation chroot --pull=never -v "$CA:$CA:ro" \
        -f "$dockerfile" -t "gridlet:$platform" . > "target/image-build-$platform.log" 2>&1 \
        || { tail -30 "target/image-build-$platform.log"; fail "building $dockerfile"; }
    if [ "$oci" != linux/amd64 ]; then
        local arch=${oci#linux/} variant=""
        case "$arch" in arm64) variant=v8 ;; arm/v7) arch=arm variant=v7 ;; esac
        ctr=$(buildah from --pull-never "gridlet:$platform")
        buildah config --arch "$arch" --variant "$variant" "$ctr"
        buildah commit --quiet --rm "$ctr" "gridlet:$platform" >/dev/null
    fi
    end=$(date +%s)
    size=$(podman image inspect "gridlet:$platform" --format '{{.Size}}')
    log "gridlet:$platform built in $((end - start)) s, $((size / 1024)) KiB"
    echo "| $platform | $dockerfile | $((end - start)) s | $(awk -v s="$size" 'BEGIN{printf "%.1f MB", s/1e6}') |" >> "$REPORT"
}

build_all() {
    echo "| image | Dockerfile | build time | size |" > "$REPORT"
    echo "|---|---|---:|---:|" >> "$REPORT"
    build amd64 Dockerfile.amd64 linux/amd64
    build arm64v8 Dockerfile.arm64v8 linux/arm64
    build arm32v7 Dockerfile.arm32v7 linux/arm/v7
    cat "$REPORT"
    record
}

# The images' sizes as podman reports them (bytes of the uncompressed layers), when each was
# created, and the commit checked out (`dirty` when the tree has changes), as JSON for
# scripts/update-figures.py. Run by `build`; alone, it records the images already present.
record() {
    local rows=() platform size created
    for platform in amd64 arm64v8 arm32v7; do
        size=$(podman image inspect "gridlet:$platform" --format '{{.Size}}') \
            || fail "no image gridlet:$platform to record (scripts/images.sh build)"
        created=$(podman image inspect "gridlet:$platform" --format '{{.Created}}')
        rows+=("$platform" "$size" "$created")
    done
    python3 - "$RECORD" "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
        "$(git status --porcelain 2>/dev/null | grep -q . && echo dirty || echo clean)" \
        "$what" "${rows[@]}" <<'PY'
import json, sys
out, commit, tree, how, *rows = sys.argv[1:]
images = {}
for i in range(0, len(rows), 3):
    platform, size, created = rows[i:i + 3]
    images[platform] = {"size_bytes": int(size), "created": created}
date = min(v["created"] for v in images.values())[:10]
record = {
    "date": date,
    "command": "scripts/images.sh " + how,
    "commit": commit if how == "build" else None,
    "tree": tree if how == "build" else None,
    "images": images,
}
with open(out, "w") as f:
    f.write(json.dumps(record, indent=2, sort_keys=True) + "\n")
print(f"== images: sizes recorded in {out}")
PY
}

enable_binfmt() {
    [ -e /proc/sys/fs/binfmt_misc/register ] \
        || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc \
        || fail "cannot mount binfmt_misc (needed to run the ARM images under qemu)"
    for arch in aarch64 arm; do
        if [ ! -e "/proc/sys/fs/binfmt_misc/qemu-$arch" ]; then
            update-binfmts --enable "qemu-$arch" >/dev/null 2>&1 \
                || update-binfmts --import "qemu-$arch" >/dev/null 2>&1 || true
        fi
        [ -e "/proc/sys/fs/binfmt_misc/qemu-$arch" ] || fail "no binfmt_misc handler for qemu-$arch"
    done
}

run_all() {
    python3 scripts/images/scenario.py --image gridlet:amd64 --full
    enable_binfmt
    python3 scripts/images/scenario.py --image gridlet:arm64v8 --platform linux/arm64
    python3 scripts/images/scenario.py --image gridlet:arm32v7 --platform linux/arm/v7 --persisted
}

# compose.yaml with podman-compose, the way a user outside IoT Edge runs it; the scenario is
# scripts/images/compose.sh. podman-compose calls plain `podman`: this machine's runtime and rlimit
# needs (see PODMAN and LIMITS above) go in a containers.conf of its own, and the build flags
# through --podman-build-args. A user's host needs neither.
run_compose() {
    local conf=target/compose-containers.conf
    if [ "$what" = compose ]; then
        printf '| image | Dockerfile | build time | size |\n|---|---|---:|---:|\n' > "$REPORT"
    fi
    cat > "$conf" <<CONF
[containers]
default_ulimits = ["nofile=$(ulimit -n):$(ulimit -n)", "nproc=4096:4096"]
[engine]
runtime = "runc"
CONF
    CONTAINERS_CONF="$PWD/$conf" PODMAN_BUILD_ARGS="--isolation chroot --pull=never -v $CA:$CA:ro" \
        REPORT="$REPORT" bash scripts/images/compose.sh
}

install_tools
case "$what" in
    build) ensure_builder; build_all ;;
    run) run_all ;;
    compose) ensure_builder; run_compose ;;
    record) record ;;
    all) ensure_builder; build_all; run_all; run_compose ;;
    *) fail "usage: scripts/images.sh [build|run|compose|record|all]" ;;
esac
