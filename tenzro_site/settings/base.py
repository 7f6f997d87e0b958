"""Settings shared by every environment. Each value comes from the environment
(documented, with its default, in docs/operations.md)."""

from __future__ import annotations

import dj_database_url
from redis.exceptions import ConnectionError as RedisConnectionError

from core.env import (
    BASE_DIR,
    DEFAULT_HTTP,
    DEFAULT_QUIC,
    DEFAULT_REDIS_URL,
    DEFAULT_ROLES,
    PREPARE_QUEUE,
    SQLITE_FILE,
    data_dir,
    env_bool,
    env_float,
    env_int,
    env_list,
    env_str,
    read_or_create_secret,
)
from core.logs import logging_config

TENZRO_VERSION = "0.1.0"
TENZRO_DATA_DIR = data_dir()
TENZRO_HTTP = env_str("TENZRO_HTTP", DEFAULT_HTTP)
TENZRO_QUIC = env_str("TENZRO_QUIC", DEFAULT_QUIC)
TENZRO_PEERS = env_list("TENZRO_PEERS", "")
TENZRO_ROLES = env_list("TENZRO_ROLES", DEFAULT_ROLES)
# Public URL peers use to reach this node's HTTP endpoint (defaults to the bind address).
TENZRO_PUBLIC_HTTP = env_str("TENZRO_PUBLIC_HTTP", f"http://{TENZRO_HTTP}")
# Public host:port peers use to reach this node's QUIC endpoint (defaults to the bind address).
TENZRO_PUBLIC_QUIC = env_str("TENZRO_PUBLIC_QUIC", TENZRO_QUIC)
# Gossip of provider records (docs/operations.md, "Gossip"): a round every INTERVAL seconds, a
# fresh signed heartbeat every HEARTBEAT seconds, providers silent for TTL seconds dropped.
TENZRO_GOSSIP_INTERVAL_S = env_float("TENZRO_GOSSIP_INTERVAL_S", 5.0)
TENZRO_GOSSIP_HEARTBEAT_S = env_float("TENZRO_GOSSIP_HEARTBEAT_S", 15.0)
TENZRO_GOSSIP_TTL_S = env_float("TENZRO_GOSSIP_TTL_S", 60.0)
TENZRO_GOSSIP_MAX_SKEW_S = env_float("TENZRO_GOSSIP_MAX_SKEW_S", 30.0)
TENZRO_GOSSIP_FANOUT = env_int("TENZRO_GOSSIP_FANOUT", 3)
# Each round, the chance of also syncing with one of the configured --peers (as Cassandra does
# with its seeds), so groups of nodes that formed apart cannot stay apart.
TENZRO_GOSSIP_SEED_PROBABILITY = env_float("TENZRO_GOSSIP_SEED_PROBABILITY", 0.25)
TENZRO_GOSSIP_MAX_RECORD_BYTES = env_int("TENZRO_GOSSIP_MAX_RECORD_BYTES", 1024 * 1024)
TENZRO_GOSSIP_MAX_PROVIDERS = env_int("TENZRO_GOSSIP_MAX_PROVIDERS", 100_000)
# How often this node asks a peer to confirm its endpoints once one has (until then: every round).
TENZRO_REACHABILITY_CHECK_S = env_float("TENZRO_REACHABILITY_CHECK_S", 60.0)
# Dial back endpoints on other hosts than the asking one (only behind address translation).
TENZRO_DIALBACK_ANY_HOST = env_bool("TENZRO_DIALBACK_ANY_HOST", False)
# This provider's advertised price per input token (a decimal string, signed as written).
TENZRO_PRICE_PER_INPUT_TOKEN = env_str("TENZRO_PRICE_PER_INPUT_TOKEN", "0.000001")
# The short name people see for this provider (signed into its record); "" = the host name and the
# provider id's first 6 hex digits (apps/providers/selectors.py own_name).
TENZRO_NODE_NAME = env_str("TENZRO_NODE_NAME", "").strip()
if len(TENZRO_NODE_NAME) > 64 or not TENZRO_NODE_NAME.isprintable():  # a record's rule (apps/providers/records.py)
    raise ValueError(f"environment variable TENZRO_NODE_NAME must be at most 64 printable characters, "
                     f"got {TENZRO_NODE_NAME!r}")
