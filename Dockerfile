# The image of every Ray pod of the KubeRay deployment (docs/kubernetes.md, "The image"):
# rayproject/ray at the Ray version the project pins, plus the orchestrator, its example
# jobs under /opt/orchestrator/jobs, its configs under /opt/orchestrator/configs, and torch.
#
#   docker build --build-arg VARIANT=gpu -t ray-gpu-orchestrator:0.1.0-ray2.60.0-py311-gpu .
#   docker build --build-arg VARIANT=cpu -t ray-gpu-orchestrator:0.1.0-ray2.60.0-py311-cpu .
#
# VARIANT picks both the base (rayproject/ray's -cpu or -gpu tag, the latter on NVIDIA's CUDA
# image) and torch (the CPU wheels, or PyPI's CUDA wheels). The tag scheme
# <version>-ray<Ray version>-py311-<variant> is what configs/k8s.yaml's `image` checks
# against `ray_version`. The base is named in full (docker.io/...) so buildah and podman, which
# resolve no short names, build it as docker does; pin it by digest in production (...@sha256:<digest>).
# Runs as the base image's `ray` user (uid 1000, gid 100), which the manifests' securityContext
# names; nothing is written to the image at run time (Ray writes to the emptyDirs the manifests
# mount at /tmp, /dev/shm and /home/ray/.cache), so the root filesystem can be read-only.

ARG RAY_VERSION=2.60.0
ARG PYTHON_TAG=py311
ARG VARIANT=gpu

# ---- stage 1: a wheel of the project, built from the source alone (no dependencies)
FROM docker.io/rayproject/ray:${RAY_VERSION}-${PYTHON_TAG}-${VARIANT} AS wheel
WORKDIR /home/ray/build
COPY --chown=1000:100 pyproject.toml README.md ./
COPY --chown=1000:100 orchestrator ./orchestrator
# configs/ and jobs/ go into the wheel too, as orchestrator.resources.configs and .jobs (pyproject's package-dir)
COPY --chown=1000:100 configs ./configs
COPY --chown=1000:100 jobs ./jobs
RUN python -m pip wheel --no-deps --no-cache-dir --wheel-dir /home/ray/wheels .

# ---- stage 2: the runtime image
FROM docker.io/rayproject/ray:${RAY_VERSION}-${PYTHON_TAG}-${VARIANT}
ARG RAY_VERSION
ARG VARIANT
ARG TORCH_VERSION=2.13.0
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
LABEL org.opencontainers.image.title="ray-gpu-orchestrator" \
      org.opencontainers.image.description="GPU workload orchestrator inside Ray, for KubeRay" \
      org.opencontainers.image.licenses="Apache-2.0" \
      io.ray.version="${RAY_VERSION}" \
      io.ray-gpu-orchestrator.variant="${VARIANT}"

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
USER 1000:100

# torch first, from the index that matches the variant, so the project's own install finds it satisfied.
RUN if [ "${VARIANT}" = "cpu" ]; then \
        python -m pip install --no-cache-dir --index-url "${TORCH_CPU_INDEX}" "torch==${TORCH_VERSION}"; \
    else \
        python -m pip install --no-cache-dir "torch==${TORCH_VERSION}"; \
    fi

# The project, with Ray held at the base image's version (pip must not replace the Ray the image was built for).
COPY --from=wheel --chown=1000:100 /home/ray/wheels /home/ray/wheels
# Its extras: the Kubernetes client (the head's inventory watch) and the dashboard's charts.
RUN python -m pip install --no-cache-dir --find-links /home/ray/wheels "ray-gpu-orchestrator[k8s,dashboard]==0.1.0" \
        "ray[default,serve]==${RAY_VERSION}" "torch==${TORCH_VERSION}" \
    && rm -rf /home/ray/wheels

# What the manifests run by path: the example jobs (the RayJob's command) and the cluster files
# (the dev overlay's head command takes --config /opt/orchestrator/configs/cluster.kind.yaml).
COPY --chown=0:0 jobs /opt/orchestrator/jobs
COPY --chown=0:0 configs /opt/orchestrator/configs

WORKDIR /home/ray
# Fail the build, not the pod: the entry points the manifests call must import and run.
RUN python -c "import ray, torch, orchestrator.deploy.kuberay, orchestrator.serve.app; \
assert ray.__version__ == '${RAY_VERSION}', ray.__version__" \
    && orchestrator --help > /dev/null \
    && python /opt/orchestrator/jobs/train.py --help > /dev/null
