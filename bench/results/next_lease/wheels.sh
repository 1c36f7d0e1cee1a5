#!/usr/bin/env bash
# build/bench_wheels for a device lease (bench/README.md, "Carried wheels"): voxstage's runtime packages the
# GPU image lacks, the official openai client, websockets, python-multipart and py-spy, for CPython 3.12
# x86-64. Run on a machine with a package index, from the repository root; carry the folder to the device.
set -euo pipefail
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --abi cp312 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
  -d build/bench_wheels \
  grpcio==1.84.0 grpcio_health_checking==1.84.0 grpcio_reflection==1.84.0 grpcio_status==1.84.0 \
  protobuf==7.36.2 googleapis_common_protos==1.76.0 pydantic==2.14.4 pydantic_core==2.50.5 \
  annotated_types==0.8.0 typing_inspection==0.4.5 typing_extensions==4.16.0 soundfile==0.14.0 soxr==1.1.0 \
  cffi==2.1.1 pycparser==3.12 fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 h11==0.16.0 anyio==4.16.0 \
  sniffio==1.3.1 click==8.5.1 annotated_doc==0.0.7 idna==3.20 opentelemetry_api==1.45.2 openai==3.57.0 \
  httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 jiter==0.19.0 websockets==17.4 \
  python-multipart==0.0.34 py-spy==0.4.3
ls build/bench_wheels | wc -l
