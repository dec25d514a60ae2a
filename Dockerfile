# syntax=docker/dockerfile:1.7
#
# mtgate images: ONNX Runtime / OpenVINO on CPU with the bundled demo model; no torch, no transformers.
#
#   make demo                                                       # builds models/demo-en-de from its source
#   docker build -t mtgate:latest .                                 # the server (the default target, `runtime`)
#   docker run --rm -p 8000:8000 -p 8001:8001 mtgate:latest         # serves models/demo-en-de: HTTP 8000, gRPC 8001
#   docker run --rm -p 8000:8000 -v "$PWD/my-pkg:/models/my-pkg:ro" \
#       -e MTGATE_MODEL_DIRS='["/models/my-pkg"]' mtgate:latest      # serves your package (from `mtgate convert`)
#   docker run --rm -p 8000:8000 -v "$PWD/repo:/models:ro" -e MTGATE_MODEL_REPOSITORY=/models \
#       -e MTGATE_REPOSITORY_POLL_SECS=30 mtgate:latest              # a repository <name>/<version>/, hot reloaded
#   docker build --target batch -t mtgate:batch .                   # batch-score (deploy/k8s/batch-score-job.yaml)
#   docker build --target ray -t mtgate:ray .                       # batch-score --ray (batch-score-rayjob.yaml)
#
# Every server setting is an environment variable MTGATE_<SETTING> (serving/server/settings.py), e.g. MTGATE_THREADS,
# MTGATE_MAX_BATCH_SIZE, MTGATE_API_KEY.
#
# The server image installs the plain install plus the `grpc` extra (grpcio and tritonclient's compiled protocol
# messages): what `mtgate serve` needs for HTTP and gRPC and nothing more (no tensorflow, locust, sacrebleu: the
# shadow's chrF and BLEU are computed without it). It serves gRPC on 8001 (MTGATE_GRPC_PORT; unset it for HTTP
# only). The batch image adds the `batch` extra and runs
# `batch-score`. Both hold the same source tree; a command whose extra an image lacks (`mtgate loadtest`, `validate`,
# `convert`) answers with one line naming the extra. Checkpoints are converted outside (`make demo` converts the demo).
#
# tests/deploy/test_dockerfile.py lints this file with hadolint and checks its structure; test_image_install.py runs
# these same `uv pip install` lines in fresh venvs: it serves a model from the server's over HTTP and gRPC (and checks
# that serving imports nothing else) and runs the Kubernetes Job's batch-score command from the batch one.

ARG PYTHON_VERSION=3.11

# ---------------------------------------------------------------- builder: a venv with the server's install
FROM python:${PYTHON_VERSION}-slim-bookworm AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    VIRTUAL_ENV=/opt/venv

RUN pip install --no-cache-dir uv==0.13.9 \
    && uv venv --python "$(command -v python)" /opt/venv

# The native decoding core (serving/engine/_native, C++) compiles at the install below: scikit-build-core, CMake and
# nanobind come from PyPI into the build environment; the compiler from Debian. Without it the install still succeeds
# and mtgate decodes with numpy (one log line says so).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app

# Dependencies first, in their own layer: rebuilt only when pyproject.toml changes.
COPY pyproject.toml ./
RUN --mount=type=cache,target=/root/.cache/uv \
    uv pip install -r pyproject.toml --extra grpc

# Then the source; an editable install keeps the repository layout under /app, so the default model path
# (models/demo-en-de beside the source tree) is /app/models/demo-en-de.
COPY README.md CMakeLists.txt ./
COPY serving ./serving
COPY converters ./converters
COPY batch ./batch
COPY loadtest ./loadtest
RUN --mount=type=cache,target=/root/.cache/uv \
    uv pip install --no-deps -e . \
    && rm -rf CMakeLists.txt CMakeCache.txt CMakeFiles CMakeInit.txt cmake_install.cmake build.ninja .ninja_deps .ninja_log \
        .skbuild-info.json libnanobind-static.a serving/engine/_native \
    && python -m compileall -q serving converters batch loadtest

# The demo model, readable by any user whatever the modes of the build context (a checkout or `make demo` under a
# umask of 077 leaves files 0600 and directories 0700, owned by root in the image): the images run as uid 1000, or as
# an arbitrary uid on OpenShift, and only read it. Root keeps the ownership, so the server cannot alter it.
COPY models/demo-en-de /app/models/demo-en-de
RUN chmod -R u=rwX,go=rX /app

# ---------------------------------------------------------------- batch-builder: the same venv plus the batch extra
FROM builder AS batch-builder

RUN --mount=type=cache,target=/root/.cache/uv \
    uv pip install -r pyproject.toml --extra batch

# ---------------------------------------------------------------- base: what both images share
FROM python:${PYTHON_VERSION}-slim-bookworm AS base

# A fixed numeric uid/gid, so Kubernetes' runAsNonRoot can verify it (deploy/k8s runs as 1000:1000).
RUN groupadd --system --gid 1000 mtgate \
    && useradd --system --uid 1000 --gid mtgate --home-dir /app --no-create-home --shell /usr/sbin/nologin mtgate

ENV PATH=/opt/venv/bin:$PATH \
    VIRTUAL_ENV=/opt/venv \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /app
USER 1000:1000

# ---------------------------------------------------------------- batch: `docker build --target batch`
FROM base AS batch

COPY --from=batch-builder /opt/venv /opt/venv
COPY --from=batch-builder /app /app

# The Kubernetes Job gives the command and its arguments (deploy/k8s/batch-score-job.yaml).
CMD ["batch-score", "--help"]

# ---------------------------------------------------------------- ray: `docker build --target ray`
# The batch image plus the ray extra, for batch-score --ray on a KubeRay RayJob (deploy/k8s/batch-score-rayjob.yaml):
# KubeRay runs `ray start` in it on every pod.
FROM batch-builder AS ray-builder

RUN --mount=type=cache,target=/root/.cache/uv \
    uv pip install -r pyproject.toml --extra batch --extra ray

FROM base AS ray

COPY --from=ray-builder /opt/venv /opt/venv
COPY --from=ray-builder /app /app

CMD ["batch-score", "--help"]

# ---------------------------------------------------------------- runtime: the server (the default target: last)
FROM base AS runtime

ENV MTGATE_HOST=0.0.0.0 \
    MTGATE_PORT=8000 \
    MTGATE_GRPC_PORT=8001

COPY --from=builder /opt/venv /opt/venv
COPY --from=builder /app /app

# HTTP (REST /v1, Open Inference Protocol /v2, /metrics) and gRPC (KServe v2 / Triton's GRPCInferenceService)
EXPOSE 8000 8001

# Liveness only (the process answers); readiness (model loaded and warm) is /v2/health/ready.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/v2/health/live' % os.environ.get('MTGATE_PORT', '8000'), timeout=4)"]

# SIGTERM drains in-flight requests (MTGATE_GRACE_PERIOD_S, default 30 s) before exiting.
STOPSIGNAL SIGTERM
CMD ["mtgate", "serve"]