# Re-sign the record when committed_tps moves by more than this fraction (and at least 10 rows/s).
TENZRO_RECORD_TPS_STEP = env_float("TENZRO_RECORD_TPS_STEP", 0.25)
# Activation codecs this node's moe/execute accepts and its forward sends, preferred first
# (docs/protocol.md, "Activation codecs"); announced in its provider record.
TENZRO_ACTIVATION_CODECS = env_list("TENZRO_ACTIVATION_CODECS", "q8_0,f32")
# One moe/execute per holder per MoE layer (docs/protocol.md, "Multi-expert execute"): advertised in
# the record, taken from peers, used towards holders whose records advertise it. 0 behaves as a node
# from before the multi-expert frame (one expert per request, both ways).
TENZRO_EXECUTE_BATCHES = env_bool("TENZRO_EXECUTE_BATCHES", True)
# The distributed forward (docs/operations.md, "Distributed forward"): batches in flight at
# once, replanning waves after every holder of a batch failed, one attempt's time limit, and
# the quantile of a holder's own latencies past which its batch is hedged, the hedge delay before
# it has enough of them (both floored at the floor).
TENZRO_FORWARD_MAX_IN_FLIGHT = env_int("TENZRO_FORWARD_MAX_IN_FLIGHT", 16)
TENZRO_FORWARD_MAX_REPLANS = env_int("TENZRO_FORWARD_MAX_REPLANS", 2)
TENZRO_FORWARD_ATTEMPT_TIMEOUT_S = env_float("TENZRO_FORWARD_ATTEMPT_TIMEOUT_S", 20.0)
TENZRO_FORWARD_HEDGE_QUANTILE = env_float("TENZRO_FORWARD_HEDGE_QUANTILE", 0.99)
TENZRO_FORWARD_HEDGE_DEFAULT_S = env_float("TENZRO_FORWARD_HEDGE_DEFAULT_S", 0.0)  # 0: no hedge before measured
TENZRO_FORWARD_HEDGE_FLOOR_S = env_float("TENZRO_FORWARD_HEDGE_FLOOR_S", 0.005)
# A holder that failed or stalled in a forward is planned last for this long.
TENZRO_FORWARD_FAILURE_COOLDOWN_S = env_float("TENZRO_FORWARD_FAILURE_COOLDOWN_S", 30.0)
# A holder's measured wire time per byte halves every this many seconds it is not measured again: one
# the planner sent no rows (its path was measured narrow) is tried again, and measured, once it is
# no longer so much worse than the others.
TENZRO_FORWARD_WIRE_HALF_LIFE_S = env_float("TENZRO_FORWARD_WIRE_HALF_LIFE_S", 60.0)
# A holder's QUIC connection no forward used for this long is closed; until then it is kept open (PINGed
# when quiet), so a forward after a quiet spell pays no handshake and no new congestion window.
TENZRO_FORWARD_IDLE_CLOSE_S = env_float("TENZRO_FORWARD_IDLE_CLOSE_S", 600.0)
# The dashboard's Forwards page: this many of the most recent forwards' stats are kept.
TENZRO_FORWARD_RECORDS_KEPT = env_int("TENZRO_FORWARD_RECORDS_KEPT", 500)
# Whole-model generation (docs/operations.md, "Generation"): the longest prompt and the most new
# tokens one generation may ask for, how many run at once on this router, and how many of the
# most recent generations' records are kept.
TENZRO_GENERATE_MAX_PROMPT_TOKENS = env_int("TENZRO_GENERATE_MAX_PROMPT_TOKENS", 4096)
TENZRO_GENERATE_MAX_NEW_TOKENS = env_int("TENZRO_GENERATE_MAX_NEW_TOKENS", 1024)
# Generations running at once; those of one model step together (continuous batching, apps/generation/batcher.py).
TENZRO_GENERATE_MAX_CONCURRENT = env_int("TENZRO_GENERATE_MAX_CONCURRENT", 16)
# Admission (apps/generation/admission.py): how many more wait for a slot or for KV cache bytes (past
# them: 429 busy); the KV caches' budget in bytes (0: the node's memory budget less the dense weights it
# holds); the most rows one iteration carries; a prompt's prefill in chunks of this many tokens, so a
# long prompt does not stall the others' decoding; and the longest a generation may take, queue included.
TENZRO_GENERATE_QUEUE = env_int("TENZRO_GENERATE_QUEUE", 64)
TENZRO_GENERATE_KV_BUDGET_BYTES = env_int("TENZRO_GENERATE_KV_BUDGET_BYTES", 0)
TENZRO_GENERATE_MAX_BATCH_ROWS = env_int("TENZRO_GENERATE_MAX_BATCH_ROWS", 512)
TENZRO_GENERATE_PREFILL_CHUNK = env_int("TENZRO_GENERATE_PREFILL_CHUNK", 256)
TENZRO_GENERATE_DEADLINE_S = env_float("TENZRO_GENERATE_DEADLINE_S", 600.0)
# How long an iteration waits for every running generation of its model to ask for its step (they
# sample between steps, well under a millisecond); a slower one joins the next iteration.
TENZRO_GENERATE_BATCH_WAIT_MS = env_float("TENZRO_GENERATE_BATCH_WAIT_MS", 5.0)
TENZRO_GENERATIONS_KEPT = env_int("TENZRO_GENERATIONS_KEPT", 200)
# A generation's steps are written to its record in batches, at most this often (the first step, the
# time to first token, at once; the rest with the end): no database write or dashboard push per token.
TENZRO_GENERATION_RECORD_INTERVAL_S = env_float("TENZRO_GENERATION_RECORD_INTERVAL_S", 0.25)
# Seconds tenzro_moeLoadDense waits for the worker to read a checkpoint's dense tensors, and a
# waiting tenzro_moeGenerate for its generation to end (past it, it answers with the record so far).
TENZRO_LOAD_DENSE_TIMEOUT_S = env_float("TENZRO_LOAD_DENSE_TIMEOUT_S", 600.0)
TENZRO_GENERATE_WAIT_S = env_float("TENZRO_GENERATE_WAIT_S", 600.0)
# The OpenAI-compatible API under /v1 (docs/openai.md): whether a request needs a client key, how many
# requests per minute a key may make (a key's own figure wins; 0 = no limit), the Retry-After of a
# busy router's 429, and how long /v1 waits for a generation's next token before it gives up (503).
TENZRO_API_KEYS_REQUIRED = env_bool("TENZRO_API_KEYS_REQUIRED", True)
TENZRO_API_KEY_REQUESTS_PER_MINUTE = env_int("TENZRO_API_KEY_REQUESTS_PER_MINUTE", 60)
TENZRO_API_RETRY_AFTER_S = env_int("TENZRO_API_RETRY_AFTER_S", 1)
TENZRO_OPENAI_STEP_TIMEOUT_S = env_float("TENZRO_OPENAI_STEP_TIMEOUT_S", 300.0)
# Receipts (docs/protocol.md, "Receipts"): this holder signs each moe/execute answer with its
# node key (off: it serves receiptless, and remote routers refuse its answers); a router asks
# holders to commit to this many features per row, and a dispute tolerates an honest holder's
# compute path differing by this fraction of a row's largest magnitude (plus the wire codec's).
# Dashboard pages that only read may be seen without logging in (forms that change the node
# always need a logged-in staff user); 0 puts every page behind the login.
TENZRO_DASHBOARD_PUBLIC = env_bool("TENZRO_DASHBOARD_PUBLIC", True)
# GET /metrics (Prometheus) without the operator token; 0 asks for it (docs/operations.md, "Metrics").
TENZRO_METRICS_PUBLIC = env_bool("TENZRO_METRICS_PUBLIC", True)
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/"
TENZRO_SIGN_RECEIPTS = env_bool("TENZRO_SIGN_RECEIPTS", True)
# Repair (docs/operations.md, "Repair"): how often the beat asks whether a pass is due (the
# interval itself is the policy's), and the per-node jitter on that interval (a fraction).
TENZRO_REPAIR_TICK_S = env_float("TENZRO_REPAIR_TICK_S", 5.0)
TENZRO_REPAIR_JITTER = env_float("TENZRO_REPAIR_JITTER", 0.1)
# Settlements still in the outbox this long after they were queued are queued again (apps/settlement/tasks.py).
TENZRO_SETTLEMENT_SWEEP_S = env_float("TENZRO_SETTLEMENT_SWEEP_S", 60.0)
TENZRO_RECEIPT_TOPK = env_int("TENZRO_RECEIPT_TOPK", 16)
# Kept receipts (the 1 in receipt_sample_one_in stored whole) are forgotten after this many days, and past
# this many (oldest first); one under a dispute stays (apps/receipts/services.receipts_prune, hourly).
TENZRO_RECEIPT_RETENTION_DAYS = env_int("TENZRO_RECEIPT_RETENTION_DAYS", 30)
TENZRO_RECEIPT_KEEP_MAX = env_int("TENZRO_RECEIPT_KEEP_MAX", 100_000)
TENZRO_DISPUTE_COMPUTE_TOLERANCE = env_float("TENZRO_DISPUTE_COMPUTE_TOLERANCE", 0.05)
# Disputes by another holder (docs/protocol.md): a router without its own copy of the expert asks up to this
# many other holders of the same blob for a signed verdict before it fetches the blob to re-execute itself,
# each within this many seconds; as a verifier, this node re-executes at most this many kept batches a minute
# for one peer, each of at most this many carrier rows.
TENZRO_DISPUTE_VERIFIERS = env_int("TENZRO_DISPUTE_VERIFIERS", 2)
TENZRO_DISPUTE_VERIFY_TIMEOUT_S = env_float("TENZRO_DISPUTE_VERIFY_TIMEOUT_S", 30.0)
TENZRO_VERIFY_RATE_PER_MIN = env_int("TENZRO_VERIFY_RATE_PER_MIN", 30)
TENZRO_VERIFY_MAX_ROWS = env_int("TENZRO_VERIFY_MAX_ROWS", 4096)
# Largest JSON-RPC request body accepted, in bytes (base64 hidden rows make these big).
TENZRO_RPC_MAX_BYTES = env_int("TENZRO_RPC_MAX_BYTES", 64 * 1024 * 1024)
# Most calls in one JSON-RPC batch; a larger batch is refused whole (batch_too_large).
TENZRO_RPC_MAX_BATCH = env_int("TENZRO_RPC_MAX_BATCH", 1000)
# Seconds the web process waits for the expert worker to answer over the Channels layer.
TENZRO_WORKER_TIMEOUT_S = env_float("TENZRO_WORKER_TIMEOUT_S", 30.0)
# A stopping worker finishes the QUIC answers in flight for up to this long before it closes its door.
TENZRO_WORKER_DRAIN_S = env_float("TENZRO_WORKER_DRAIN_S", 5.0)
# Largest body of one QUIC frame this node accepts in an answer (as a client), in bytes.
TENZRO_QUIC_MAX_BODY = env_int("TENZRO_QUIC_MAX_BODY", 256 * 1024 * 1024)
# Limits of the peer door (QUIC, and its HTTP fallback): request body size, requests in flight
# per connection, request rate per peer (token bucket: per second, burst), connections per host.
TENZRO_PEER_MAX_BODY_BYTES = env_int("TENZRO_PEER_MAX_BODY_BYTES", 64 * 1024 * 1024)
TENZRO_PEER_MAX_STREAMS = env_int("TENZRO_PEER_MAX_STREAMS", 32)
TENZRO_PEER_RATE_PER_S = env_int("TENZRO_PEER_RATE_PER_S", 200)
TENZRO_PEER_BURST = env_int("TENZRO_PEER_BURST", 400)
TENZRO_PEER_MAX_CONNECTIONS_PER_HOST = env_int("TENZRO_PEER_MAX_CONNECTIONS_PER_HOST", 64)
# Who a peer is (docs/security.md, "Per-peer limits"): "host" (an IPv4 address, an IPv6 /PREFIX
# network) shares the rate and the in-flight requests over all of its connections;
# "connection" gives each connection its own (the behaviour before per-peer limits).
TENZRO_PEER_LIMIT_BY = env_str("TENZRO_PEER_LIMIT_BY", "host")
if TENZRO_PEER_LIMIT_BY not in ("host", "connection"):
    raise ValueError(f"TENZRO_PEER_LIMIT_BY must be host or connection, got {TENZRO_PEER_LIMIT_BY!r}")
