"""Django settings, read from the environment (see `.env.example`) with safe local defaults."""

import os
import re
import secrets
from datetime import timedelta
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

from kernel import logsetup
from kernel.host import private_file
from kernel.paths import BASE_DIR, VAR_DIR


class _StrictEnv(environ.Env):
    """django-environ, strict about numbers and yes/no: a value that does not parse stops the start with the
    variable's name (environ strips "abc" to "" before float(), and reads any unknown word, "ture" say, as false).
    Set but empty means unset for a number; for a yes/no it is "no", as environ reads it."""

    def _number(self, kind, var, default):
        raw = os.environ.get(var)
        if raw is None:
            return self.get_value(var, cast=kind, default=default)  # the default, or environ's "set X" error
        if not raw.strip() and default is not environ.Env.NOTSET:
            return default
        try:
            return kind(raw.strip())
        except ValueError:
            what = "a number" if kind is float else "a whole number"
            raise ImproperlyConfigured(f"{var} must be {what}, got {raw!r}") from None

    def float(self, var, default=environ.Env.NOTSET):
        return self._number(float, var, default)

    def int(self, var, default=environ.Env.NOTSET):
        return self._number(int, var, default)

    def bool(self, var, default=environ.Env.NOTSET):
        raw = os.environ.get(var)
        if raw is None:
            return super().bool(var, default=default)
        word = raw.strip().lower()
        if word in self.BOOLEAN_TRUE_STRINGS:
            return True
        if word in ("false", "off", "no", "n", "0", ""):
            return False
        raise ImproperlyConfigured(f"{var} must be true or false (yes/no, on/off, 1/0), got {raw!r}")


env = _StrictEnv()
if (BASE_DIR / ".env").exists():
    environ.Env.read_env(BASE_DIR / ".env")


def _local_secret_key() -> str:
    """A per-checkout key generated once into var/, so no secret is ever committed."""
    path = VAR_DIR / "secret_key"
    if not path.exists():
        VAR_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
        private_file(path, secrets.token_urlsafe(50))
    path.chmod(0o600)  # also closes a key written by an older version
    return path.read_text().strip()


DEBUG = env.bool("TRAINYARD_DEBUG", default=False)
SECRET_KEY = env.str("TRAINYARD_SECRET_KEY", default="") or _local_secret_key()
ALLOWED_HOSTS = env.list("TRAINYARD_ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env.list("TRAINYARD_CSRF_TRUSTED_ORIGINS", default=[])
PLATFORM_VERSION = "0.1.0"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "trainyard",
    "quotas",
    "cluster",
    "images",
    "jobs",
    "monitoring",
    "experiments",
    "frontend",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "kernel.guards.RequestGuardMiddleware",
    "kernel.guards.ContentSecurityPolicyMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "kernel.login_guard.LoginLockoutMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "trainyard.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "django.template.context_processors.i18n",
            ],
        },
    },
]
WSGI_APPLICATION = "trainyard.wsgi.application"
ASGI_APPLICATION = "trainyard.asgi.application"

DATABASE_URL = env.str("DATABASE_URL", default="postgres://postgres@127.0.0.1:5432/trainyard")
DATABASES = {"default": env.db_url_config(DATABASE_URL)}
DATABASES["default"].setdefault("OPTIONS", {})["connect_timeout"] = 5
# Each renewal costs the thread's next request 20-30 ms more (a new server process, the password exchange, catalogs
# read anew; kernel/warmup.py): every 10 minutes, not every minute. A broken connection is replaced at once either
# way (CONN_HEALTH_CHECKS).
DATABASES["default"]["CONN_MAX_AGE"] = env.int("TRAINYARD_DB_CONN_MAX_AGE", default=600)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
# Under ASGI every request runs in a thread of its own, so a per-thread persistent connection is never reused, only
# left open until garbage collection; the web process (trainyard/asgi.py) shares a pool of connections instead.
if env.bool("TRAINYARD_DB_POOL", default=False):
    DATABASES["default"]["CONN_MAX_AGE"] = 0  # a pooled connection goes back to the pool at the end of each request
    DATABASES["default"]["OPTIONS"]["pool"] = {
        "min_size": 2,
        "max_size": env.int("TRAINYARD_DB_POOL_SIZE", default=20),
        "timeout": 10,
    }
# The few statements every request runs go as server-side prepared statements (kernel/prepared.py); off behind a
# proxy that pools connections per transaction (PgBouncer's transaction mode), where a statement prepared on one
# server connection is not there on the next.
TRAINYARD_DB_PREPARE = env.bool("TRAINYARD_DB_PREPARE", default=True)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env.str("REDIS_URL", default="redis://127.0.0.1:6379/0")
CACHES = {
    "default": {
        "BACKEND": "kernel.cache.SharedRedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": env.str("TRAINYARD_CACHE_PREFIX", default="trainyard"),
    }
}
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        # channels-redis blocks up to 5 s in BZPOPMIN; redis-py's own default read timeout is also 5 s, so a
        # busy machine turns every idle wait into a TimeoutError that drops the WebSocket. Give reads room.
        "CONFIG": {
            "hosts": [{"address": REDIS_URL, "socket_timeout": 30, "socket_connect_timeout": 5}],
            "prefix": env.str("TRAINYARD_CHANNEL_PREFIX", default="trainyard"),
        },
    }
}

CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default=REDIS_URL)
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_DEFAULT_QUEUE = env.str("TRAINYARD_CELERY_QUEUE", default="trainyard")
# Dispatch passes travel on a queue of their own, consumed by one solo-pool process (`ops.processes` "dispatcher"),
# so every pass finds the pool and the lines it carried warm in memory (kernel/wake.py). Empty: "<queue>.dispatch".
TRAINYARD_DISPATCH_QUEUE = env.str("TRAINYARD_DISPATCH_QUEUE", default="")
# The least time between the starts of two requested passes (kernel.wake.space_passes): submissions closer together
# than this share one pass. It adds at most this much to a job's admission; 0 gives every request a pass of its own.
TRAINYARD_DISPATCH_SPACING_S = env.float("TRAINYARD_DISPATCH_SPACING_S", default=0.05)
CELERY_TASK_ROUTES = ("kernel.wake.route",)
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# An unacknowledged message (acks_late) is handed out again after this long: longer than the longest task's time
# limit (an image build, 2 h), so a running task is never started twice; a worker that died is covered sooner by
# the level-triggered reapers (builds: images.reap_builds; jobs: the lifecycle reconciler).
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 2 * 3600 + 600}
# A broker that is down, however long, never ends a worker or the dispatcher: they reconnect for as long as it takes
# (Celery's default gives up after 100 tries, about 45 minutes, and the process exits), and tasks running through the
# blip carry on rather than being cancelled (the acks_late ones are idempotent; a message lost with the broker is
# re-driven by the level-triggered beat passes). tests/faults/test_broker_crash.py kills Redis under both.
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = False
CELERY_TIMEZONE = "UTC"
# Celery's Django fixup closes every database connection before and after each task unless this is set, so each
# task (each dispatch pass) opened a new PostgreSQL connection: a server process forked, authenticated and its
# catalog caches filled, several milliseconds of two processes' CPU for a pass that itself takes one or two. With it
# the fixup leaves connections alone and trainyard/celery.py does what Django does around a request instead:
# close a connection that failed, outlived CONN_MAX_AGE or was left mid-transaction.
CELERY_DB_REUSE_MAX = 10**9
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
CELERY_BEAT_SCHEDULE: dict = {}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"

LANGUAGE_CODE = "en"
LANGUAGES = [("en", "English"), ("zh-hans", "简体中文")]
LOCALE_PATHS = [BASE_DIR / "trainyard" / "locale"]  # inside the package, so an installed platform has it too
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = VAR_DIR / "static"
# One-machine mode serves its own static files; behind a real web server, turn this off.
TRAINYARD_SERVE_STATIC = env.bool("TRAINYARD_SERVE_STATIC", default=True)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "quotas.tokens.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_THROTTLE_CLASSES": ["kernel.throttles.PerTokenThrottle"],
    "DEFAULT_THROTTLE_RATES": {
        # A CI pipeline may burst 200 submissions (or one batch of 200) within a minute.
        "submit": env.str("TRAINYARD_RATE_SUBMIT", default="300/min"),
        "read": env.str("TRAINYARD_RATE_READ", default="1200/min"),
        "write": env.str("TRAINYARD_RATE_WRITE", default="300/min"),
    },
    "DEFAULT_PAGINATION_CLASS": None,
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated", "quotas.tokens.TokenScopePermission"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "EXCEPTION_HANDLER": "kernel.errors.exception_handler",
    "DEFAULT_PARSER_CLASSES": [
        "kernel.guards.StrictJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
}
# The largest request body taken (a batch of 200 jobs is a few hundred KiB); over it, a 413 `request_too_large`.
DATA_UPLOAD_MAX_MEMORY_SIZE = env.int("TRAINYARD_MAX_BODY_BYTES", default=4 * 1024 * 1024)
SPECTACULAR_SETTINGS = {
    "TITLE": "Trainyard API",
    "DESCRIPTION": "Submit, follow and govern GPU training jobs.",
    "VERSION": PLATFORM_VERSION,
    "SERVE_INCLUDE_SCHEMA": False,
    # The interactive docs are served from the installed package, never from a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # Every 4xx an operation can answer, with the Error body; additionalProperties false where extras are refused.
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "kernel.api.schema_declare_errors"],
    "ENUM_NAME_OVERRIDES": {
        "JobStateEnum": "jobs.states.JobState",
        "AttemptStateEnum": "jobs.states.AttemptState",
        "QueueStateEnum": "quotas.models.Queue.State",
        "NodeStateEnum": "cluster.models.Node.State",
        "AlertLevelEnum": "monitoring.models.AlertRule.Level",
        "SeverityEnum": "images.models.Severity",
    },
}

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_SAMESITE = "Lax"
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
# Served over TLS (directly or behind a proxy that sets X-Forwarded-Proto): Secure cookies, HSTS, redirect to https.
TRAINYARD_TLS = env.bool("TRAINYARD_TLS", default=False)
if TRAINYARD_TLS:
    SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env.int("TRAINYARD_HSTS_SECONDS", default=31536000)
    SECURE_SSL_REDIRECT = env.bool("TRAINYARD_SSL_REDIRECT", default=True)
    SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]  # probes and scrapers inside the cluster
    if env.bool("TRAINYARD_BEHIND_TLS_PROXY", default=False):
        SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# Failed logins (kernel/login_guard.py), within the window: an address is locked out (429) past its limits, per
# user name and in all; a user name is slowed down (never locked) past TRAINYARD_LOGIN_SLOW_AFTER from anywhere.
TRAINYARD_LOGIN_WINDOW_S = env.int("TRAINYARD_LOGIN_WINDOW_S", default=900)
TRAINYARD_LOGIN_MAX_FAILURES = env.int("TRAINYARD_LOGIN_MAX_FAILURES", default=5)
TRAINYARD_LOGIN_MAX_FAILURES_PER_CLIENT = env.int("TRAINYARD_LOGIN_MAX_FAILURES_PER_CLIENT", default=20)
TRAINYARD_LOGIN_SLOW_AFTER = env.int("TRAINYARD_LOGIN_SLOW_AFTER", default=10)
TRAINYARD_LOGIN_MAX_DELAY_S = env.float("TRAINYARD_LOGIN_MAX_DELAY_S", default=4.0)
# Reverse proxies whose X-Forwarded-For the web process believes (ops/processes.py passes it to uvicorn); read
# here too, to warn when requests come through a proxy that is not among them (kernel/guards.py).
TRAINYARD_TRUSTED_PROXIES = env.str("TRAINYARD_TRUSTED_PROXIES", default="")

