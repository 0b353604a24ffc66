"""One settings object for every component.

Each option has one name, spelled three ways: the flag `--idle-threshold-percent`, the
environment variable `GPUWM_IDLE_THRESHOLD_PERCENT`, and the Helm value
`idleThresholdPercent`. Flags win over the environment, which wins over the defaults.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Annotated, Any, Literal, get_args, get_origin

import yaml
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


#: DESIGN §3: a workload is active on a GPU at or above this utilisation (`idleThresholdPercent`); the one
#: place the default is written (the engine, the agent, the simulator and every verb read it from here)
DEFAULT_IDLE_THRESHOLD_PERCENT = 1.0


def parse_duration_seconds(value: object) -> float:
    """Seconds from `15s`, `1m30s`, `7d`, `250ms` or a bare number of seconds."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as 15s, 5m or 7d, got {value!r}")
    if isinstance(value, int | float):
        return float(value)
    text = str(value).strip().lower()
    try:
        return float(text)
    except ValueError:
        pass
    position, total = 0, 0.0
    for match in _DURATION_PART.finditer(text):
        if match.start() != position:
            break
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        position = match.end()
    if position != len(text) or not text:
        raise ValueError(f"expected a duration such as 15s, 5m or 7d, got {value!r}")
    return total


def format_duration(seconds: float) -> str:
    """`parse_duration_seconds`' spelling of `seconds`: 7d, 2m, 1m30s, 1.5s, 250ms; `0s` for none."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    if seconds != int(seconds):
        return f"{seconds:g}s"
    parts, rest = [], int(seconds)
    for unit in ("d", "h", "m", "s"):
        count, rest = divmod(rest, int(_DURATION_UNITS[unit]))
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


def parse_listen(listen: str, flag: str = "--listen", example_port: int = 9400) -> tuple[str, int]:
    """`HOST:PORT` (IPv6 as `[::1]:8080`) -> (host, port); raises ValueError naming the option `flag`."""
    host, separator, port = listen.rpartition(":")
    if not separator or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{flag} {listen!r}: expected HOST:PORT such as 0.0.0.0:{example_port}")
    return host.strip("[]") or "0.0.0.0", int(port)


def _split_list(value: object) -> object:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def _empty_is_none(value: object) -> object:
    return None if value == "" else value


DurationSeconds = Annotated[float, BeforeValidator(parse_duration_seconds), Field(ge=0)]
CommaList = Annotated[list[str], NoDecode, BeforeValidator(_split_list)]

DEFAULT_RESOURCE_NAMES = ["nvidia.com/gpu", "nvidia.com/mig-*", "nvidia.com/gpu.shared"]

#: the workload objects watched by default: built-in kinds with their version, CRDs by group and kind
#: alone, so whichever version the cluster's operator serves as preferred is watched
DEFAULT_WORKLOAD_KINDS = [
    "batch/v1/Job", "batch/v1/CronJob", "jobset.x-k8s.io/JobSet",
    "kubeflow.org/PyTorchJob", "kubeflow.org/TFJob", "kubeflow.org/MPIJob", "kubeflow.org/XGBoostJob",
    "kubeflow.org/PaddleJob", "trainer.kubeflow.org/TrainJob", "ray.io/RayJob", "ray.io/RayCluster",
    "apps/v1/Deployment", "apps/v1/StatefulSet", "leaderworkerset.x-k8s.io/LeaderWorkerSet",
    "serving.kserve.io/InferenceService", "kueue.x-k8s.io/Workload",
]
#: GROUP/VERSION/Kind, GROUP/Kind (the preferred version) or VERSION/Kind (the core group)
_WORKLOAD_KIND = re.compile(r"^(?:[a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?(?:v[0-9]+(?:(?:alpha|beta)[0-9]+)?/)?[A-Z][A-Za-z0-9]*$")


#: a Kubernetes label key: an optional DNS-subdomain prefix and "/", then a name of at most 63 characters
_LABEL_KEY = re.compile(
    r"^(?:[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


def _check_label_key(key: str) -> str:
    """Empty (no label) or a key a pod label can have: a typo would otherwise leave the label empty silently."""
    prefix, _, name = key.rpartition("/")
    if key and (not _LABEL_KEY.match(key) or len(name) > 63 or len(prefix) > 253):
        raise ValueError(f"{key!r} is not a Kubernetes label key ([prefix/]name, e.g. user or runai/user)")
    return key


def _check_networks(addresses: list[str]) -> list[str]:
    """Each an IP address or network (CIDR): a host name or a typo would trust nobody, or everybody."""
    for text in addresses:
        try:
            ipaddress.ip_network(text, strict=False)
        except ValueError:
            raise ValueError(f"{text!r} is not an IP address or network (e.g. 10.0.0.7 or 10.0.0.0/24)") from None
    return addresses


def _check_workload_kinds(kinds: list[str]) -> list[str]:
    for text in kinds:
        if "/" not in text or not _WORKLOAD_KIND.match(text):
            raise ValueError(f"workload kind {text!r} is not GROUP/VERSION/Kind, GROUP/Kind or VERSION/Kind "
                             "(e.g. batch/v1/Job, kubeflow.org/PyTorchJob)")
    return kinds


def _object_text(value: object) -> object:
    """A nested option given as text (a flag or a GPUWM_ variable): JSON or YAML; an empty text is the default."""
    if not isinstance(value, str):
        return value
    if not value.strip():
        return {}
    try:
        return yaml.safe_load(value)
    except yaml.YAMLError as error:
        raise ValueError(f"expected a JSON or YAML object, got {value!r} ({error.__class__.__name__})") from None


class _CamelSettings(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class GpuModelPrice(_CamelSettings):
    """The price of one GPU-hour of the GPU models whose product name matches `model`."""

    model: str = Field(min_length=1, description="GPU product name, or a glob such as 'NVIDIA A100*' (any case).")
    price_per_gpu_hour: float = Field(ge=0, allow_inf_nan=False, description="Price of a whole GPU for an hour.")


class NodeLabelPrice(_CamelSettings):
    """The price of one GPU-hour of the GPUs on nodes with a label (spot nodes, a reserved pool)."""

    label: str = Field(min_length=1, description="KEY=VALUE, or KEY for any value.")
    price_per_gpu_hour: float = Field(ge=0, allow_inf_nan=False, description="Price of a whole GPU for an hour.")


class PricingSettings(_CamelSettings):
    """What a GPU-hour and a kWh cost; a device's units (a MIG slice's fraction, a time-sliced replica's
    1/replicas) take that share of its GPU's price. Node labels are checked first, then GPU models in
    order, then the default; unpriced when none applies."""

    currency: str = Field(default="USD", min_length=1, description="Currency the prices are in (a label only).")
    default_price_per_gpu_hour: float | None = Field(
        default=None, ge=0, allow_inf_nan=False, description="Price of a GPU-hour where no rule matches; unset: unpriced."
    )
    gpu_models: list[GpuModelPrice] = Field(default_factory=list, description="Prices by GPU product name, in order.")
    node_labels: list[NodeLabelPrice] = Field(default_factory=list, description="Prices by node label, in order.")
    energy_price_per_kwh: float = Field(default=0.0, ge=0, allow_inf_nan=False, description="Price of a kWh of GPU energy.")

    @property
    def enabled(self) -> bool:
        """Whether any price is set: without one no cost is reported."""
        return bool(self.default_price_per_gpu_hour is not None or self.gpu_models or self.node_labels
                    or self.energy_price_per_kwh)


IdlePolicyActionType = Literal["warn", "scaleToZero", "suspend", "delete"]
_DEFAULT_ACTIONS: tuple[IdlePolicyActionType, ...] = ("warn", "scaleToZero", "suspend")


class IdlePoliciesSettings(_CamelSettings):
    """Whether the controller acts on GPUIdlePolicy and ClusterGPUIdlePolicy objects, and with which actions
    (the chart grants the rights for exactly these)."""

    enabled: bool = Field(default=False, description="Watch idle policies and act on them.")
    actions: list[IdlePolicyActionType] = Field(
        default_factory=lambda: list(_DEFAULT_ACTIONS),
        description="Action types policies may use; delete only when listed here and named in a policy.",
    )
    webhooks: bool = Field(
        default=False, description="Warn through webhooks whose URL a Secret in the controller's namespace holds."
    )


class Settings(BaseSettings):
    """Every gpuwm option; each verb reads the ones it needs."""

    model_config = SettingsConfigDict(env_prefix="GPUWM_", extra="forbid", validate_default=True)

    # logging
    log_format: Literal["auto", "json", "text"] = Field(
        default="auto", description="Log format: json in a cluster, text in a terminal, auto picks by TTY."
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(default="info", description="Log level.")

    # accounting (shared by replay, controller, demo)
    interval: DurationSeconds = Field(
        default=1.0, description="The agents' poll interval; a sample interval over 3x this is unmonitored."
    )
    idle_threshold_percent: float = Field(
        default=DEFAULT_IDLE_THRESHOLD_PERCENT, ge=0, le=100,
        description="A workload is active on a GPU at or above this utilisation.",
    )
    project_label: str = Field(default="gpuwm.io/project", description="Label on pod or namespace naming the project.")
    late_event_window: DurationSeconds = Field(
        default=120.0, description="How late a sample or pod event may arrive and still be placed exactly."
    )

    # agent
    listen: str = Field(default="0.0.0.0:9400", description="HOST:PORT the HTTP server listens on.")
    node_name: str | None = Field(
        default=None, validation_alias="NODE_NAME", description="Node the agent runs on (env NODE_NAME)."
    )
    pod_resources_socket: str = Field(
        default="/var/lib/kubelet/pod-resources/kubelet.sock", description="kubelet pod-resources unix socket."
    )
    kubelet_url: str | None = Field(default=None, description="kubelet URL for the stats summary (optional).")
    proc_root: str = Field(default="/proc", description="Where the host's /proc is mounted (cgroup fallback).")
    kubelet_token_file: str = Field(
        default="/var/run/secrets/kubernetes.io/serviceaccount/token",
        description="Bearer token for the kubelet stats summary (re-read on each call; tokens rotate).",
    )
    kubelet_insecure_tls: bool = Field(
        default=False, description="Skip kubelet TLS verification (self-signed kubelet serving certificates)."
    )
    resource_names: CommaList = Field(
        default_factory=lambda: list(DEFAULT_RESOURCE_NAMES), description="Extended resource names that are GPUs."
    )
    snapshot_buffer_samples: int = Field(
        default=100_000, ge=100, description="Samples the agent keeps for /v1/snapshot pulls."
    )
    nvml_buffer_read_seconds: DurationSeconds = Field(
        default=5.0, le=60.0,
        description="How often the agent reads NVML's utilisation sample buffers (milliseconds of driver CPU a call): "
        "each read is split into the polls since by the samples' timestamps, so a poll's sample leaves the agent up to "
        "this late; keep it under half of what the driver's buffers hold. The energy counter is read "
        "with these reads once a minute and on every change of a GPU's holders, carried forward by power in between.",
    )

    # controller
    namespace: str | None = Field(default=None, description="Watch one namespace; cluster-wide when unset.")
    status_interval: DurationSeconds = Field(default=15.0, description="How often CR status is refreshed.")
    snapshot_merge: DurationSeconds = Field(
        default=15.0,
        description="Longest run of an agent's polls sent as one sample where the accounting cannot tell them apart "
        "(every holder busy, or idle, throughout); 0: every poll.",
    )
    retention: DurationSeconds = Field(default=7 * 86400.0, description="How long a finished workload's CR is kept.")
    agents: str = Field(
        default="pods:gpuwm/app.kubernetes.io/component=agent",
        description="Agent discovery: pods:NAMESPACE/LABELSELECTOR or static:NODE=URL,...",
    )
    store: str = Field(default="/var/lib/gpuwm/gpuwm.db", description="Embedded SQLite path or a Prometheus URL.")
    state_save_interval: DurationSeconds = Field(
        default=120.0,
        description="How often the controller saves its engine state for a restart, which re-reads the agents from the saved positions (so nothing is lost while the agents still hold those samples, snapshotBufferSamples).",
    )
    state_secret: str = Field(
        default="",
        description="Secret in the controller's namespace (POD_NAMESPACE) where the leading replica keeps its engine "
        "state, compressed, each time it saves it and when it stops: a replica in another pod (a standby taking "
        "over, a deleted pod made again) restores it and loses nothing; empty: the state file alone, which goes "
        "with the pod's volume. States over about 900 KiB compressed are not kept there (use a volume).",
    )
    idle_condition_after: DurationSeconds = Field(default=600.0, description="Idle this long sets condition Idle.")
    underutilized_percent: float = Field(
        default=20.0, ge=0, le=100, description="avg1h below this sets condition Underutilized."
    )
    status_writes_per_second: float = Field(default=20.0, gt=0, description="Token-bucket limit on status writes.")
    status_counters_refresh: DurationSeconds = Field(
        default=300.0, gt=0,
        description="Longest a GPUWorkloadMetrics' cumulative figures (GPU-seconds, energy, utilisation windows) go unwritten while they move: a CR written this long ago is refreshed before the others (state changes go first in any case). Holds while running workloads <= statusWritesPerSecond x this.",
    )
    time_sliced_replicas: int = Field(
        default=4, ge=1, description="Replicas per GPU for shared resources when the device plugin config is unknown."
    )
    device_plugin_config: Annotated[str | None, BeforeValidator(_empty_is_none)] = Field(
        default=None,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-a-z0-9.]*[a-z0-9])?(/[-._a-zA-Z0-9]+)?$",
        description="NVIDIA device plugin ConfigMap NAMESPACE/NAME[/DEFAULT-KEY] with sharing.timeSlicing replicas, "
        "read for nodes without the nvidia.com/gpu.replicas label.",
    )
    workload_kinds: Annotated[CommaList, AfterValidator(_check_workload_kinds)] = Field(
        default_factory=lambda: list(DEFAULT_WORKLOAD_KINDS),
        description="Workload objects watched for queued and pending workloads and their requested GPUs, as "
        "GROUP/VERSION/Kind or GROUP/Kind (the served preferred version); kinds not installed are skipped until "
        "their CRD appears. The chart grants get/list/watch on each.",
    )
    standalone: bool = Field(default=False, description="Run without kopf peering (one replica only).")
    liveness: str | None = Field(
        default=None, description="kopf liveness endpoint, e.g. http://0.0.0.0:8081/healthz (off when unset)."
    )
    peering_name: str = Field(
        default="gpuwm",
        description="kopf peering object the controller replicas share (ClusterKopfPeering; KopfPeering with --namespace).",
    )
    peering_priority: Annotated[int | None, BeforeValidator(_empty_is_none)] = Field(
        default=None,
        description="kopf peering priority of this replica: the live replica with the highest one leads, the others "
        "wait. Unset: derived from the replica's start (minus its start time in microseconds), so the longest-running "
        "replica leads and a new one never takes over from a live leader; any number >= 0 outranks those (a "
        "developer's controller, as kopf's --dev). Replicas with the same priority all pause (kopf's rule).",
    )

    idle_policies: Annotated[IdlePoliciesSettings, NoDecode, BeforeValidator(_object_text)] = Field(
        default_factory=IdlePoliciesSettings,
        description="Idle policies (GPUIdlePolicy, ClusterGPUIdlePolicy): {enabled, actions, webhooks} as JSON or YAML.",
    )
    pricing: Annotated[PricingSettings, NoDecode, BeforeValidator(_object_text)] = Field(
        default_factory=PricingSettings,
        description="GPU prices: {currency, defaultPricePerGpuHour, gpuModels: [{model, pricePerGpuHour}], "
        "nodeLabels: [{label, pricePerGpuHour}], energyPricePerKwh} as JSON or YAML; no price: no cost reported.",
    )

    # API
    auth: Literal["kubernetes", "none"] = Field(default="kubernetes", description="API authentication.")
    api_listen: str = Field(default="0.0.0.0:8080", description="HOST:PORT of the metrics API.")
    api_tls: bool = Field(
        default=True,
        description="Serve the metrics API over HTTPS (bearer tokens must not cross the network in clear); "
        "false: plain HTTP, for local use on 127.0.0.1 only.",
    )
    api_tls_cert_file: str = Field(
        default="",
        description="PEM certificate (chain) of the API's HTTPS; empty: a self-signed one made at start, kept in memory.",
    )
    api_tls_key_file: str = Field(default="", description="PEM private key of apiTlsCertFile.")
    api_tls_secret: str = Field(
        default="",
        description="Without apiTlsCertFile: the Secret (kubernetes.io/tls, in the controller's own namespace, "
        "POD_NAMESPACE) where the controller keeps the CA and certificate it makes, reused at every start so "
        "clients can verify the API with its ca.crt; empty: a self-signed certificate made at each start, in memory.",
    )
    api_tls_dns_names: CommaList = Field(
        default_factory=list,
        description="Names the certificate kept in apiTlsSecret is made for (the API Service's DNS names; "
        "a kept certificate that lacks one is replaced).",
    )
    api_token_audience: str = Field(
        default="gpuwm",
        min_length=1,
        description="Audience a bearer token must be issued for (kubectl create token --audience gpuwm ...); "
        "checked by the TokenReview, so a token meant for another service is refused.",
    )
    api_max_points_per_response: int = Field(
        default=2_000_000,
        ge=1,
        description="Most points (series x points per series) one time-series answer may hold; a larger query "
        "is refused with 400 before the store is read.",
    )
    api_max_concurrent_queries: int = Field(
        default=4,
        ge=1,
        description="Queries (lists, time series, reports) the API answers at once, half of them at most (rounded "
        "up) heavy time series (over a twentieth of apiMaxPointsPerResponse), all but one of those for one user; "
        "more wait their turn in a queue. The probes and /metrics are not queries: they never wait.",
    )
    api_max_concurrent_queries_per_user: int = Field(
        default=2,
        ge=1,
        description="Queries one user (the identity its token names) has answered at once; more of theirs wait, "
        "and waiting users are served the one with the fewest running first.",
    )
    api_query_queue_seconds: DurationSeconds = Field(
        default=10.0,
        description="Longest a query waits for its turn; past it the API answers 429 with Retry-After.",
    )
    api_auth_cache_entries: int = Field(
        default=10_000, ge=1, description="Token and access-review results the API keeps (least recently used go first)."
    )
    api_auth_reviews_per_client_per_second: float = Field(
        default=10.0,
        gt=0,
        description="TokenReviews and SubjectAccessReviews one client address may cause per second (a burst of 5 s "
        "worth); past it the API answers 429.",
    )
    api_token_reviews_per_second: float = Field(
        default=50.0,
        gt=0,
        description="TokenReviews the API sends per second, all clients together (a burst of 5 s worth); past it a "
        "token not reviewed lately gets 429, while tokens reviewed lately go on from the cache.",
    )
    api_trusted_proxies: Annotated[CommaList, AfterValidator(_check_networks)] = Field(
        default_factory=list,
        description="IP addresses or networks (CIDR) of proxies in front of the API whose X-Forwarded-For header "
        "names the client; from any other peer the header is ignored and the peer is the client (the review "
        "rates are per client); empty: trust none.",
    )
    runai_compatible_metrics: bool = Field(default=False, description="Also export Run:ai-compatible metric names.")
    cluster_id: str = Field(
        default="",
        description="clusterId label on the Run:ai-compatible metrics (your Run:ai cluster UUID, where dashboards filter on it).",
    )
    runai_user_label: Annotated[str, AfterValidator(_check_label_key)] = Field(
        default="",
        description="Pod label whose value fills the user label of the Run:ai-compatible workload metrics (e.g. user); "
        "empty: user stays empty.",
    )
    store_rollups: CommaList = Field(
        default_factory=lambda: ["15s:2d", "5m:30d"],
        description="Embedded store tiers STEP:KEEP, finest first: data older than a tier's KEEP is only in coarser tiers.",
    )
    store_latest_rows_per_interval: int = Field(
        default=1000, ge=1,
        description="Most running workloads' latest-figures rows the embedded store rewrites per status interval, longest unwritten first (new, changed-phase and finished ones always); the API's current figures of a running workload are then at most ceil(running workloads / this) intervals old.",
    )

    @classmethod
    def helm_value_name(cls, field_name: str) -> str:
        """The Helm value for a field: `idle_threshold_percent` -> `idleThresholdPercent`."""
        return to_camel(field_name)

    @classmethod
    def flag_name(cls, field_name: str) -> str:
        return "--" + field_name.replace("_", "-")


class ConfigError(ValueError):
    """An option with a bad value; `gpuwm` prints it and exits with status 2."""


def add_command(
    subparsers: Any,
    verb: str,
    *,
    summary: str,
    description: str,
    handler: Callable[[argparse.Namespace], int],
    settings: Iterable[str] = (),
) -> argparse.ArgumentParser:
    """The parser of `gpuwm VERB`: `summary` is its line in `gpuwm --help`, `description` its paragraph, and
    `handler` runs it with the parsed arguments; it takes a `--flag` per field named in `settings`, and the
    verb adds its own arguments to the parser returned."""
    parser: argparse.ArgumentParser = subparsers.add_parser(verb, help=summary, description=description)
    add_settings_arguments(parser, settings)
    parser.set_defaults(handler=handler)
    return parser


def add_settings_arguments(parser: argparse.ArgumentParser, field_names: Iterable[str]) -> None:
    """Add one `--flag` per settings field; unset flags fall back to env and defaults."""
    for name in field_names:
        field = Settings.model_fields[name]
        help_text = settings_help(name)
        if field.annotation is bool:
            # `--api-tls`, `--api-tls=false` and `--no-api-tls` all work (the docs write `--flag=false`)
            parser.add_argument(
                Settings.flag_name(name), dest=name, nargs="?", const=True, default=None, type=_flag_bool,
                metavar="true|false", help=help_text,
            )
            parser.add_argument(
                "--no-" + Settings.flag_name(name).removeprefix("--"), dest=name, action="store_const", const=False,
                help=argparse.SUPPRESS,
            )
        else:
            choices = get_args(field.annotation) if get_origin(field.annotation) is Literal else ()
            parser.add_argument(Settings.flag_name(name), dest=name, default=None, help=help_text,
                                metavar="{" + ",".join(map(str, choices)) + "}" if choices else None)


def settings_help(name: str) -> str:
    """A flag's help: what it is, its choices, its default and its environment variable, so `--help` alone
    answers "what may I write and what happens if I do not" (argparse's % escaped)."""
    field = Settings.model_fields[name]
    parts = [field.description or ""]
    if get_origin(field.annotation) is Literal:
        parts.append("one of " + ", ".join(str(choice) for choice in get_args(field.annotation)))
    default = field.get_default(call_default_factory=True)
    if isinstance(default, bool):
        shown = "true" if default else "false"
    elif isinstance(default, float) and any(getattr(rule, "func", None) is parse_duration_seconds
                                            for rule in field.metadata):
        shown = format_duration(default)  # as the flag is written: 15s, 2m, 7d
    elif isinstance(default, float):
        shown = f"{default:g}"
    elif isinstance(default, list):
        shown = ",".join(str(item) for item in default) or "none"
    elif default is None or default == "":
        shown = "unset"
    elif isinstance(default, BaseModel):
        shown = json.dumps(default.model_dump(mode="json", by_alias=True), separators=(",", ":"))
    else:
        shown = str(default)
    parts.append(f"default {shown}; env GPUWM_{name.upper()}")
    return (parts[0].rstrip(".") + " (" + "; ".join(parts[1:]) + ").").replace("%", "%%")


def _flag_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def settings_from_arguments(arguments: argparse.Namespace, field_names: Sequence[str]) -> Settings:
    """Build Settings from parsed flags (only those given) over env and defaults.

    Raises ConfigError naming the option's flag and environment variable when a value is invalid.
    """
    given: dict[str, Any] = {
        name: getattr(arguments, name) for name in field_names if getattr(arguments, name, None) is not None
    }
    try:
        return Settings(**given)
    except ValidationError as error:
        messages = []
        for problem in error.errors():
            field = str(problem["loc"][0]) if problem["loc"] else "?"
            messages.append(f"{Settings.flag_name(field)} (env GPUWM_{field.upper()}): {problem['msg']}")
        raise ConfigError("invalid option: " + "; ".join(messages)) from None
