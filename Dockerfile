# syntax=docker/dockerfile:1
# One Dockerfile, two images, chosen by the BACKEND build argument:
#   docker build -t llm-server:cuda .                          CUDA (default; NVIDIA's toolkit)
#   docker build -t llm-server:cpu --build-arg BACKEND=cpu .   CPU only (no CUDA toolkit at all)
# Stages: build (compiles the server with the scripts CI runs), runtime (slim, non-root), test
# (starts the installed server as the image's user and checks it; CI builds it with
# --target test), and the final image, which is the runtime stage. README "Docker" has the
# run commands, model mounts and the podman equivalents.
ARG BACKEND=cuda
ARG BUILD_IMAGE=debian:12
ARG RUNTIME_IMAGE=debian:12-slim

FROM ${BUILD_IMAGE} AS build
ARG BACKEND
# BACKEND=cuda on a base image whose apt sources lack NVIDIA's repository: the URL of its
# cuda-keyring package (scripts/install_cuda_toolkit.sh reads it from the environment).
ARG CUDA_KEYRING_URL=""
WORKDIR /src
# Dependencies first, in their own layer, so a source change does not reinstall them.
COPY scripts/install_deps.sh scripts/install_cuda_toolkit.sh scripts/
RUN scripts/install_deps.sh --image \
    && if [ "$BACKEND" = cuda ]; then scripts/install_cuda_toolkit.sh; fi \
    && apt-get clean && rm -rf /var/lib/apt/lists/*
COPY . .
# The ccache mount survives between builds on one machine; a first build compiles from scratch.
RUN --mount=type=cache,target=/root/.cache/ccache,id=llm-ccache-${BACKEND} \
    CCACHE_DIR=/root/.cache/ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache \
    CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CUDA_COMPILER_LAUNCHER=ccache \
    BACKEND="$BACKEND" scripts/docker_build_stage.sh /opt/llm /opt/llm-test

FROM ${RUNTIME_IMAGE} AS runtime
COPY scripts/install_runtime_deps.sh /tmp/
RUN /tmp/install_runtime_deps.sh && rm /tmp/install_runtime_deps.sh \
    && useradd --system --uid 10001 --create-home llm
COPY --from=build /opt/llm /opt/llm
# /opt/llm/lib holds the CUDA runtime libraries the CUDA server links (cudart, cuBLAS), copied by
# the build stage (empty in the CPU image); the driver comes from the host (docker run --gpus).
ENV LD_LIBRARY_PATH=/opt/llm/lib PATH=/opt/llm/bin:$PATH
USER llm
WORKDIR /home/llm
EXPOSE 50051 8000 9400
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD ["llm-healthcheck", "127.0.0.1:50051"]
# container.json listens on 0.0.0.0 (gRPC 50051, metrics 9400; the OpenAI HTTP API on 8000) and
# serves the embedded tiny model; flags given to `docker run IMAGE ...` are appended and override it (--model /models/x).
ENTRYPOINT ["llm-server", "--config", "/opt/llm/configs/container.json", \
            "--http-address", "0.0.0.0:8000"]

FROM runtime AS test
USER root
RUN apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
       python3 python3-grpcio python3-protobuf \
    && apt-get clean && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/llm-test /opt/llm-test
COPY scripts/docker_image_check.py /opt/llm-test/
USER llm
RUN python3 /opt/llm-test/docker_image_check.py \
    --entrypoint llm-server --config /opt/llm/configs/container.json \
    --healthcheck llm-healthcheck --target 127.0.0.1:50051 --proto-python /opt/llm-test/python

FROM runtime
