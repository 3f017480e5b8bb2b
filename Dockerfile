# gmlp-serve images. Targets:
#   runtime      (default) CPU service: ONNX Runtime + FastAPI, no torch, demo models baked in
#   runtime-gpu  CUDA service: onnxruntime-gpu on an NVIDIA CUDA/cuDNN runtime base
#   loadtest     locust load-test runner (`gmlp loadtest`)
#   lb           HAProxy (Debian's package) in front of API replicas: deploy/swarm/stack.yml
# The `export` stage is the only one with torch: it turns the committed checkpoints into ONNX.

ARG PYTHON_IMAGE=python:3.11-slim
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04

# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS export
# torch's CPU wheels live on their own index; without it pip takes the multi-GB CUDA build.
# Pass an empty value where a local wheel or mirror serves torch==2.13.0 already.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
COPY contract contract
COPY gmlp gmlp
COPY model model
COPY export export
COPY service service
RUN python -m pip install ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} \
        -c constraints.txt ".[export,serve]"
COPY checkpoints checkpoints
RUN gmlp export checkpoints/cifar10-gmlp --out /models/cifar10-gmlp --variants fp32,int8 \
 && gmlp export checkpoints/gutenberg-gmlp-mlm --out /models/gutenberg-gmlp-mlm --variants fp32,int8

# The fp16 variants are only worth their build time on a GPU image.
FROM export AS export-gpu
RUN gmlp export checkpoints/cifar10-gmlp --out /models/cifar10-gmlp --variants fp32,int8,fp16 \
 && gmlp export checkpoints/gutenberg-gmlp-mlm --out /models/gutenberg-gmlp-mlm --variants fp32,int8,fp16

# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY pyproject.toml constraints.txt README.md ./
COPY contract contract
COPY gmlp gmlp
COPY service service
# OpenVINO is in by default: `GMLP_BACKEND=auto` runs it on CPUs with AVX512-BF16 or AMX, where it
# is the fastest path (docs/deploy.md, "Backends"); it adds about 240 MB (997 MB with it, 760 MB
# without, on a Debian bookworm Python 3.11 base). For a fleet without those instructions,
# `--build-arg SERVE_EXTRAS=serve` leaves it out (auto then runs ONNX Runtime).
ARG SERVE_EXTRAS=serve,openvino
RUN python -m pip install -c constraints.txt ".[${SERVE_EXTRAS}]" && rm -rf /app/build
RUN useradd --system --uid 10001 --no-create-home gmlp
COPY --from=export --chown=gmlp /models /models
# Threads: by default the service sizes ONNX Runtime's pool from the CPUs the container may use
# (affinity and cgroup quota), so `--cpus` / compose cpu limits are honoured.
ENV GMLP_MODEL_REPOSITORY=/models GMLP_CHECKPOINT_DIR= GMLP_HOST=0.0.0.0 GMLP_PORT=8000
USER gmlp
EXPOSE 8000 8081
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
  CMD ["python", "-m", "service.healthcheck"]
CMD ["gmlp", "serve"]

# ---------------------------------------------------------------------------------------------
FROM ${CUDA_IMAGE} AS runtime-gpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    DEBIAN_FRONTEND=noninteractive
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/* && python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /app
COPY pyproject.toml constraints.txt README.md ./
COPY contract contract
COPY gmlp gmlp
COPY service service
RUN pip install ".[gpu]"
RUN useradd --system --uid 10001 --no-create-home gmlp
COPY --from=export-gpu --chown=gmlp /models /models
ENV GMLP_MODEL_REPOSITORY=/models GMLP_CHECKPOINT_DIR= GMLP_HOST=0.0.0.0 GMLP_PORT=8000 GMLP_DEVICE=cuda
USER gmlp
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=90s --retries=3 \
  CMD ["python", "-m", "service.healthcheck"]
CMD ["gmlp", "serve"]

# ---------------------------------------------------------------------------------------------
# Load balancer for the Swarm stack: HAProxy on the same base, so no other image is needed.
# It finds the replicas through the orchestrator's DNS (tasks.<service>); see deploy/swarm/.
FROM ${PYTHON_IMAGE} AS lb
RUN apt-get update && apt-get install -y --no-install-recommends haproxy \
 && rm -rf /var/lib/apt/lists/*
COPY deploy/swarm/haproxy.cfg /etc/haproxy/haproxy.cfg
USER haproxy
EXPOSE 8000
HEALTHCHECK --interval=5s --timeout=3s --start-period=5s --retries=3 \
  CMD ["python3", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/lb/health', timeout=2)"]
CMD ["haproxy", "-W", "-db", "-f", "/etc/haproxy/haproxy.cfg"]

# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS loadtest
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY pyproject.toml constraints.txt README.md ./
COPY contract contract
COPY gmlp gmlp
COPY loadtests loadtests
RUN python -m pip install -c constraints.txt ".[loadtest]"
# Runs as root on purpose: it writes its report into a bind-mounted host folder.
ENTRYPOINT ["gmlp", "loadtest"]
CMD ["--url", "http://127.0.0.1:8000", "--out", "/reports"]
