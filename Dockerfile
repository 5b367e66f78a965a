# syntax=docker/dockerfile:1
# banlieue's two controller images, statically linked against musl, on distroless/static
# (no shell, no package manager), running as uid 65532:
#   docker build --target proxmox    -t ghcr.io/banlieue/banlieue-proxmox:v0.1.0 .
#   docker build --target controller -t ghcr.io/banlieue/banlieue:v0.1.0 .
# The components in clusterctl/dist/ expect exactly these entrypoints: `banlieue-proxmox <flags>`
# and `banlieue controller <flags>`. Not built in CI (no container runtime there).

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
        -p banlieue-controllers --bin banlieue \
 && mkdir /out \
 && cp target/x86_64-unknown-linux-musl/release/banlieue-proxmox \
       target/x86_64-unknown-linux-musl/release/banlieue /out/

FROM gcr.io/distroless/static-debian12:nonroot AS proxmox
COPY --from=build /out/banlieue-proxmox /banlieue-proxmox
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["/banlieue-proxmox"]

FROM gcr.io/distroless/static-debian12:nonroot AS controller
COPY --from=build /out/banlieue /banlieue
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/banlieue"]