# Platform behaviour
TRAINYARD_BACKEND = env.str("TRAINYARD_BACKEND", default="local")
TRAINYARD_LOCAL_GPUS = env.str("TRAINYARD_LOCAL_GPUS", default="4x24GiB")
# Reserve host CPU and memory per job on local nodes too (cluster nodes always are): off by default, because
# local jobs share the machine's cores and a laptop rarely has the 8 cores per GPU the specs ask for.
TRAINYARD_LOCAL_ACCOUNT_HOST = env.bool("TRAINYARD_LOCAL_ACCOUNT_HOST", default=False)
# The request mix the placement policy keeps room for: shapes of the jobs submitted in this window, re-read at
# most this often (scheduler/dispatch.py).
TRAINYARD_WORKLOAD_WINDOW_H = env.float("TRAINYARD_WORKLOAD_WINDOW_H", default=72.0)
TRAINYARD_WORKLOAD_REFRESH_S = env.float("TRAINYARD_WORKLOAD_REFRESH_S", default=300.0)
# Beat's pass (every 30 s) reads every waiting line when the dispatcher last did so this long ago; in between it
# decides only newcomers when the version numbers say nothing else changed (scheduler/dispatch.py, the carry).
TRAINYARD_FULL_PASS_EVERY_S = env.float("TRAINYARD_FULL_PASS_EVERY_S", default=300.0)
# A pass that has decided this many admissions starts writing them on a second database connection while it
# decides the rest, in the same one transaction (scheduler.dispatch.WriteAhead); 0 writes every pass after deciding.
TRAINYARD_DISPATCH_WRITE_AHEAD = env.int("TRAINYARD_DISPATCH_WRITE_AHEAD", default=500)
# Celery queue for attempt starts (empty: the default queue), so start workers can be scaled apart from dispatch.
TRAINYARD_START_QUEUE = env.str("TRAINYARD_START_QUEUE", default="")
TRAINYARD_LOG_ROOT = Path(env.str("TRAINYARD_LOG_ROOT", default=str(VAR_DIR / "logs")))
TRAINYARD_WORK_ROOT = Path(env.str("TRAINYARD_WORK_ROOT", default=str(VAR_DIR / "work")))
# Each local attempt's state files (spec, lock, status, usage) live here, apart from the job's work and checkpoint
# folders, so a job that fills its own disk cannot take the record of how it ended with it (docs/operations.md).
TRAINYARD_STATE_ROOT = Path(env.str("TRAINYARD_STATE_ROOT", default=str(VAR_DIR / "attempts")))
# A local job's work or checkpoint filesystem with less free space than this is full; a job that keeps running on
# a full disk for TRAINYARD_DISK_FULL_GRACE_S is stopped and ends `DiskFull` (not retried: it would fill it again).
TRAINYARD_DISK_FULL_FREE_BYTES = env.int("TRAINYARD_DISK_FULL_FREE_BYTES", default=1 << 20)
TRAINYARD_DISK_FULL_GRACE_S = env.float("TRAINYARD_DISK_FULL_GRACE_S", default=30.0)
# Object storage for checkpoints (docs/storage.md): any S3 endpoint; `make run` / `make test` start an embedded
# SeaweedFS and set these when TRAINYARD_S3_URL is unset. Credentials: these two, else boto3's own chain (AWS_*).
TRAINYARD_S3_URL = env.str("TRAINYARD_S3_URL", default="")
TRAINYARD_S3_BUCKET = env.str("TRAINYARD_S3_BUCKET", default="trainyard")
TRAINYARD_S3_REGION = env.str("TRAINYARD_S3_REGION", default="us-east-1")
TRAINYARD_S3_ACCESS_KEY_ID = env.str("TRAINYARD_S3_ACCESS_KEY_ID", default="")
TRAINYARD_S3_SECRET_ACCESS_KEY = env.str("TRAINYARD_S3_SECRET_ACCESS_KEY", default="")
# A checkpoint file is uploaded once it has not changed for one sync period; the last sync, after the command
# ends, waits at most TRAINYARD_CHECKPOINT_FINAL_WAIT_S for the store.
TRAINYARD_CHECKPOINT_SYNC_S = env.float("TRAINYARD_CHECKPOINT_SYNC_S", default=30.0)
TRAINYARD_CHECKPOINT_FINAL_WAIT_S = env.float("TRAINYARD_CHECKPOINT_FINAL_WAIT_S", default=300.0)
# A retry whose checkpoint restore met an unreachable store (CheckpointStoreUnavailable) waits and tries again with
# a doubling pause (at most TRAINYARD_STORE_RETRY_MAX_S) without using up max_retries, for this long in all.
TRAINYARD_STORE_OUTAGE_WAIT_S = env.float("TRAINYARD_STORE_OUTAGE_WAIT_S", default=900.0)
TRAINYARD_STORE_RETRY_MAX_S = env.float("TRAINYARD_STORE_RETRY_MAX_S", default=60.0)
# Registered datasets on the local backend: one node-local copy per dataset version, shared read-only by the
# jobs that name it; least recently used copies no job uses are evicted past the size limit (0 = no limit).
TRAINYARD_DATASET_CACHE_DIR = Path(env.str("TRAINYARD_DATASET_CACHE_DIR", default=str(VAR_DIR / "datasets")))
TRAINYARD_DATASET_CACHE_BYTES = env.int("TRAINYARD_DATASET_CACHE_BYTES", default=100 * 1024**3)
# Local jobs run in a bubblewrap sandbox (jobs/backends/sandbox.py, docs/security.md); `off` only on a single-user
# machine: every job page then says that jobs run unsandboxed, as the platform's own user.
TRAINYARD_SANDBOX = env.str("TRAINYARD_SANDBOX", default="on")
TRAINYARD_SANDBOX_BWRAP = env.str("TRAINYARD_SANDBOX_BWRAP", default="bwrap")
TRAINYARD_SANDBOX_SLIRP4NETNS = env.str("TRAINYARD_SANDBOX_SLIRP4NETNS", default="slirp4netns")
TRAINYARD_SANDBOX_RO_PATHS = env.list("TRAINYARD_SANDBOX_RO_PATHS", default=[])
TRAINYARD_SANDBOX_UID_BASE = env.int("TRAINYARD_SANDBOX_UID_BASE", default=200000)
TRAINYARD_SANDBOX_UID_COUNT = env.int("TRAINYARD_SANDBOX_UID_COUNT", default=65536)
# Local jobs' memory, process and CPU limits (kernel/limits.py): auto | cgroup2 | cgroup1 | rlimit | off.
TRAINYARD_JOB_LIMITS = env.str("TRAINYARD_JOB_LIMITS", default="auto")
TRAINYARD_JOB_PIDS_MAX = env.int("TRAINYARD_JOB_PIDS_MAX", default=4096)
TRAINYARD_CGROUP_PARENT = env.str("TRAINYARD_CGROUP_PARENT", default="")
TRAINYARD_READY_TIMEOUT = env.float("TRAINYARD_READY_TIMEOUT", default=2.0)
TRAINYARD_REGISTRY_ALLOWLIST = env.list(
    "TRAINYARD_REGISTRY_ALLOWLIST", default=["docker.io", "nvcr.io", "ghcr.io", "registry.local"]
)
# The pool reconcile (jobs.reconcile_pool on beat): the ledger against what really runs.
TRAINYARD_RECONCILE_INTERVAL = timedelta(seconds=env.float("TRAINYARD_RECONCILE_INTERVAL_S", default=600.0))
# Local attempts' processes pinned to the CPUs of their GPUs' NUMA node(s), sized by their CPU request.
TRAINYARD_LOCAL_CPU_PINNING = env.bool("TRAINYARD_LOCAL_CPU_PINNING", default=True)