TENZRO_PEER_MAX_STREAMS_PER_PEER = env_int("TENZRO_PEER_MAX_STREAMS_PER_PEER", 256)
TENZRO_PEER_IPV6_PREFIX = env_int("TENZRO_PEER_IPV6_PREFIX", 64)
# The worker refreshes its published state this often, and readers call it stale after
# TENZRO_WORKER_STALE_S of silence.
TENZRO_WORKER_HEARTBEAT_S = env_int("TENZRO_WORKER_HEARTBEAT_S", 5)
TENZRO_WORKER_STALE_S = env_int("TENZRO_WORKER_STALE_S", 15)
# Seconds the worker keeps what it read from the control plane (the policy) before reading again.
TENZRO_WORKER_CONTROL_TTL_S = env_int("TENZRO_WORKER_CONTROL_TTL_S", 5)
# Memory-tier budget of the expert runtime in bytes; 0 = 60% of available memory (4 GiB if unknown).
TENZRO_MEMORY_BUDGET_BYTES = env_int("TENZRO_MEMORY_BUDGET_BYTES", 0)
# The rolling window of the demand (committed_tps) and capacity (capacity_tps) meters, in seconds: a
# minute, as the metering rule says; tests shorten it to see demand come and go quickly.
TENZRO_METER_WINDOW_S = env_int("TENZRO_METER_WINDOW_S", 60)
# Compute backend of the expert worker (core/experts/selection.py): auto (CUDA, else a hardware
# WebGPU adapter, else the CPU), cuda, wgsl (forced: an error at start if it cannot run), cpu,
# cpu-numba, cpu-numpy.
TENZRO_EXPERT_BACKEND = env_str("TENZRO_EXPERT_BACKEND", "auto")
# Device-memory tier of a GPU backend in bytes; 0 = 80% of the device's memory (2 GiB under
# WebGPU, which cannot say). Experts past it stay in host memory and are uploaded LRU.
TENZRO_GPU_MEMORY_BUDGET_BYTES = env_int("TENZRO_GPU_MEMORY_BUDGET_BYTES", 0)
# Which CUDA device the worker uses (CUDA ordinal).
TENZRO_GPU_DEVICE = env_int("TENZRO_GPU_DEVICE", 0)
# Threads of the expert worker that run expert compute and payload decoding.
TENZRO_COMPUTE_THREADS = env_int("TENZRO_COMPUTE_THREADS", 2)
# A multi-expert moe/execute frame of at most this many rows in all (8: a decode step's) is computed
# on the worker's event loop when no other frame is computing (no hop to a compute thread); 0: always
# a thread. See docs/operations.md.
TENZRO_INLINE_COMPUTE_ROWS = env_int("TENZRO_INLINE_COMPUTE_ROWS", 8)
# Largest blob this node fetches from a peer, in bytes.
TENZRO_BLOB_MAX_BYTES = env_int("TENZRO_BLOB_MAX_BYTES", 4 * 1024**3)
# A blob no provider announces (a gate, or experts prepared but not loaded yet) is asked of at most this
# many other providers of the gossip view over their QUIC door, lowest latency first.
TENZRO_BLOB_ASK_PROVIDERS = env_int("TENZRO_BLOB_ASK_PROVIDERS", 8)
# Blobs younger than this are never garbage-collected (a job may not have recorded them yet).
TENZRO_BLOB_GC_MIN_AGE_S = env_int("TENZRO_BLOB_GC_MIN_AGE_S", 600)
# A blob nothing names any more (its expert unloaded here) is kept this long after the unload, so
# peers can still fetch it: the last holder of an expert may have just dropped it.
TENZRO_BLOB_GRACE_S = env_int("TENZRO_BLOB_GRACE_S", 86400)
# Seconds a prepare job's lock lives without progress (renewed after every expert).
TENZRO_PREPARE_LOCK_TTL_S = env_int("TENZRO_PREPARE_LOCK_TTL_S", 120)
# Dashboard pushes of a running prepare job's progress: at most one per this many seconds per job
# (state changes always push).
TENZRO_PREPARE_PUSH_INTERVAL_S = env_float("TENZRO_PREPARE_PUSH_INTERVAL_S", 0.5)
REDIS_URL = env_str("REDIS_URL", DEFAULT_REDIS_URL)

