# syntax=docker/dockerfile:1
# Multi-stage image. The build stage runs the same scripts CI runs (scripts/install_deps.sh,
# scripts/install_cuda_toolkit.sh, the release preset), so the image cannot drift from what is
# tested. The runtime stage is slim and runs as a non-root user.
#
#   docker build -t llm-server .
#   docker run --gpus all -p 50051:50051 -p 9400:9400 -v /models/llama3:/models/llama3:ro \
#       llm-server --model /models/llama3

FROM debian:12 AS build
WORKDIR /src
COPY . .
RUN scripts/docker_build_stage.sh /opt/llm

FROM debian:12-slim AS runtime
COPY scripts/install_runtime_deps.sh /tmp/
RUN /tmp/install_runtime_deps.sh && rm /tmp/install_runtime_deps.sh \
    && useradd --system --uid 10001 --create-home llm
COPY --from=build /opt/llm /opt/llm
# /opt/llm/lib holds the CUDA runtime libraries the server links (cudart, cuBLAS), copied by the
# build stage; the driver comes from the host (docker run --gpus).
ENV LD_LIBRARY_PATH=/opt/llm/lib PATH=/opt/llm/bin:$PATH
USER llm
EXPOSE 50051 8000 9400
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD ["llm-healthcheck", "127.0.0.1:50051"]
# Inside a container the server must listen beyond loopback for -p to work.
ENTRYPOINT ["llm-server", "--config", "/opt/llm/configs/server.json", \
            "--listen-address", "0.0.0.0:50051", "--metrics-address", "0.0.0.0:9400", \
            "--http-address", "0.0.0.0:8000", \
            "--model-dir", "/opt/llm/models/tiny-llama"]