LOG_LEVEL = env.str("TRAINYARD_LOG_LEVEL", default="INFO")
LOG_FORMAT = env.str("TRAINYARD_LOG_FORMAT", default="console")  # console | json
LOGGING_CONFIG = None
logsetup.configure(level=LOG_LEVEL, fmt=LOG_FORMAT)

# Emulated inventory facts (only where NVML finds no GPU); the UI labels such GPUs as emulated.
TRAINYARD_EMULATED_DRIVER = env.str("TRAINYARD_EMULATED_DRIVER", default="550.54.15")
TRAINYARD_EMULATED_CUDA = env.str("TRAINYARD_EMULATED_CUDA", default="12.4")
TRAINYARD_DEFAULT_GPU_MEMORY_MIB = env.int("TRAINYARD_DEFAULT_GPU_MEMORY_MIB", default=24576)
TRAINYARD_CANCEL_GRACE_S = env.float("TRAINYARD_CANCEL_GRACE_S", default=10.0)
# Preemption (jobs/preemption.py, docs/pools.md): a preemptible job gets this many seconds between the notice
# (SIGTERM; TRAINYARD_PREEMPT_NOTICE in its environment says how long) and SIGKILL, for its last checkpoint.
TRAINYARD_PREEMPT_GRACE_S = env.float("TRAINYARD_PREEMPT_GRACE_S", default=30.0)
# Idle lending (jobs/lending.py, docs/pools.md): "lender>borrower" pairs, comma-separated; a lending pool whose own
# use stays under the threshold for the window lends its idle nodes to the borrower's preemptible jobs.
TRAINYARD_POOL_LENDING = env.str("TRAINYARD_POOL_LENDING", default="")
TRAINYARD_LEND_BELOW_PERCENT = env.float("TRAINYARD_LEND_BELOW_PERCENT", default=40.0)
TRAINYARD_LEND_AFTER_S = env.float("TRAINYARD_LEND_AFTER_S", default=1800.0)
# The node pool the local node joins when it first appears (docs/pools.md); an admin may move it afterwards.
TRAINYARD_LOCAL_POOL = env.str("TRAINYARD_LOCAL_POOL", default="default")
# Pools kept for the queues bound to them (docs/pools.md): no other queue's job is placed on their nodes, and on
# Kubernetes only those queues' pods tolerate the pool's `trainyard.io/pool=<name>:NoSchedule` taint.
TRAINYARD_DEDICATED_POOLS = env.list("TRAINYARD_DEDICATED_POOLS", default=[])
# The lifecycle reconciler (jobs/lifecycle.py): how often it runs, and when a step counts as overdue.
TRAINYARD_LIFECYCLE_RECONCILE_S = env.float("TRAINYARD_LIFECYCLE_RECONCILE_S", default=15.0)
TRAINYARD_START_OVERDUE_S = env.float("TRAINYARD_START_OVERDUE_S", default=60.0)
TRAINYARD_STOP_OVERDUE_S = env.float("TRAINYARD_STOP_OVERDUE_S", default=30.0)
# An attempt whose state the backend cannot read (its folder unwritable, a full disk) this long is stopped and retried.
TRAINYARD_OBSERVE_FAILING_S = env.float("TRAINYARD_OBSERVE_FAILING_S", default=120.0)
# Observe passes (jobs.tasks.observe_attempts) never overlap, and one that took W seconds is followed by at least
# W x this many seconds without one (0: back to back, as often as beat's TRAINYARD_OBSERVE_EVERY_S allows).
TRAINYARD_OBSERVE_REST_FACTOR = env.float("TRAINYARD_OBSERVE_REST_FACTOR", default=1.0)
# Readiness: beat's heartbeat task runs this often and is stale after TRAINYARD_BEAT_STALE_S.
TRAINYARD_HEARTBEAT_S = env.float("TRAINYARD_HEARTBEAT_S", default=5.0)
TRAINYARD_BEAT_STALE_S = env.float("TRAINYARD_BEAT_STALE_S", default=45.0)
TRAINYARD_NVML_PROBE = env.bool("TRAINYARD_NVML_PROBE", default=True)
# A job on a shared slice of a card NVML can read (local backend) is stopped when its processes hold more GPU memory
# than the slice's share plus this tolerance (monitoring/services/telemetry.py); the classifier fails it as the user's.
TRAINYARD_SHARE_MEMORY_ENFORCE = env.bool("TRAINYARD_SHARE_MEMORY_ENFORCE", default=True)
TRAINYARD_SHARE_MEMORY_TOLERANCE_MIB = env.int("TRAINYARD_SHARE_MEMORY_TOLERANCE_MIB", default=512)
TRAINYARD_LOG_DAILY_BYTES = env.int("TRAINYARD_LOG_DAILY_BYTES", default=512 * 1024 * 1024)
TRAINYARD_LOG_DAILY_LINES = env.int("TRAINYARD_LOG_DAILY_LINES", default=2_000_000)

