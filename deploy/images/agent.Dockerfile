# syntax=docker/dockerfile:1
#
# tessera-agent: the per-node DaemonSet (device plugin for nvidia.com/gpu, enforcement,
# reports) and the `tessera-agent status` CLI.
# Build from the repository root:  hack/build-images agent
#   (or: docker build -f deploy/images/agent.Dockerfile -t tessera-agent .)
#
# What the agent needs from the host (the Helm chart's DaemonSet sets all of it up; each
# item is justified in deploy/helm/tessera/templates/agent.yaml):
#   /var/lib/kubelet/device-plugins  read-write  registers with the kubelet, serves its sockets
#   /var/lib/kubelet/pod-resources   read-only   the kubelet's PodResources API (reconcile)
#   /proc  (mounted at /host/proc)   read-only   /proc/<pid>/cgroup maps GPU processes to pods
#   /var/run/tessera                 read-write  admin socket (0600) and MPS pipe/log directories
#   /var/lib/tessera                 read-write  allocation checkpoint across agent restarts
#   hostPID                                      NVML reports host PIDs; the watchdog signals them
#   UID 0 with only CAP_KILL                     kubelet sockets are root's; signals cross users
#   NVIDIA container runtime (NVIDIA_VISIBLE_DEVICES=all, NVIDIA_DRIVER_CAPABILITIES=
#   utility,compute) which injects /dev/nvidia*, libnvidia-ml.so (NVML, loaded at run time)
#   and nvidia-cuda-mps-control; the image carries no driver files of its own.
#
# The runtime image is Debian slim rather than distroless: the NVIDIA runtime's hooks
# update the image's dynamic-linker cache (ldconfig), which distroless does not have.
ARG RUST_VERSION=1.95
FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS builder
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target-image \
    CARGO_TARGET_DIR=/src/target-image cargo build --release --locked -p tessera-agent \
 && install -D -m 0755 /src/target-image/release/tessera-agent /out/tessera-agent

FROM docker.io/library/debian:bookworm-slim
ARG VERSION=dev
LABEL org.opencontainers.image.title="tessera-agent" \
      org.opencontainers.image.description="Tessera node agent: device plugin for nvidia.com/gpu, GPU fraction enforcement, inventory reports" \
      org.opencontainers.image.source="https://github.com/tessera-gpu/tessera" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      dev.tessera.host-paths="/var/lib/kubelet/device-plugins:rw,/var/lib/kubelet/pod-resources:ro,/proc:/host/proc:ro,/var/run/tessera:rw,/var/lib/tessera:rw" \
      dev.tessera.privileges="hostPID,runAsUser=0,capabilities=KILL"
COPY --from=builder /out/tessera-agent /usr/local/bin/tessera-agent
# 9090: /metrics and /healthz.
EXPOSE 9090
ENTRYPOINT ["/usr/local/bin/tessera-agent"]
CMD ["run"]
