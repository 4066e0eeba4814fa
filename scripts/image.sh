#!/usr/bin/env bash
# The container image, built and run: builds the Dockerfile with podman and checks the image
# through its published ports, in demo mode (the built-in simulated engine) and in front of a
# simulator container (the proxy in the simulator's network namespace, as in a Kubernetes pod):
# /healthz, /readyz, a streamed chat completion, /metrics (the engine's families relabelled),
# the live page, the non-root user; then reports the image's size.
#
#   scripts/image.sh [all|build|check]        (default: all)
#
# Base images: the Dockerfile's FROM images are pulled when a registry answers; where none can
# be reached (this machine), they are made from Debian's packages with mmdebstrap and imported
# under the same names (docker.io/library/debian:SUITE-slim: a minimal SUITE;
# docker.io/library/rust:1-slim-SUITE: a minimal SUITE with Debian's rustc and cargo, gcc,
# libc6-dev and CA certificates, CARGO_HOME as in the official image). The Dockerfile is not
# changed: `docker build .` means the same with a registry. Made once, kept by podman.
#
# Cached between runs: podman keeps the layers, and the Dockerfile's cache mounts keep cargo's
# downloads and build directory, so a rebuild after a source change compiles only our crates.
#
# Needs root (podman with the runc runtime: crun refuses this machine's cgroups; explicit
# ulimits within the hard limits) and installs podman, runc and mmdebstrap from Debian's
# packages when missing. Environment: IMAGE (tag, default localhost/goodput-proxy:local),
# IMAGE_OUT (logs, default target/image), IMAGE_PULL=0 (never try a registry),
# IMAGE_CPU_SHARES (the build's CPU weight, podman's --cpu-shares), DEBIAN_MIRROR (default
# http://deb.debian.org/debian).
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE="${IMAGE:-localhost/goodput-proxy:local}"
OUT="${IMAGE_OUT:-target/image}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
mkdir -p "$OUT"
SECONDS=0
say() { echo "image.sh [${SECONDS}s] $*" >&2; }
die() { echo "image.sh: $*" >&2; exit 1; }