CELERY_BEAT_SCHEDULE = {
    "observe-attempts": {"task": "jobs.observe_attempts", "schedule": env.float("TRAINYARD_OBSERVE_EVERY_S", 2.0)},
    "enforce-timeouts": {"task": "jobs.enforce_timeouts", "schedule": 15.0},
    # A stalled dispatcher must not find a pile of beat passes waiting: each one expires when the next is due.
    "dispatch-all": {"task": "jobs.dispatch_all", "schedule": 30.0, "options": {"expires": 30.0}},
    "reconcile-pool": {"task": "jobs.reconcile_pool", "schedule": TRAINYARD_RECONCILE_INTERVAL.total_seconds()},
    "sync-inventory": {"task": "jobs.sync_inventory", "schedule": 300.0},
}
CELERY_BEAT_SCHEDULE["reconcile-lifecycle"] = {
    "task": "jobs.reconcile_lifecycle",
    "schedule": TRAINYARD_LIFECYCLE_RECONCILE_S,
}
CELERY_BEAT_SCHEDULE["prune-checkpoints"] = {"task": "jobs.prune_checkpoints", "schedule": 3600.0}
CELERY_BEAT_SCHEDULE["prune-code-snapshots"] = {"task": "jobs.prune_code_snapshots", "schedule": 3600.0}
CELERY_BEAT_SCHEDULE["lend-idle-nodes"] = {"task": "jobs.lend_idle_nodes", "schedule": 60.0}
CELERY_BEAT_SCHEDULE["propose-mig"] = {"task": "monitoring.propose_mig", "schedule": 60.0}
CELERY_BEAT_SCHEDULE["heartbeat"] = {"task": "trainyard.heartbeat", "schedule": TRAINYARD_HEARTBEAT_S}
TRAINYARD_TB_GRACE_S = env.int("TRAINYARD_TB_GRACE_S", default=600)
TRAINYARD_TB_LINK_TTL_S = env.int("TRAINYARD_TB_LINK_TTL_S", default=3600)

# Kubernetes with Volcano (TRAINYARD_BACKEND=volcano; jobs/backends/volcano.py)
# Startup checks a deployment knows do not apply to it (Django's SILENCED_SYSTEM_CHECKS), e.g. jobs.E002 on a
# cluster whose nodes are this machine.
SILENCED_SYSTEM_CHECKS = env.list("TRAINYARD_SILENCED_CHECKS", default=[])
TRAINYARD_K8S_API_URL = env.str("TRAINYARD_K8S_API_URL", default="")  # plain URL, e.g. `kubectl proxy`
TRAINYARD_K8S_KUBECONFIG = env.str("TRAINYARD_K8S_KUBECONFIG", default="")  # else in-cluster, else ~/.kube/config
TRAINYARD_K8S_CONTEXT = env.str("TRAINYARD_K8S_CONTEXT", default="")
TRAINYARD_K8S_NAMESPACE = env.str("TRAINYARD_K8S_NAMESPACE", default="trainyard")  # the platform's own
# The platform's service account (in TRAINYARD_K8S_NAMESPACE), bound in every team namespace the platform keeps.
TRAINYARD_K8S_SERVICE_ACCOUNT = env.str("TRAINYARD_K8S_SERVICE_ACCOUNT", default="trainyard")
# Team namespaces (labels, ResourceQuota, LimitRange, RoleBinding, NetworkPolicies) kept by the platform: on a
# team's change and every TRAINYARD_K8S_NAMESPACE_SYNC_S (drift repaired). False: an admin keeps them by hand.
TRAINYARD_K8S_MANAGE_NAMESPACES = env.bool("TRAINYARD_K8S_MANAGE_NAMESPACES", default=True)
TRAINYARD_K8S_NAMESPACE_SYNC_S = env.float("TRAINYARD_K8S_NAMESPACE_SYNC_S", default=300.0)
TRAINYARD_K8S_SHARING = env.str("TRAINYARD_K8S_SHARING", default="whole")  # whole | volcano-vgpu
TRAINYARD_K8S_SHARED_RESOURCE = env.str("TRAINYARD_K8S_SHARED_RESOURCE", default="nvidia.com/gpu.shared")
# The Volcano release the cluster runs (e.g. 1.9, 1.14.0), or `auto`: read from the installed Queue CRD.
TRAINYARD_VOLCANO_VERSION = env.str("TRAINYARD_VOLCANO_VERSION", default="auto")
TRAINYARD_K8S_TTL_S = env.int("TRAINYARD_K8S_TTL_S", default=3600)  # at least 300
TRAINYARD_K8S_PRIORITY_CLASS = env.str("TRAINYARD_K8S_PRIORITY_CLASS", default="")
TRAINYARD_K8S_RUN_AS_UID = env.int("TRAINYARD_K8S_RUN_AS_UID", default=1000)
# Job pods under the container runtime's default AppArmor profile. Off for nodes without AppArmor (SELinux hosts),
# whose kubelet refuses pods that ask for a profile.
TRAINYARD_K8S_APPARMOR = env.bool("TRAINYARD_K8S_APPARMOR", default=True)
TRAINYARD_K8S_STDERR_WRAPPER = env.bool("TRAINYARD_K8S_STDERR_WRAPPER", default=True)
TRAINYARD_K8S_JOB_SERVICE_ACCOUNT = env.str("TRAINYARD_K8S_JOB_SERVICE_ACCOUNT", default="")
TRAINYARD_K8S_IMAGE_PULL_SECRETS = env.list("TRAINYARD_K8S_IMAGE_PULL_SECRETS", default=[])
TRAINYARD_K8S_RACK_LABELS = env.list(
    "TRAINYARD_K8S_RACK_LABELS", default=["trainyard.io/rack", "topology.kubernetes.io/rack"]
)
TRAINYARD_K8S_REQUEST_TIMEOUT_S = env.float("TRAINYARD_K8S_REQUEST_TIMEOUT_S", default=15.0)
TRAINYARD_K8S_RETRIES = env.int("TRAINYARD_K8S_RETRIES", default=5)
# One API call with all its retries takes at most this long (observe and timeout tasks have a 60 s soft limit).
TRAINYARD_K8S_CALL_BUDGET_S = env.float("TRAINYARD_K8S_CALL_BUDGET_S", default=20.0)
TRAINYARD_K8S_START_TIMEOUT_S = env.int("TRAINYARD_K8S_START_TIMEOUT_S", default=600)
# A running pod's log is copied into the log store this often while nobody reads the job's log, and every observe
# pass while someone does (a log page or socket, the logs API) and for TRAINYARD_K8S_LOG_WATCH_S after.
TRAINYARD_K8S_LOG_EVERY_S = env.float("TRAINYARD_K8S_LOG_EVERY_S", default=300.0)
TRAINYARD_K8S_LOG_WATCH_S = env.float("TRAINYARD_K8S_LOG_WATCH_S", default=60.0)
# A pod whose node stays NotReady (or that stays Terminating) this long is lost with its node.
TRAINYARD_K8S_NODE_LOST_S = env.int("TRAINYARD_K8S_NODE_LOST_S", default=300)
# How often the observe loop checks which nodes are Ready (a NotReady or deleted node leaves placement).
TRAINYARD_K8S_NODE_CHECK_S = env.float("TRAINYARD_K8S_NODE_CHECK_S", default=10.0)
TRAINYARD_TB_BASE_DOMAIN = env.str("TRAINYARD_TB_BASE_DOMAIN", default="")
# The platform's own image, which runs the checkpoint sidecar and the dataset fetchers in a job's pod, and the
# Secret (in each team's namespace) holding the object store's keys for them.
TRAINYARD_K8S_PLATFORM_IMAGE = env.str("TRAINYARD_K8S_PLATFORM_IMAGE", default=f"trainyard:{PLATFORM_VERSION}")
TRAINYARD_K8S_S3_SECRET = env.str("TRAINYARD_K8S_S3_SECRET", default="trainyard-s3")
# A storage class offering ReadWriteMany: each S3 dataset version is fetched once into a claim of its own that
# every job pod mounts read-only. Empty: every pod fetches its datasets into its own emptyDir.
TRAINYARD_DATASET_CACHE_STORAGE_CLASS = env.str("TRAINYARD_DATASET_CACHE_STORAGE_CLASS", default="")
# How long a dataset's fill Job may take, and a job's pods wait for it, before the attempt fails.
TRAINYARD_DATASET_FILL_TIMEOUT_S = env.int("TRAINYARD_DATASET_FILL_TIMEOUT_S", default=6 * 3600)
TRAINYARD_TB_IMAGE = env.str("TRAINYARD_TB_IMAGE", default="docker.io/tensorflow/tensorflow:2.16.1")
TRAINYARD_TB_INGRESS_CLASS = env.str("TRAINYARD_TB_INGRESS_CLASS", default="")
TRAINYARD_TB_AUTH_URL = env.str("TRAINYARD_TB_AUTH_URL", default="")  # {job_id} is replaced
TRAINYARD_TB_TLS_SECRET = env.str("TRAINYARD_TB_TLS_SECRET", default="")
# Experiments (experiments/, docs/experiments.md): how often every live experiment is advanced (metrics folded in,
# early stops, new trials), and after how many ended trials their usage right-sizes the next ones.
TRAINYARD_EXPERIMENT_ADVANCE_S = env.float("TRAINYARD_EXPERIMENT_ADVANCE_S", default=5.0)
TRAINYARD_EXPERIMENT_RIGHTSIZE_AFTER = env.int("TRAINYARD_EXPERIMENT_RIGHTSIZE_AFTER", default=3)
CELERY_BEAT_SCHEDULE["advance-experiments"] = {
    "task": "experiments.advance",
    "schedule": TRAINYARD_EXPERIMENT_ADVANCE_S,
}
CELERY_BEAT_SCHEDULE["sync-team-namespaces"] = {
    "task": "jobs.sync_team_namespaces",
    "schedule": TRAINYARD_K8S_NAMESPACE_SYNC_S,
}
CELERY_BEAT_SCHEDULE["reap-tensorboards"] = {"task": "jobs.reap_tensorboards", "schedule": 60.0}

