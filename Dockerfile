# syntax=docker/dockerfile:1
# banlieue's controller images, running as uid 65532:
#   docker build --target proxmox    -t ghcr.io/banlieue/banlieue-proxmox:v0.1.0 .
#   docker build --target vsphere    -t ghcr.io/banlieue/banlieue-vsphere:v0.1.0 .
#   docker build --target libvirt    -t ghcr.io/banlieue/banlieue-libvirt:v0.1.0 .
#   docker build --target controller -t ghcr.io/banlieue/banlieue:v0.1.0 .
# proxmox, vsphere and controller are statically linked against musl, on distroless/static (no
# shell, no package manager). libvirt links libvirt's C library (libvirt0, glibc), and libvirt
# runs `ssh` for qemu+ssh:// URIs, so its image is debian-slim with exactly those two packages.
# The components in clusterctl/dist/ expect exactly these entrypoints: `banlieue-<provider>
# <flags>` and `banlieue controller <flags>`. Not built in CI (no container runtime there).

ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/* \
 && rustup target add x86_64-unknown-linux-musl
ENV CC_x86_64_unknown_linux_musl=musl-gcc \
    CARGO_PROFILE_RELEASE_STRIP=symbols \
    CARGO_PROFILE_RELEASE_LTO=thin
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --target x86_64-unknown-linux-musl \
        -p banlieue-proxmox --bin banlieue-proxmox \
        -p banlieue-vsphere --bin banlieue-vsphere \
        -p banlieue-controllers --bin banlieue \
 && mkdir /out \
 && cp target/x86_64-unknown-linux-musl/release/banlieue-proxmox \
       target/x86_64-unknown-linux-musl/release/banlieue-vsphere \
       target/x86_64-unknown-linux-musl/release/banlieue /out/

# libvirt: dynamically linked against the distribution's libvirt (the `virt` crate's bindings).
FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build-libvirt
RUN apt-get update \
 && apt-get install -y --no-install-recommends libvirt-dev pkg-config \
 && rm -rf /var/lib/apt/lists/*
ENV CARGO_PROFILE_RELEASE_STRIP=symbols \
    CARGO_PROFILE_RELEASE_LTO=thin
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p banlieue-libvirt --bin banlieue-libvirt \
 && mkdir /out \
 && cp target/release/banlieue-libvirt /out/

FROM gcr.io/distroless/static-debian12:nonroot AS proxmox
COPY --from=build /out/banlieue-proxmox /banlieue-proxmox
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["/banlieue-proxmox"]

FROM gcr.io/distroless/static-debian12:nonroot AS vsphere
COPY --from=build /out/banlieue-vsphere /banlieue-vsphere
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["/banlieue-vsphere"]

FROM docker.io/library/debian:bookworm-slim AS libvirt
RUN apt-get update \
 && apt-get install -y --no-install-recommends libvirt0 openssh-client \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build-libvirt /out/banlieue-libvirt /banlieue-libvirt
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["/banlieue-libvirt"]

FROM gcr.io/distroless/static-debian12:nonroot AS controller
COPY --from=build /out/banlieue /banlieue
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/banlieue"]