install_tools() {
    local missing=()
    # `type -P`, not `command -v`: the `podman` wrapper function below would answer for a
    # podman that is not installed.
    local tool
    for tool in podman runc mmdebstrap curl; do
        type -P "$tool" >/dev/null || missing+=("$tool")
    done
    [[ ${#missing[@]} == 0 ]] && return 0
    [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1 \
        || die "needs ${missing[*]} (Debian: apt-get install ${missing[*]})"
    say "installing ${missing[*]} (apt)"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends "${missing[@]}" uidmap) </dev/null >"$OUT/apt.log" 2>&1 \
        || die "apt-get install ${missing[*]} failed (see $OUT/apt.log)"
}

# Within the hard limits: podman's defaults ask for more than this machine allows.
hard_nofile="$(ulimit -Hn)"
hard_nproc="$(ulimit -Hu)"
cap() { if [[ "$1" == unlimited || "$1" -gt "$2" ]]; then echo "$2"; else echo "$1"; fi; }
nofile="$(cap "$hard_nofile" 65536)"
nproc="$(cap "$hard_nproc" 16384)"
ULIMITS=(--ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc")
podman() { command podman --runtime runc "$@"; }

# The FROM images of the Dockerfile, without its own stages.
base_images() {
    awk 'toupper($1) == "FROM" { print $2; if (toupper($3) == "AS") print "stage:" $4 }' Dockerfile \
        | awk '/^stage:/ { stages[substr($0, 7)] = 1; next } { images[++n] = $0 }
               END { for (i = 1; i <= n; i++) if (!(images[i] in stages)) print images[i] }'
}

# NAME made from Debian's packages and imported as NAME.
make_base() {
    local name="$1" ref="${1#docker.io/}" suite include="" changes=()
    ref="${ref#library/}"
    case "$ref" in
        debian:*-slim)
            suite="${ref#debian:}"; suite="${suite%-slim}" ;;
        rust:1-slim-*)
            suite="${ref#rust:1-slim-}"
            include="--include=rustc,cargo,gcc,libc6-dev,ca-certificates"
            changes=(--change "ENV CARGO_HOME=/usr/local/cargo"
                     --change "ENV PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin") ;;
        *) die "cannot pull $name and do not know how to make it from Debian's packages" ;;
    esac
    local tar="$OUT/base-${ref//[:\/]/_}.tar"
    say "making $name: mmdebstrap $suite (minbase${include:+, ${include#--include=}})"
    # As Debian's slim images: no documentation, manual pages or locales (copyrights kept).
    mmdebstrap --variant=minbase $include \
        --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
        "$suite" "$tar" "$MIRROR" >"$OUT/mmdebstrap.log" 2>&1 \
        || die "mmdebstrap $suite failed (see $OUT/mmdebstrap.log)"
    podman import "${changes[@]}" --change 'CMD ["bash"]' "$tar" "docker.io/library/$ref" >/dev/null
    rm -f "$tar"
}

ensure_bases() {
    local name
    for name in $(base_images); do
        local full="$name"
        [[ "$full" == */* ]] || full="docker.io/library/$full"
        if podman image exists "$full"; then
            continue
        fi
        if [[ "${IMAGE_PULL:-1}" != 0 ]] && timeout 120 podman pull -q "$full" >/dev/null 2>&1; then
            say "pulled $full"
            continue
        fi
        make_base "$full"
    done
}

build() {
    install_tools
    ensure_bases
    local extra=()
    # In the background of CI (IMAGE_CPU_SHARES=2): the build's RUN steps run in the container's
    # own cgroup, where the caller's `nice` does not reach, and at the default weight they took
    # half of the two cores from the test build beside them (339 s against 205 s alone).
    if [[ -n "${IMAGE_CPU_SHARES:-}" ]]; then
        extra+=(--cpu-shares "$IMAGE_CPU_SHARES")
    fi
    # A machine whose TLS goes through its own CA (crates.io through a proxy) lends the build's
    # RUN steps its CA bundle; nothing of it goes into the image.
    if [[ -f /etc/ssl/certs/ca-certificates.crt ]]; then
        extra+=(-v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)
    fi
    say "podman build -t $IMAGE . (log: $OUT/build.log)"
    local t0=$SECONDS
    # --format docker keeps the HEALTHCHECK (OCI images have none); --network host reaches the
    # package registries from the build.
    if ! podman build --format docker --network host "${ULIMITS[@]}" "${extra[@]}" \
            -t "$IMAGE" . >"$OUT/build.log" 2>&1; then
        tail -n 30 "$OUT/build.log" >&2
        die "podman build failed (see $OUT/build.log)"
    fi
    say "built $IMAGE in $((SECONDS - t0)) s"
    # Dangling layers of earlier builds: a day's worth kept for the cache.
    podman image prune -f --filter until=24h >/dev/null 2>&1 || true
}

# --- checks ---------------------------------------------------------------------------------
containers=()
# Newest first: a proxy container lives in its simulator's network namespace, and podman
# refuses to remove the simulator while the proxy still uses it.
cleanup() {
    local i
    for ((i = ${#containers[@]} - 1; i >= 0; i--)); do
        podman rm -f -t 2 "${containers[i]}" >/dev/null 2>&1 || true
    done
}
trap cleanup EXIT

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Waits until URL answers 200 (up to 30 s).
wait_ok() {
    local url="$1" i
    for i in $(seq 1 150); do
        if [[ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$url")" == 200 ]]; then
            return 0
        fi
        sleep 0.2
    done
    return 1
}

fail() {
    local c
    echo "image.sh: CHECK FAILED: $*" >&2
    for c in "${containers[@]}"; do
        echo "--- podman logs $c" >&2
        podman logs "$c" 2>&1 | tail -n 20 >&2 || true
    done
    exit 1
}

# The checks of one running proxy container: ADMIN and API are its published ports on loopback.
check_proxy() {
    local what="$1" api="$2" admin="$3" container="$4"
    wait_ok "$admin/healthz" || fail "$what: /healthz"
    wait_ok "$admin/readyz" || fail "$what: /readyz"
    local body
    body="$(curl -sN --max-time 30 "$api/v1/chat/completions" -H 'content-type: application/json' \
        -d '{"model":"tiny","messages":[{"role":"user","content":"Hello"}],"stream":true,"max_tokens":8}')" \
        || fail "$what: the streamed request"
    grep -q '^data: \[DONE\]' <<<"$body" || fail "$what: the stream did not end with [DONE]: $body"
    [[ "$(grep -c '"delta"' <<<"$body")" -ge 8 ]] || fail "$what: fewer than 8 chunks: $body"
    local metrics
    metrics="$(curl -s --max-time 10 "$admin/metrics")" || fail "$what: /metrics"
    grep -q '^goodput_proxy_requests_total{.*outcome="success".*} 1$' <<<"$metrics" \
        || fail "$what: /metrics does not count the stream as a success"
    grep -q '^vllm:num_requests_running{.*upstream=' <<<"$metrics" \
        || fail "$what: /metrics has no engine family relabelled with upstream"
    local page
    page="$(curl -s --max-time 10 "$admin/")" || fail "$what: the live page"
    grep -q 'data-panel="traffic"' <<<"$page" || fail "$what: the live page is not the dashboard"
    [[ "$(podman exec "$container" id -u)" == 10001 ]] || fail "$what: not running as uid 10001"
    # The Dockerfile's HEALTHCHECK, run once by hand (podman schedules it through systemd,
    # which this machine has not).
    podman healthcheck run "$container" >/dev/null 2>&1 || fail "$what: the image's HEALTHCHECK"
    say "$what: /healthz, /readyz, a stream ($(grep -c '"delta"' <<<"$body") chunks), /metrics, /, uid 10001, HEALTHCHECK: ok"
}

check() {
    # (podman run's complaints that no systemd schedules the HEALTHCHECK go to run.log.)
    : >"$OUT/run.log"
    podman image exists "$IMAGE" || die "no image $IMAGE (run: scripts/image.sh build)"
    local tag="gp-image-$$"
    local p1 p2 p3 p4
    p1="$(free_port)"; p2="$(free_port)"; p3="$(free_port)"; p4="$(free_port)"

    # 1. Demo mode: no upstream configured, the built-in simulated engine.
    containers+=("$tag-demo")
    podman run -d --name "$tag-demo" "${ULIMITS[@]}" \
        -p "127.0.0.1:$p1:8080" -p "127.0.0.1:$p2:9090" "$IMAGE" >/dev/null 2>>"$OUT/run.log"
    check_proxy "demo mode" "http://127.0.0.1:$p1" "http://127.0.0.1:$p2" "$tag-demo"
    # The log is read whole first: with pipefail, `podman logs | grep -q` fails whenever grep
    # exits at its match before podman has written the rest (podman then dies of SIGPIPE).
    local logs
    logs="$(podman logs "$tag-demo" 2>&1)"
    grep -q 'demo mode' <<<"$logs" || fail "demo mode: no demo-mode line in the log"

    # 2. In front of a simulator container: the proxy joins the simulator's network namespace
    #    (a pod: the engine on 127.0.0.1:8000), whose container publishes the proxy's ports.
    containers+=("$tag-sim" "$tag-proxy")
    podman run -d --name "$tag-sim" "${ULIMITS[@]}" \
        -p "127.0.0.1:$p3:8080" -p "127.0.0.1:$p4:9090" "$IMAGE" \
        sim --listen 127.0.0.1:8000 --seed 7 >/dev/null 2>>"$OUT/run.log"
    podman run -d --name "$tag-proxy" "${ULIMITS[@]}" --network "container:$tag-sim" \
        -e GOODPUT_PROXY_UPSTREAM_URLS=http://127.0.0.1:8000 "$IMAGE" >/dev/null 2>>"$OUT/run.log"
    check_proxy "proxy + simulator container" "http://127.0.0.1:$p3" "http://127.0.0.1:$p4" "$tag-proxy"
    logs="$(podman logs "$tag-proxy" 2>&1)"
    if grep -q 'demo mode' <<<"$logs"; then
        fail "proxy + simulator container: started in demo mode"
    fi

    # 3. What the image weighs.
    local size
    size="$(podman image inspect --format '{{.Size}}' "$IMAGE")"
    say "image $IMAGE: $((size / 1000000)) MB ($size bytes); user $(podman image inspect --format '{{.Config.User}}' "$IMAGE")"
    echo "$size" >"$OUT/size-bytes"
}

case "${1:-all}" in
    build) build ;;
    check) install_tools; check ;;
    all) build; check ;;
    *) die "usage: scripts/image.sh [all|build|check]" ;;
esac
say "done"
