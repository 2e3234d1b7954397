# One image for the kneepoint collector (`kneepoint collect`) and app (`kneepoint serve
# --no-collect`); docker-compose.yaml runs both from it.
FROM python:3.11.11-slim-bookworm
WORKDIR /opt/kneepoint
# The whole source tree, less what .dockerignore leaves out (tests, the venv, git, local
# databases, secrets): `pip install .` then installs every package pyproject.toml's
# packages.find includes, however many there are, without this file naming them.
# tests/real/test_image.py installs exactly this tree and opens every page.
COPY . .
RUN pip install --no-cache-dir . && useradd --system --home /var/lib/kneepoint kneepoint \
    && mkdir -p /var/lib/kneepoint && chown kneepoint /var/lib/kneepoint
USER kneepoint
WORKDIR /var/lib/kneepoint
ENV KNEEPOINT_CONFIG=/etc/kneepoint/kneepoint.yaml
# glibc makes a malloc arena per thread and keeps their pages: at 1,000 replicas the
# collector's memory then grew 64 MiB a minute; two arenas kept it flat (bench/bench_scale.py).
# The collector also caps them itself (kneepoint/malloc.py, for every other launch path); the
# variable stays so that every process of the image has it from its first allocation.
ENV MALLOC_ARENA_MAX=2
EXPOSE 8501
CMD ["kneepoint", "serve", "--no-browser"]
