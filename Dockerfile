# syntax=docker/dockerfile:1
# One image for every voxstage process; docker-compose.yml picks the role (talker, codec, gateway) by its
# command, and the default command runs all three with `voxstage serve` for a single-container try-out.
#
# The base image brings CUDA and a CUDA build of torch; pip then installs voxstage with the dependencies
# listed in pyproject.toml's [project] table (torch is already satisfied), which is what `voxstage serve`
# and each stage import. No dev tools, tests or build outputs go in (see .dockerignore).
#
# The base is the torch every GPU number and GPU test ran on (PyTorch 2.11.0 built for CUDA 13.0, with
# Triton 3.6: the H200 runs of docs/benchmarks.md). tests/gpu/test_image_pin.py reads this line and fails
# when the torch under test is older, so the image and the GPU evidence cannot drift apart. CUDA 13.0 needs an
# NVIDIA driver >= 580 on the host. docs/deploy.md names the tag and when it was checked.
FROM pytorch/pytorch:2.11.0-cuda13.0-cudnn9-runtime

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VOXSTAGE_CACHE=/models/.voxstage-cache

WORKDIR /app
# README.m[d]: pyproject names README.md as the long description; the glob keeps the build working while
# it is absent.
COPY pyproject.toml setup.py README.m[d] ./
COPY src ./src
COPY services ./services
COPY gateway ./gateway
RUN pip install . \
    && python -m voxstage --help > /dev/null
COPY deploy ./deploy

# /models is the checkpoint volume (compose mounts a named volume there); owning it lets a preset be
# materialized into it on first start. /var/lib/voxstage/voices is the gateway's voice library (a named
# volume too, which takes this directory's owner when it is first created).
RUN useradd --create-home --uid 10001 voxstage \
    && mkdir -p /models/.voxstage-cache /var/lib/voxstage/voices \
    && chown -R voxstage /models /var/lib/voxstage
USER voxstage

# gateway gRPC + HTTP, talker and codec gRPC, talker and codec /metrics
EXPOSE 50051 8000 50061 50062 9101 9102

CMD ["python", "-m", "voxstage", "serve", "deploy/qwen3_tts.yaml", "--model", "qwen3-tts-tiny", "--grpc-port", "50051", "--http-port", "8000"]
