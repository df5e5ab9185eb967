# syntax=docker/dockerfile:1
#
# tessera-coordinator: the cluster scheduler (Deployment, non-root).
# Build from the repository root:  hack/build-images coordinator
#   (or: docker build -f deploy/images/coordinator.Dockerfile -t tessera-coordinator .)
#
# Stage 1 compiles with the pinned Rust toolchain; the protobuf definitions are compiled by
# build.rs in pure Rust (protox), so no protoc is needed. TLS is rustls with ring: the
# binary needs only glibc at run time, which is why the runtime image is distroless/cc
# rather than distroless/static (a musl build would allow static; glibc is what CI tests).
ARG RUST_VERSION=1.95
FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS builder
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target-image \
    CARGO_TARGET_DIR=/src/target-image cargo build --release --locked -p tessera-coordinator \
 && install -D -m 0755 /src/target-image/release/tessera-coordinator /out/tessera-coordinator

# Stage 2: no shell, no package manager; runs as the distroless `nonroot` user (65532).
FROM gcr.io/distroless/cc-debian12:nonroot
ARG VERSION=dev
LABEL org.opencontainers.image.title="tessera-coordinator" \
      org.opencontainers.image.description="Tessera scheduler: gang, fair-share, topology- and fraction-aware GPU placement" \
      org.opencontainers.image.source="https://github.com/tessera-gpu/tessera" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"
COPY --from=builder /out/tessera-coordinator /usr/local/bin/tessera-coordinator
USER 65532:65532
# 7070: gRPC for the node agents; 9090: /metrics, /healthz, /readyz.
EXPOSE 7070 9090
ENTRYPOINT ["/usr/local/bin/tessera-coordinator"]
CMD ["run"]