# Monitoring (monitoring/): health probes, telemetry, alert rules, business metrics, /metrics
TRAINYARD_HEALTH_PROBE_INTERVAL_S = env.float("TRAINYARD_HEALTH_PROBE_INTERVAL_S", default=10.0)
# The dispatcher's look at a Kubernetes node's dcgm-exporter series right before it hands cards out: at most this long.
TRAINYARD_HAND_OUT_CHECK_TIMEOUT_S = env.float("TRAINYARD_HAND_OUT_CHECK_TIMEOUT_S", default=2.0)
TRAINYARD_TELEMETRY_SOURCE = env.str("TRAINYARD_TELEMETRY_SOURCE", default="auto")  # auto | nvml | prometheus | none
TRAINYARD_TELEMETRY_INTERVAL_S = env.float("TRAINYARD_TELEMETRY_INTERVAL_S", default=30.0)
# Right-sizing (docs/rightsizing.md): how often a local supervisor samples its attempt's use, the margin a
# recommendation adds over the observed p95 and the memory allowance shared among its runs of evidence (both chosen
# by `make bench-rightsizing` on its tuning seeds), and how many earlier runs it looks at.
TRAINYARD_USAGE_INTERVAL_S = env.float("TRAINYARD_USAGE_INTERVAL_S", default=5.0)
TRAINYARD_RIGHTSIZE_MARGIN = env.float("TRAINYARD_RIGHTSIZE_MARGIN", default=0.0)
TRAINYARD_RIGHTSIZE_UNCERTAINTY = env.float("TRAINYARD_RIGHTSIZE_UNCERTAINTY", default=0.5)
TRAINYARD_RIGHTSIZE_HISTORY = env.int("TRAINYARD_RIGHTSIZE_HISTORY", default=10)
# A leak: GPU or host memory that rose over at least this many samples and this share of the attempt's first value.
TRAINYARD_LEAK_MIN_SAMPLES = env.int("TRAINYARD_LEAK_MIN_SAMPLES", default=120)
TRAINYARD_LEAK_MIN_GROWTH = env.float("TRAINYARD_LEAK_MIN_GROWTH", default=0.5)
TRAINYARD_PROMETHEUS_URL = env.str("TRAINYARD_PROMETHEUS_URL", default="")
TRAINYARD_FATAL_XIDS = env.list(
    "TRAINYARD_FATAL_XIDS", cast=int, default=[48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140]
)
TRAINYARD_ALERT_WEBHOOK_URL = env.str("TRAINYARD_ALERT_WEBHOOK_URL", default="")
# HMAC-SHA256 key of alert-rule webhooks (X-Trainyard-Timestamp, X-Trainyard-Signature); empty: unsigned.
TRAINYARD_ALERT_WEBHOOK_SECRET = env.str("TRAINYARD_ALERT_WEBHOOK_SECRET", default="")
TRAINYARD_ALERT_EVALUATE_INTERVAL_S = env.float("TRAINYARD_ALERT_EVALUATE_INTERVAL_S", default=30.0)
TRAINYARD_METRIC_SCAN_INTERVAL_S = env.float("TRAINYARD_METRIC_SCAN_INTERVAL_S", default=10.0)
# Mail (a failed attempt's push to its owner): an smtp:// or smtp+tls:// URL; by default printed to the console.
vars().update(env.email_url_config(env.str("TRAINYARD_EMAIL_URL", default="consolemail://")))
DEFAULT_FROM_EMAIL = env.str("TRAINYARD_EMAIL_FROM", default="trainyard@localhost")
# A watched log text on a job opens a new alert at most this often (after the last one was resolved).
TRAINYARD_LOG_WATCH_REOPEN_S = env.float("TRAINYARD_LOG_WATCH_REOPEN_S", default=600.0)
# A user's own webhook may name a loopback or private address (off: the platform's network is out of its reach).
TRAINYARD_PUSH_WEBHOOK_ALLOW_PRIVATE = env.bool("TRAINYARD_PUSH_WEBHOOK_ALLOW_PRIVATE", default=False)
# A failed attempt (the user's reason) pushes this many of its last stderr lines to its owner.
TRAINYARD_FAILURE_PUSH_LINES = env.int("TRAINYARD_FAILURE_PUSH_LINES", default=20)
TRAINYARD_METRICS_RETENTION_DAYS = env.int("TRAINYARD_METRICS_RETENTION_DAYS", default=14)
TRAINYARD_METRICS_TOKEN = env.str("TRAINYARD_METRICS_TOKEN", default="")  # when set, /metrics wants a bearer token
CELERY_BEAT_SCHEDULE.update(
    {
        "probe-gpus": {"task": "monitoring.probe_gpus", "schedule": TRAINYARD_HEALTH_PROBE_INTERVAL_S},
        "collect-telemetry": {"task": "monitoring.collect_telemetry", "schedule": TRAINYARD_TELEMETRY_INTERVAL_S},
        "evaluate-alerts": {"task": "monitoring.evaluate_alerts", "schedule": TRAINYARD_ALERT_EVALUATE_INTERVAL_S},
        "scan-job-metrics": {"task": "monitoring.scan_job_metrics", "schedule": TRAINYARD_METRIC_SCAN_INTERVAL_S},
        "sample-scheduling": {"task": "monitoring.sample_scheduling", "schedule": 60.0},
        "prune-monitoring": {"task": "monitoring.prune", "schedule": 3600.0},
    }
)
# Worker threads serving HTTP in the ASGI process (each keeps its own database and Redis connections).
TRAINYARD_HTTP_THREADS = env.int("TRAINYARD_HTTP_THREADS", default=8)
# Once a web process has answered its first request, start all of those threads and open their connections
# (kernel/warmup.py), rather than one thread at a time inside the requests that find the others busy.
TRAINYARD_HTTP_WARM = env.bool("TRAINYARD_HTTP_WARM", default=True)
# Move what the web process loaded at start (and again after its first requests) out of the garbage collector's
# reach: a full collection otherwise walks every module object and paused requests for 50-120 ms. A worker process
# freezes what it loaded, and what each dispatch pass leaves alive (the pool, the carried lines), collecting
# everything every 5 minutes (kernel/gctune.py).
TRAINYARD_GC_FREEZE = env.bool("TRAINYARD_GC_FREEZE", default=True)