SECRET_KEY = env_str("DJANGO_SECRET_KEY", "") or read_or_create_secret(TENZRO_DATA_DIR / "django.secret",
                                                                                    nbytes=48)
DEBUG = env_bool("DJANGO_DEBUG", False)
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "ninja",
    "apps.api",
    "apps.node",
    "apps.governance",
    "apps.worker",
    "apps.providers",
    "apps.reputation",
    "apps.settlement",
    "apps.forward",
    "apps.generation",
    "apps.receipts",
    "apps.repair",
    "apps.blobs",
    "apps.catalog",
    "apps.serving",
    "apps.dashboard",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "apps.api.metrics_middleware.RequestMetricsMiddleware",
    "apps.api.static_files.StaticFilesMiddleware",  # WhiteNoise, async capable
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "tenzro_site.urls"
ASGI_APPLICATION = "tenzro_site.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "apps.dashboard.context.dashboard",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(
        env_str("DATABASE_URL", f"sqlite:///{TENZRO_DATA_DIR / SQLITE_FILE}"),
        conn_max_age=env_int("DATABASE_CONN_MAX_AGE", 0),
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Several processes of one node share the SQLite file: wait on locks instead of failing,
    # and use WAL so readers never block the writer.
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
AUTH_PASSWORD_VALIDATORS: list[dict] = []
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# Serve straight from the apps' static folders: no collectstatic step before `make run`.
WHITENOISE_USE_FINDERS = True
# A JSON-RPC body up to TENZRO_RPC_MAX_BYTES is read into memory, never spooled to a temp file
# (Django's ASGI handler spools bodies above FILE_UPLOAD_MAX_MEMORY_SIZE, 2.5 MB by default).
DATA_UPLOAD_MAX_MEMORY_SIZE = TENZRO_RPC_MAX_BYTES
FILE_UPLOAD_MAX_MEMORY_SIZE = TENZRO_RPC_MAX_BYTES

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        # redis-py 8 reads with a 5 s socket timeout by default, the same as channels_redis's
        # blocking-pop timeout: raise it so an idle receive never reads as a Redis failure.
        # After a Redis restart every pooled connection is dead, and redis-py's async client does
        # not retry by default: the first send on each would fail ("Connection closed by server"),
        # losing a worker's answer. One retry on a fresh connection makes a restart invisible.
        "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 30, "retry_on_error": [RedisConnectionError]}],
                   "capacity": 1000, "expiry": 60},
    }
}

CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = REDIS_URL
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_TIME_LIMIT = env_int("CELERY_TASK_TIME_LIMIT", 3600)
CELERY_TASK_SOFT_TIME_LIMIT = env_int("CELERY_TASK_SOFT_TIME_LIMIT", 3300)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_TASK_ROUTES = {"tenzro.catalog.prepare": {"queue": PREPARE_QUEUE}}
CELERY_BEAT_SCHEDULE = {
    "node-heartbeat": {"task": "tenzro.node.heartbeat", "schedule": env_int("TENZRO_HEARTBEAT_S", 10)},
    # Open dashboards get the process list pushed this often (apps/node/services.py), never polled.
    "dashboard-processes": {"task": "tenzro.node.processes_announce",
                            "schedule": env_float("TENZRO_DASHBOARD_PROCESSES_S", 3.0)},
    "gossip-round": {"task": "tenzro.providers.gossip_round", "schedule": TENZRO_GOSSIP_INTERVAL_S},
    # The repair interval is the governance policy's, read at every tick (apps/repair/services.py).
    "repair-tick": {"task": "tenzro.repair.tick", "schedule": TENZRO_REPAIR_TICK_S},
    "settlement-sweep": {"task": "tenzro.settlement.sweep", "schedule": TENZRO_SETTLEMENT_SWEEP_S},
    "receipts-prune": {"task": "tenzro.receipts.prune", "schedule": 3600.0},
}

# Every process of a node logs through one redacting handler (core/logs.py): text by
# default, one JSON object per line with TENZRO_LOG_FORMAT=json.
# A folder: the expert worker's event loop is cProfiled between two SIGUSR1 (docs/operations.md "Profiling a node").
TENZRO_PROFILE_DIR = env_str("TENZRO_PROFILE_DIR", "")
LOGGING = logging_config(level=env_str("TENZRO_LOG_LEVEL", "INFO"), fmt=env_str("TENZRO_LOG_FORMAT", "text"))
