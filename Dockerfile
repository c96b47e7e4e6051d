# corral's image: `docker build -t corral:latest .`
# The manifests in deploy/ run it as user 10001 with a read-only root filesystem.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

COPY pyproject.toml README.md /src/
COPY src /src/src
RUN pip install '/src[kubernetes]' && rm -rf /src \
    && useradd --uid 10001 --user-group --no-create-home --home-dir /nonexistent corral

USER 10001:10001
WORKDIR /tmp
ENTRYPOINT ["corral"]
CMD ["--help"]