# Images (docs/images.md): the registry builds are pushed to and tags are resolved against. `make run` / `make test`
# start an embedded one (Debian's docker-registry) when this is unset.
TRAINYARD_REGISTRY_URL = env.str("TRAINYARD_REGISTRY_URL", default="")
# The embedded registry's program: needed (and checked by /readyz and `make run`) while TRAINYARD_REGISTRY_URL
# is unset.
TRAINYARD_REGISTRY_BINARY = env.str("TRAINYARD_REGISTRY_BINARY", default="docker-registry")
# Its user and password (basic auth; the embedded one's are generated into var/registry.password). Only the
# platform's own processes hold them: builds get them in a file for their pull and push steps alone, jobs never.
TRAINYARD_REGISTRY_USERNAME = env.str("TRAINYARD_REGISTRY_USERNAME", default="")
TRAINYARD_REGISTRY_PASSWORD = env.str("TRAINYARD_REGISTRY_PASSWORD", default="")
# The token service's signing key (images/registry_tokens.py; the embedded registry's is var/registry-token.key).
# Set, the platform hands out scoped credentials: a team's jobs pull only their team's images and the shared
# bases, a build pushes only to its own repository. Unset (an external registry the platform does not control),
# builds get the user and password above, and the registry itself keeps no team from another's images.
TRAINYARD_REGISTRY_TOKEN_KEY = env.str("TRAINYARD_REGISTRY_TOKEN_KEY", default="")
# How long a build's push credential works from when it is handed out (a Kubernetes build holds it for its whole
# Job, a local build gets a fresh one for each pull and push).
TRAINYARD_REGISTRY_PUSH_CREDENTIAL_S = env.int("TRAINYARD_REGISTRY_PUSH_CREDENTIAL_S", default=0)
TRAINYARD_REGISTRY_TIMEOUT_S = env.float("TRAINYARD_REGISTRY_TIMEOUT_S", default=5.0)
TRAINYARD_MAX_BASE_IMAGES = env.int("TRAINYARD_MAX_BASE_IMAGES", default=8)
TRAINYARD_IMAGE_REBUILD_S = env.int("TRAINYARD_IMAGE_REBUILD_S", default=7 * 24 * 3600)  # weekly base rebuilds
TRAINYARD_BUILD_ROOT = Path(env.str("TRAINYARD_BUILD_ROOT", default=str(VAR_DIR / "containers")))
# Live (unrevoked, unexpired) API tokens one user may hold.
TRAINYARD_MAX_TOKENS_PER_USER = env.int("TRAINYARD_MAX_TOKENS_PER_USER", default=50)
TRAINYARD_BUILD_TIMEOUT_S = env.int("TRAINYARD_BUILD_TIMEOUT_S", default=3600)
TRAINYARD_REGISTRY_PUSH_CREDENTIAL_S = TRAINYARD_REGISTRY_PUSH_CREDENTIAL_S or TRAINYARD_BUILD_TIMEOUT_S + 600
# A local build step's memory (MiB, swap included), CPU (milli-CPUs) and processes, held by a control group around
# its whole process tree (images/build_limits.py); `auto` takes what the machine offers (cgroup2, cgroup1), `off`
# bounds it in time only.
TRAINYARD_BUILD_LIMITS = env.str("TRAINYARD_BUILD_LIMITS", default="auto")
TRAINYARD_BUILD_MEMORY_MIB = env.int("TRAINYARD_BUILD_MEMORY_MIB", default=8192)
TRAINYARD_BUILD_CPU_MILLI = env.int("TRAINYARD_BUILD_CPU_MILLI", default=4000)
TRAINYARD_BUILD_PIDS_MAX = env.int("TRAINYARD_BUILD_PIDS_MAX", default=4096)
# A queued build older than this whose message was lost is sent again (images.reap_builds, every minute).
TRAINYARD_BUILD_REQUEUE_S = env.float("TRAINYARD_BUILD_REQUEUE_S", default=300.0)
# Code snapshots (jobs/code.py): where they are kept, and how large one may be.
TRAINYARD_CODE_ROOT = Path(env.str("TRAINYARD_CODE_ROOT", default=str(VAR_DIR / "code")))
TRAINYARD_CODE_MAX_BYTES = env.int("TRAINYARD_CODE_MAX_BYTES", default=100 * 2**20)
TRAINYARD_CODE_MAX_UNPACKED_BYTES = env.int("TRAINYARD_CODE_MAX_UNPACKED_BYTES", default=1024 * 2**20)
TRAINYARD_CODE_MAX_FILES = env.int("TRAINYARD_CODE_MAX_FILES", default=50_000)
# The portal's "git repository + commit" fetch (jobs/code.py): https and ssh always; file:// only when allowed
# (it reads the platform's own disk), and how long a fetch may take.
TRAINYARD_CODE_GIT_ALLOW_FILE = env.bool("TRAINYARD_CODE_GIT_ALLOW_FILE", default=False)
TRAINYARD_CODE_GIT_TIMEOUT_S = env.int("TRAINYARD_CODE_GIT_TIMEOUT_S", default=120)
# A vulnerability feed older than this (or none) makes a clean scan "unscanned", never "passed".
TRAINYARD_SCAN_FEED_MAX_AGE_S = env.float("TRAINYARD_SCAN_FEED_MAX_AGE_S", default=7 * 86400)
# The network of a local build's RUN steps (images/builder.py): "none"; "allowlist" (through the platform's filtering
# proxy, the hosts of TRAINYARD_BUILD_ALLOWED_HOSTS alone, never a loopback address or a platform service;
# images/build_proxy.py); or "outbound" (slirp4netns: any internet host, never the platform's own loopback services).
TRAINYARD_BUILD_NETWORK = env.str("TRAINYARD_BUILD_NETWORK", default="none")
if TRAINYARD_BUILD_NETWORK not in ("none", "allowlist", "outbound"):
    raise ValueError(
        f"TRAINYARD_BUILD_NETWORK must be 'none', 'allowlist' or 'outbound', not {TRAINYARD_BUILD_NETWORK!r}"
    )
