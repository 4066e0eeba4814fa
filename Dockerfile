# syntax=docker/dockerfile:1
# Multi-stage: a release build, then a slim non-root runtime with only the binary and a config.
#
#   docker build -t goodput-proxy .
#   docker run --rm -p 8080:8080 -p 9090:9090 \
#     -v "$PWD/my-config.toml:/etc/goodput-proxy/goodput-proxy.toml:ro" goodput-proxy
#
# scripts/image.sh builds and checks this image with podman (on a machine that cannot pull the
# two base images it makes them from Debian's packages under the same names).

FROM rust:1-slim-trixie AS build
# jemalloc's build script runs make, which the slim Rust image does not have.
RUN apt-get update \
 && apt-get install -y --no-install-recommends make \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The cache mounts keep downloaded crates and the build directory between builds (BuildKit,
# podman): a rebuild compiles only what changed. Neither is part of any image. `COPY` gives
# every file a new mtime, which would make cargo recompile all four crates each time:
# image-mtimes.sh gives unchanged files the mtime of the build that compiled them.
RUN --mount=type=cache,id=goodput-proxy-cargo-registry,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,id=goodput-proxy-target,target=/src/target,sharing=locked \
    sh scripts/image-mtimes.sh restore \
 && CARGO_PROFILE_RELEASE_DEBUG=false \
    cargo build --release --locked -p goodput-proxy --bin goodput-proxy --features jemalloc \
 && sh scripts/image-mtimes.sh save \
 && cp target/release/goodput-proxy /goodput-proxy
# Without debug info: the release profile keeps line tables for profiling, which the image
# would only strip again (about 100 MB); its symbols stay, enough for named backtraces, and the
# build no longer spends time making what it throws away.

FROM debian:trixie-slim
RUN useradd --system --no-create-home --uid 10001 goodput
COPY --from=build /goodput-proxy /usr/local/bin/goodput-proxy
COPY config/goodput-proxy.toml /etc/goodput-proxy/goodput-proxy.toml
# Mount your own config over the file above; these make the image listen beyond loopback.
ENV GOODPUT_PROXY_CONFIG=/etc/goodput-proxy/goodput-proxy.toml \
    GOODPUT_PROXY_SERVER_LISTEN=0.0.0.0:8080 \
    GOODPUT_PROXY_SERVER_ADMIN_LISTEN=0.0.0.0:9090
USER 10001
# 8080: the OpenAI-compatible API. 9090: admin (/healthz, /readyz, /metrics, /stats, / the
# dashboard page).
EXPOSE 8080 9090
# No curl in the slim image: bash's /dev/tcp speaks enough HTTP for a liveness check.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/9090 && printf 'GET /healthz HTTP/1.0\\r\\n\\r\\n' >&3 && head -n1 <&3 | grep -q ' 200 '"]
ENTRYPOINT ["goodput-proxy"]
CMD ["serve"]
