# syntax=docker/dockerfile:1.7
#
# mtgate serving image: ONNX Runtime / OpenVINO on CPU with the bundled demo model; no torch, no transformers.
#
#   make demo                                                       # builds models/demo-en-de from its source
#   docker build -t mtgate:latest .
#   docker run --rm -p 8000:8000 mtgate:latest                      # serves models/demo-en-de
#   docker run --rm -p 8000:8000 -v "$PWD/my-pkg:/models/my-pkg:ro" \
#       -e MTGATE_MODEL_DIRS='["/models/my-pkg"]' mtgate:latest      # serves your package (from `mtgate convert`)
#
# Every server setting is an environment variable MTGATE_<SETTING> (serving/settings.py), e.g. MTGATE_THREADS,
# MTGATE_MAX_BATCH_SENTENCES, MTGATE_API_KEY. The image also runs `batch-score` and `mtgate loadtest`/`validate`;
# converting checkpoints needs the `convert` extra and is done outside it (`make demo` converts the demo model).
#
# The runtime install is the project's dependencies with no extras, exactly as below; tests/deploy/test_dockerfile.py
# runs these same `uv pip install` lines in a fresh venv and serves a model from it, and lints this file with hadolint.

ARG PYTHON_VERSION=3.11

# ---------------------------------------------------------------- builder: a venv with the runtime dependencies
FROM python:${PYTHON_VERSION}-slim-bookworm AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    VIRTUAL_ENV=/opt/venv

RUN pip install --no-cache-dir uv==0.13.9 \
    && uv venv --python "$(command -v python)" /opt/venv

WORKDIR /app

# Dependencies first, in their own layer: rebuilt only when pyproject.toml changes.
COPY pyproject.toml ./
RUN --mount=type=cache,target=/root/.cache/uv \
    uv pip install -r pyproject.toml

# Then the source; an editable install keeps the repository layout under /app, so the default model path
# (models/demo-en-de beside the source tree) is /app/models/demo-en-de.
COPY README.md ./
COPY serving ./serving
COPY converters ./converters
COPY batch ./batch
COPY loadtest ./loadtest
RUN --mount=type=cache,target=/root/.cache/uv \
    uv pip install --no-deps -e . \
    && python -m compileall -q serving converters batch loadtest

# ---------------------------------------------------------------- runtime: the venv, the source and the demo model
FROM python:${PYTHON_VERSION}-slim-bookworm AS runtime

# A fixed numeric uid/gid, so Kubernetes' runAsNonRoot can verify it (deploy/k8s runs as 1000:1000).
RUN groupadd --system --gid 1000 mtgate \
    && useradd --system --uid 1000 --gid mtgate --home-dir /app --no-create-home --shell /usr/sbin/nologin mtgate

ENV PATH=/opt/venv/bin:$PATH \
    VIRTUAL_ENV=/opt/venv \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MTGATE_HOST=0.0.0.0 \
    MTGATE_PORT=8000

COPY --from=builder /opt/venv /opt/venv
COPY --from=builder /app /app
COPY models/demo-en-de /app/models/demo-en-de

WORKDIR /app
USER 1000:1000
EXPOSE 8000

# Liveness only (the process answers); readiness (model loaded and warm) is /v2/health/ready.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/v2/health/live' % os.environ.get('MTGATE_PORT', '8000'), timeout=4)"]

# SIGTERM drains in-flight requests (MTGATE_GRACE_PERIOD_S, default 30 s) before exiting.
STOPSIGNAL SIGTERM
CMD ["mtgate", "serve"]
