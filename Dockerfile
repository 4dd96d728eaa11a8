# syntax=docker/dockerfile:1
# aiostream-ckpt daemon image: `docker build -t aiostream-ckpt .`
#
#   docker run --init -v aiostream-state:/var/lib/aiostream aiostream-ckpt
#       runs the embedded pv_count demo (generated, paced input: the default CMD's --set;
#       its part files roll hourly or at 128 MiB, not one per 1 s checkpoint)
#   docker run --init -v ./apps:/app/apps -v state:/var/lib/aiostream aiostream-ckpt run apps.my_app
#       runs a mounted app; configure with AIOSTREAM_SECTION__KEY=value or --set
#   docker run --init --rm aiostream-ckpt demo --events 300000
#       the kill -9 demo (in a temp dir; Spark check skipped without Java)
#
# The image's ENV holds only what every app shares (checkpoint dir, stop mode);
# an app's own parameters (app.*) come with its command. The REST API listens on
# loopback inside the container; the daemon publishes its address in
# /var/lib/aiostream/checkpoints/daemon.json, where the HEALTHCHECK reads it, so
# a port set by --set, TOML or rest.port=0 (and rest.enabled=false) is followed.
# To publish the API, set AIOSTREAM_REST__BIND=0.0.0.0 *and* AIOSTREAM_REST__TOKEN:
# the daemon refuses a non-loopback bind without a token. The daemon handles
# SIGTERM as PID 1 itself; --init adds an init that also reaps child processes.

FROM python:3.11-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Not setup.py: it builds session windows' optional C loops, and the slim image has no
# compiler; their Python twins run instead (same results, runtime/windowing/session_fold.py).
COPY pyproject.toml README.md ./
COPY aiostream_ckpt ./aiostream_ckpt
COPY aiostream_ckpt_dev ./aiostream_ckpt_dev
# Wheels of the package and every dependency: the runtime stage needs no compiler.
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels /wheels/aiostream_ckpt-*.whl \
    && groupadd --system --gid 10001 aiostream \
    && useradd --system --uid 10001 --gid aiostream --home-dir /app --shell /usr/sbin/nologin aiostream \
    && mkdir -p /var/lib/aiostream/checkpoints \
    && chown -R aiostream:aiostream /var/lib/aiostream
WORKDIR /app
# Apps are importable from the working directory; mount over /app/apps to replace them.
COPY --chown=aiostream:aiostream apps ./apps
# Checkpoints, savepoints (default <checkpoint dir>/savepoints) and the demo's output.
VOLUME ["/var/lib/aiostream"]
ENV AIOSTREAM_CHECKPOINT__DIR=/var/lib/aiostream/checkpoints \
    AIOSTREAM_SHUTDOWN__MODE=checkpoint
# numeric, so Kubernetes' runAsNonRoot can verify it
USER 10001:10001
EXPOSE 8081
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
    CMD ["aiostream-ckpt", "health"]
ENTRYPOINT ["aiostream-ckpt"]
CMD ["run", "apps.pv_count", "--set", "app.output=/var/lib/aiostream/output", \
     "--set", "app.generate=1000000000", "--set", "app.rate=1000", \
     "--set", "app.roll_interval=1h", "--set", "app.roll_size=134217728"]
