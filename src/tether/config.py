"""Settings from the environment (reference §5), validated once with clear errors."""

from __future__ import annotations

import ipaddress
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from pydantic import ValidationError

from tether.budget import DEFAULT_MAX_LIMITS, Limits, LimitsInput
from tether.errors import ConfigError
from tether.models.pricing import Price, parse_prices
from tether.sealing import Keyring, parse_keys

DEFAULT_DATABASE_URL = "sqlite:///./tether.db"


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Everything configurable; ``from_env`` reads reference §5's variables."""

    database_url: str = DEFAULT_DATABASE_URL
    # Where LISTEN connects (TETHER_LISTEN_DATABASE_URL); None: ``database_url``. Needed,
    # reaching PostgreSQL directly, when ``database_url`` is a transaction pooler's.
    listen_database_url: str | None = None
    model: str | None = None
    sandbox_url: str | None = None
    webhook_url: str | None = None
    heartbeat_timeout_s: float = 90.0
    reaper_interval_s: float = 60.0
    suspension_ttl_min: float = 30.0
    retention_days: float = 30.0
    # How long audit records are kept (reference §19): apart from their runs' retention.
    audit_retention_days: float = 400.0
    max_recovery_attempts: int = 2
    # How deep a tree of sub-agents may grow (reference §18): runs exist at depths 0 to it.
    max_depth: int = 4
    # The limits of a new run that names none; each lowered to ``max_limits`` where higher.
    default_limits: Limits = field(default_factory=Limits)
    # The most any run may have (TETHER_MAX_LIMITS): at a start, a continuation, a fork.
    max_limits: Limits = DEFAULT_MAX_LIMITS
    # How long a store call that met a transient database error (a dropped connection, a
    # restart, a locked SQLite file) is retried before ``database_unavailable``.
    db_retry_s: float = 30.0
    # How long reconciliation keeps asking a downstream it cannot reach before the run is
    # failed ``unreconcilable`` (the run keeps its lease meanwhile).
    reconcile_patience_s: float = 120.0
    # How long the request that carries an approval waits to reconcile an approved write
    # whose answer was lost before it answers ``reconciling`` and hands the run over.
    approval_reconcile_s: float = 10.0
    # How long a suspension notice may take to go out, from the suspension to the webhook's
    # answer; one still undelivered after that (and after the heartbeat timeout) is
    # re-issued by the reaper with a fresh token, and the late one is never sent.
    notice_timeout_s: float = 60.0
    reaper_batch: int = 20
    # How long a run whose start failed (its scope resolver was down) waits before a
    # worker tries it again.
    start_retry_s: float = 5.0
    purge_batch: int = 200
    # A model call that failed transiently (reference §10): the run is handed back for
    # ``model_retry_first_s``, doubling per consecutive failure up to ``model_retry_max_s``;
    # the ``max_model_attempts``-th consecutive failure fails it ``model_unavailable``.
    max_model_attempts: int = 5
    model_retry_first_s: float = 1.0
    model_retry_max_s: float = 300.0
    # Live event streams (reference §11): how often a watcher re-reads a run's events where no
    # notice wakes it (SQLite), and how often an idle stream sends a keep-alive comment.
    watch_poll_s: float = 0.5
    keepalive_s: float = 15.0
    # Older agent versions this process serves beside its agent's own (reference §12,
    # TETHER_ACCEPT_VERSIONS): their runs are claimed, recovered and decided here too.
    accept_versions: tuple[str, ...] = ()
    # Price overrides (TETHER_PRICES) over the built-in table of tether.models.pricing.
    prices: Mapping[str, Price] = field(default_factory=dict)
    # Slow clients (``tether serve``): a request's headers must arrive within
    # ``http_header_timeout_s`` of its first byte (or of the connection), its body within
    # ``http_body_timeout_s`` of the app's first read (else ``408 request_timeout``), and a
    # graceful shutdown waits at most ``shutdown_timeout_s`` for requests in flight.
    # Failed authentications (sign-in form and bearer keys) allowed per client address and
    # per credential within ``auth_window_s``; past them, ``429 too_many_attempts``.
    auth_max_failures: int = 10
    auth_window_s: float = 60.0
    http_header_timeout_s: float = 10.0
    http_body_timeout_s: float = 30.0
    shutdown_timeout_s: int = 30
    # Signs the inbox's session cookies; None: a random secret per process (a restart
    # signs everyone out). Kept out of repr so it never reaches a log line.
    session_secret: str | None = field(default=None, repr=False)
    # The base URL people reach ``serve`` at (TETHER_PUBLIC_URL): every link in a notice,
    # from any process, starts with it. None: ``serve``'s own address, or (a worker, a
    # command) links relative to wherever the inbox is served.
    public_url: str | None = None
    # Whether the log notifier (no webhook) writes each notice's approval link, with its
    # token (TETHER_LOG_APPROVAL_LINKS). Off: the log names the run and the tool only.
    log_approval_links: bool = False
    # Runs of one user carried at once, fleet-wide (TETHER_MAX_ACTIVE_PER_USER, reference
    # §13); None: no limit.
    max_active_per_user: int | None = None
    # The highest priority a user may ask (TETHER_MAX_PRIORITY, -10 to 10, reference §13),
    # unless ``tether users add|set --max-priority`` gave them their own.
    max_priority: int = 0
    # The model's requests and tokens per minute, fleet-wide (reference §13,
    # TETHER_MODEL_RPM / TETHER_MODEL_TPM); None: no limit. ``model_rate_window_s`` is the
    # minute (TETHER_MODEL_RATE_WINDOW_S: for tests, which need a short one).
    model_rpm: int | None = None
    model_tpm: int | None = None
    model_rate_window_s: float = 60.0
    # The proxies whose X-Forwarded-For and X-Forwarded-Proto ``serve`` believes
    # (TETHER_TRUSTED_PROXIES): addresses and CIDR networks, normalised; none by default,
    # so no client can name the address its failed authentications are counted against.
    trusted_proxies: tuple[str, ...] = ()
    # Open event streams (the API's and the inbox's) one user may hold in one process
    # (TETHER_MAX_STREAMS_PER_USER); the next is ``429 too_many_streams``.
    max_streams_per_user: int = 100
    # The keys stored content is sealed with (TETHER_ENCRYPTION_KEYS, reference §20): the
    # first seals, all open; None: nothing is sealed. Kept out of repr.
    keyring: Keyring | None = field(default=None, repr=False)
    # Whether logs (TETHER_LOG_CONTENT) and spans (TETHER_OTEL_CONTENT) may carry content:
    # questions, messages, tool arguments and results, previews (reference §20). Off by default.
    log_content: bool = False
    otel_content: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "default_limits", self.default_limits.at_most(self.max_limits))
        if self.max_model_attempts < 1:
            raise ConfigError(
                f"max_model_attempts must be at least 1, got {self.max_model_attempts}"
            )
        if not 0 < self.model_retry_first_s <= self.model_retry_max_s:
            raise ConfigError(
                "the first model retry delay must be positive and at most "
                f"{self.model_retry_max_s:g}s, got {self.model_retry_first_s:g}s"
            )
        if self.max_priority not in range(-10, 11):
            raise ConfigError(f"max_priority must be from -10 to 10, got {self.max_priority}")
        for name in ("model_rpm", "model_tpm"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be a positive whole number, got {value}")
        if self.max_streams_per_user < 1:
            raise ConfigError(
                f"max_streams_per_user must be at least 1, got {self.max_streams_per_user}"
            )

    @property
    def suspension_ttl_s(self) -> float:
        return self.suspension_ttl_min * 60.0

    @property
    def retention_s(self) -> float:
        return self.retention_days * 86_400.0

    @property
    def audit_retention_s(self) -> float:
        return self.audit_retention_days * 86_400.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Settings from ``env`` (default ``os.environ``); a malformed value is an error
        here, at start-up, never in the middle of a run."""
        env = os.environ if env is None else env
        from tether.failpoints import parse

        parse(env.get("TETHER_FAILPOINTS", ""))  # a typo fails at start-up, not mid-run
        return cls(
            database_url=env.get("TETHER_DATABASE_URL") or DEFAULT_DATABASE_URL,
            listen_database_url=env.get("TETHER_LISTEN_DATABASE_URL") or None,
            model=env.get("TETHER_MODEL") or None,
            sandbox_url=env.get("TETHER_SANDBOX_URL") or None,
            webhook_url=env.get("TETHER_WEBHOOK_URL") or None,
            heartbeat_timeout_s=_positive(env, "TETHER_HEARTBEAT_TIMEOUT_S", 90.0),
            reaper_interval_s=_positive(env, "TETHER_REAPER_INTERVAL_S", 60.0),
            suspension_ttl_min=_positive(env, "TETHER_SUSPENSION_TTL_MIN", 30.0),
            retention_days=_positive(env, "TETHER_RETENTION_DAYS", 30.0),
            audit_retention_days=_positive(env, "TETHER_AUDIT_RETENTION_DAYS", 400.0),
            max_recovery_attempts=int(
                _positive(env, "TETHER_MAX_RECOVERY_ATTEMPTS", 2, whole=True)
            ),
            max_depth=int(_positive(env, "TETHER_MAX_DEPTH", 4, whole=True)),
            db_retry_s=_positive(env, "TETHER_DB_RETRY_S", 30.0),
            notice_timeout_s=_positive(env, "TETHER_NOTICE_TIMEOUT_S", 60.0),
            reconcile_patience_s=_positive(env, "TETHER_RECONCILE_PATIENCE_S", 120.0),
            approval_reconcile_s=_positive(env, "TETHER_APPROVAL_RECONCILE_S", 10.0),
            max_model_attempts=int(_positive(env, "TETHER_MAX_MODEL_ATTEMPTS", 5, whole=True)),
            model_retry_first_s=_positive(env, "TETHER_MODEL_RETRY_FIRST_S", 1.0),
            prices=parse_prices(env.get("TETHER_PRICES", "")),
            max_limits=_max_limits(env.get("TETHER_MAX_LIMITS", "")),
            accept_versions=_versions(env.get("TETHER_ACCEPT_VERSIONS", "")),
            session_secret=env.get("TETHER_SESSION_SECRET") or None,
            public_url=check_public_url(env.get("TETHER_PUBLIC_URL") or None, "TETHER_PUBLIC_URL"),
            log_approval_links=_flag(env, "TETHER_LOG_APPROVAL_LINKS"),
            auth_max_failures=int(_positive(env, "TETHER_AUTH_MAX_FAILURES", 10, whole=True)),
            auth_window_s=_positive(env, "TETHER_AUTH_WINDOW_S", 60.0),
            http_header_timeout_s=_positive(env, "TETHER_HTTP_HEADER_TIMEOUT_S", 10.0),
            http_body_timeout_s=_positive(env, "TETHER_HTTP_BODY_TIMEOUT_S", 30.0),
            shutdown_timeout_s=int(_positive(env, "TETHER_SHUTDOWN_TIMEOUT_S", 30, whole=True)),
            max_active_per_user=_at_most(env, "TETHER_MAX_ACTIVE_PER_USER"),
            max_priority=_priority(env, "TETHER_MAX_PRIORITY"),
            model_rpm=_at_most(env, "TETHER_MODEL_RPM"),
            model_tpm=_at_most(env, "TETHER_MODEL_TPM"),
            model_rate_window_s=_positive(env, "TETHER_MODEL_RATE_WINDOW_S", 60.0),
            trusted_proxies=trusted_proxies(env.get("TETHER_TRUSTED_PROXIES", "")),
            max_streams_per_user=int(
                _positive(env, "TETHER_MAX_STREAMS_PER_USER", 100, whole=True)
            ),
            keyring=parse_keys(env.get("TETHER_ENCRYPTION_KEYS")),
            log_content=_flag(env, "TETHER_LOG_CONTENT"),
            otel_content=_flag(env, "TETHER_OTEL_CONTENT"),
        )


def check_public_url(raw: str | None, source: str) -> str | None:
    """A public URL (``TETHER_PUBLIC_URL`` or ``--public-url``, named by ``source``) without
    its trailing slash: an http(s) URL with a host, else a ``ConfigError`` at start-up."""
    if raw is None:
        return None
    parts = urlsplit(raw.strip())
    try:
        parts.port  # noqa: B018 (a malformed port raises here)
    except ValueError:
        parts = parts._replace(netloc="")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"{source} must be an http(s) URL with a host (e.g. https://tether.example.com), "
            f"got {raw[:200]!r}"
        )
    if parts.query or parts.fragment:
        raise ConfigError(f"{source} must not have a query or a fragment, got {raw[:200]!r}")
    return raw.strip().rstrip("/")


def trusted_proxies(raw: str) -> tuple[str, ...]:
    """``TETHER_TRUSTED_PROXIES``: comma-separated IP addresses or CIDR networks, each
    normalised (``10.0.0.0/8``); one that is neither is a ``ConfigError`` naming it."""
    found: list[str] = []
    for entry in (part.strip() for part in raw.split(",")):
        if not entry:
            continue
        try:
            network = ipaddress.ip_network(entry)
        except ValueError as exc:
            raise ConfigError(
                f"TETHER_TRUSTED_PROXIES: {entry[:80]!r} is not an IP address or a CIDR "
                f"network (such as 10.0.0.5, 10.0.0.0/8 or fd00::/8): {exc}"
            ) from None
        one = network.num_addresses == 1
        found.append(str(network.network_address) if one else str(network))
    return tuple(dict.fromkeys(found))


def _flag(env: Mapping[str, str], name: str) -> bool:
    raw = (env.get(name) or "").strip().lower()
    if raw in ("", "0", "false", "no"):
        return False
    if raw in ("1", "true", "yes"):
        return True
    raise ConfigError(f"{name} must be 1 or 0, got {raw[:40]!r}")


def _max_limits(raw: str) -> Limits:
    """``TETHER_MAX_LIMITS``: a JSON object like a run's limits; a limit it does not name
    keeps its default cap."""
    if not raw.strip():
        return DEFAULT_MAX_LIMITS
    shape = 'TETHER_MAX_LIMITS must be a JSON object such as {"max_spend_usd": 50}'
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"{shape}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{shape}, not {raw.strip()[:40]}")
    try:
        return LimitsInput.model_validate(data).over(DEFAULT_MAX_LIMITS)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
            for err in exc.errors(include_url=False)
        )
        raise ConfigError(f"TETHER_MAX_LIMITS: {problems}") from exc


def _versions(raw: str) -> tuple[str, ...]:
    """``TETHER_ACCEPT_VERSIONS``: comma-separated agent versions, each 1 to 128 characters."""
    versions = tuple(dict.fromkeys(part.strip() for part in raw.split(",") if part.strip()))
    for version in versions:
        if len(version) > 128:
            raise ConfigError(f"TETHER_ACCEPT_VERSIONS: {version[:40]!r}… is over 128 characters")
    return versions


def _at_most(env: Mapping[str, str], name: str) -> int | None:
    """A limit that is off unless set: None, or a positive whole number."""
    if not (env.get(name) or "").strip():
        return None
    return int(_positive(env, name, 0, whole=True))


def _priority(env: Mapping[str, str], name: str) -> int:
    """A priority bound: a whole number from -10 to 10, default 0."""
    raw = (env.get(name) or "").strip()
    if not raw:
        return 0
    try:
        value = int(raw)
    except ValueError:
        value = 11
    if value not in range(-10, 11):
        raise ConfigError(f"{name} must be a whole number from -10 to 10, got {raw[:40]!r}")
    return value


def _positive(env: Mapping[str, str], name: str, default: float, *, whole: bool = False) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw) if whole else float(raw)
    except ValueError as exc:
        kind = "a whole number" if whole else "a number"
        raise ConfigError(f"{name} must be {kind}, got {raw!r}") from exc
    if value < 0 or (value == 0 and name != "TETHER_MAX_RECOVERY_ATTEMPTS"):
        raise ConfigError(f"{name} must be positive, got {raw!r}")
    return value
