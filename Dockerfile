# Trainyard web / worker / beat image. Runs as an unprivileged user.

# ty-exec (jobs/backends/tyexec): the static wrapper a Kubernetes trainer runs under so that its stderr is kept apart;
# job pods copy it from this image (an init container) into an emptyDir. Standard library only: nothing to download.
FROM golang:1.26 AS ty-exec
WORKDIR /src
COPY jobs/backends/tyexec/ ./
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/ty-exec . && /out/ty-exec -- true

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 TRAINYARD_VAR_DIR=/var/lib/trainyard
RUN groupadd --system --gid 10001 trainyard && useradd --system --uid 10001 --gid trainyard --home /app trainyard
WORKDIR /app
# The runtime's pinned tree only (requirements.txt): no test or development tools in the image.
COPY --from=ty-exec /out/ty-exec /usr/local/bin/ty-exec
COPY requirements.txt ./
RUN pip install --no-cache-dir -r requirements.txt
COPY . .
RUN pip install --no-cache-dir --no-deps . \
    && mkdir -p /var/lib/trainyard && chown -R trainyard:trainyard /var/lib/trainyard \
    && TRAINYARD_SECRET_KEY=build python manage.py collectstatic --noinput -v 0 \
    && chown -R trainyard:trainyard /var/lib/trainyard
USER 10001:10001
EXPOSE 8000
CMD ["python", "-m", "uvicorn", "trainyard.asgi:application", "--host", "0.0.0.0", "--port", "8000"]