# The hosts a build may reach on its own besides the platform's registry (docs/security.md, "Build hosts"):
# `host:port` pairs, e.g. `registry-1.docker.io:443,deb.debian.org:80`. A base image's FROM on another registry
# (Docker Hub is registry-1.docker.io:443) and an ADD <url> must name one; anything else is 400
# `build_host_not_allowed` (`add_url_not_allowed` in a project image). Empty: the platform's registry only.
TRAINYARD_BUILD_ALLOWED_HOSTS = [h.strip().lower() for h in env.list("TRAINYARD_BUILD_ALLOWED_HOSTS", default=[])]
for _host in TRAINYARD_BUILD_ALLOWED_HOSTS:
    if not re.fullmatch(r"(?:\[[0-9a-f:.]+\]|[a-z0-9]([a-z0-9.-]*[a-z0-9])?):[0-9]{1,5}", _host):
        raise ValueError(f"TRAINYARD_BUILD_ALLOWED_HOSTS: {_host!r} is not host:port")
TRAINYARD_BUILD_REGISTRY_RETRY_S = env.float("TRAINYARD_BUILD_REGISTRY_RETRY_S", default=30.0)
TRAINYARD_BUILD_REGISTRY_RETRIES = env.int("TRAINYARD_BUILD_REGISTRY_RETRIES", default=20)
# Where builds run: `podman` on the worker, or `kubernetes`: a rootless BuildKit Job per build in
# TRAINYARD_K8S_BUILD_NAMESPACE (the default when TRAINYARD_BACKEND=volcano), looked at every TRAINYARD_BUILD_POLL_S.
# Rootless BuildKit needs seccomp and AppArmor unconfined, which the "restricted" (and "baseline") Pod Security
# Standard refuse: builds get a namespace of their own (k8s/namespace.yaml), away from the platform and the teams.
TRAINYARD_IMAGE_BUILDER = env.str(
    "TRAINYARD_IMAGE_BUILDER", default="kubernetes" if TRAINYARD_BACKEND == "volcano" else "podman"
)
# `make run` makes sure the catalog holds `python-local`, a base built from this machine's files (docs/images.md);
# off: it is neither built nor looked for at start.
TRAINYARD_OFFLINE_BASE = env.bool("TRAINYARD_OFFLINE_BASE", default=True)
TRAINYARD_K8S_BUILD_NAMESPACE = env.str("TRAINYARD_K8S_BUILD_NAMESPACE", default="trainyard-builds")
# The build proxy's Service (k8s/build-proxy.yaml) as the build pods reach it, for TRAINYARD_BUILD_NETWORK=allowlist on
# Kubernetes: the BuildKit Job hands it to the RUN steps as http(s)_proxy (images/k8s_build.py).
TRAINYARD_K8S_BUILD_PROXY_URL = env.str(
    "TRAINYARD_K8S_BUILD_PROXY_URL", default="http://trainyard-build-proxy.trainyard.svc:3128"
)
TRAINYARD_BUILD_POLL_S = env.float("TRAINYARD_BUILD_POLL_S", default=10.0)
TRAINYARD_IMAGE_SIZE_WARN_MIB = env.int("TRAINYARD_IMAGE_SIZE_WARN_MIB", default=20 * 1024)
TRAINYARD_IMAGE_DATA_WARN_MIB = env.int("TRAINYARD_IMAGE_DATA_WARN_MIB", default=100)
TRAINYARD_PROJECT_IMAGE_RETENTION_DAYS = env.int("TRAINYARD_PROJECT_IMAGE_RETENTION_DAYS", default=90)
CELERY_BEAT_SCHEDULE["rebuild-images"] = {"task": "images.rebuild_due", "schedule": 3600.0}
CELERY_BEAT_SCHEDULE["reap-builds"] = {"task": "images.reap_builds", "schedule": 60.0}
