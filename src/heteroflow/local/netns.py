"""Pods of a local cluster on addresses of their own: one Linux network namespace per pod, joined by a bridge.

With ``ClusterOptions.network_namespaces`` (``heteroflow up --netns``; root only, iproute2's ``ip``) the
cluster looks like several hosts: each pod's NodeManager and the engines it launches run inside the pod's
namespace, on the pod's own IP, while the platform server, controller, Coordinator and simulated agents stay in
the root namespace and listen on the bridge's address. Pod IPs, the DP master IP and the hardware mapping by
(node, pod ip) then all run on distinct addresses instead of 127.0.0.1.

Layout (:func:`plan_network`, purely computational). The cluster's *tag* is the first
:data:`TAG_LENGTH` hex digits of its id; link names stay within the kernel's 15 characters:

- the bridge ``hf<tag>-br`` in the root namespace, ``<net>.1/24`` on a /24 no address or route of the host
  overlaps (:func:`choose_subnet`);
- pod ``n`` (counted over every instance's pods, in order): namespace ``hf-<tag>-<n>``, a veth pair whose root
  end ``hf<tag>-<n>`` is on the bridge and whose pod end is ``eth0`` inside the namespace at ``<net>.<n+2>/24``,
  ``lo`` up, the default route via the bridge's address.

The shell (:func:`open_network`, :func:`close_network`) runs ``ip`` and keeps a record of what it creates in
``<data_dir>/network.json`` *before* creating it, so that a launcher killed half-way leaves a record the next
``--netns`` start on the same data dir cleans up. Deleting is idempotent: only what still exists is deleted,
veths first (deleting a namespace frees its veth only once the kernel destroys the namespace, asynchronously).
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

TAG_LENGTH = 8
IFNAME_MAX = 15
"""Longest interface name the kernel takes (``IFNAMSIZ`` - 1)."""
POD_END = "eth0"
"""The pod's end of its veth pair, inside its namespace: what a Kubernetes pod sees."""
FIRST_POD_HOST = 2
"""Pod ``n`` is ``<net>.<n+2>``: ``.1`` is the bridge."""
MAX_PODS = 254 - FIRST_POD_HOST + 1
"""Pods one /24 holds (``.2`` … ``.254``)."""
CANDIDATE_RANGES = (
    ipaddress.IPv4Network("10.0.0.0/8"),
    ipaddress.IPv4Network("172.16.0.0/12"),
    ipaddress.IPv4Network("192.168.0.0/16"),
)
"""Private ranges searched for a free /24, in this order."""
_SEARCH_PATHS = ("/usr/sbin", "/sbin", "/usr/bin", "/bin")
"""Where ``ip`` lives when a non-login root shell's PATH lacks the sbin directories."""

Runner = Callable[[Sequence[str]], str]
"""Runs ``ip <args>`` and returns its standard output; raises :class:`NetworkError` when it fails."""


class NetworkError(Exception):
    """The pods' network cannot be used, created or deleted; the text names the ``ip`` command and its error."""


# == the plan (pure) =============================================================================================
def cluster_tag(cluster_id: str) -> str:
    return cluster_id[:TAG_LENGTH]


def bridge_name(tag: str) -> str:
    return f"hf{tag}-br"


def namespace_name(tag: str, index: int) -> str:
    return f"hf-{tag}-{index}"


def veth_name(tag: str, index: int) -> str:
    return f"hf{tag}-{index}"


@dataclass(frozen=True, slots=True)
class PodNetwork:
    """One pod's namespace, the root end of its veth pair, and its address."""

    index: int
    namespace: str
    veth: str
    ip: str


@dataclass(frozen=True, slots=True)
class NetworkPlan:
    bridge: str
    subnet: str
    """``10.x.y.0/24``."""
    gateway: str
    """The bridge's address (``.1``): where the root namespace's services listen."""
    pods: tuple[PodNetwork, ...]

    @property
    def prefix_len(self) -> int:
        return ipaddress.IPv4Network(self.subnet).prefixlen


def plan_network(cluster_id: str, pods: int, subnet: ipaddress.IPv4Network) -> NetworkPlan:
    """Names and addresses of one cluster's bridge and ``pods`` pod namespaces on ``subnet`` (a /24)."""
    if subnet.prefixlen != 24:
        raise NetworkError(f"the pods' subnet must be a /24, not {subnet}")
    if not 1 <= pods <= MAX_PODS:
        raise NetworkError(f"{pods} pods do not fit one /24 (1 to {MAX_PODS})")
    tag = cluster_tag(cluster_id)
    hosts = list(subnet.hosts())  # .1 … .254
    plan = NetworkPlan(
        bridge=bridge_name(tag),
        subnet=str(subnet),
        gateway=str(hosts[0]),
        pods=tuple(
            PodNetwork(
                index=n,
                namespace=namespace_name(tag, n),
                veth=veth_name(tag, n),
                ip=str(hosts[n + FIRST_POD_HOST - 1]),
            )
            for n in range(pods)
        ),
    )
    too_long = [name for name in (plan.bridge, *(p.veth for p in plan.pods)) if len(name) > IFNAME_MAX]
    if too_long:
        raise NetworkError(f"interface names longer than {IFNAME_MAX} characters: {too_long}")
    return plan


def used_networks(addresses_json: str, routes_json: str) -> list[ipaddress.IPv4Network]:
    """IPv4 networks the host already has: every address's network (``ip -j addr show``) and every route's
    destination but the default (``ip -j route show``). A /24 of ours must overlap none of them: an overlap
    would take the host's traffic for those addresses onto our bridge."""
    found: list[ipaddress.IPv4Network] = []
    for link in _json_list(addresses_json):
        for info in link.get("addr_info", []) if isinstance(link, dict) else []:
            if isinstance(info, dict) and info.get("family") == "inet" and "local" in info:
                with contextlib.suppress(ValueError):
                    found.append(ipaddress.IPv4Network(f"{info['local']}/{info.get('prefixlen', 32)}", strict=False))
    for route in _json_list(routes_json):
        dst = route.get("dst") if isinstance(route, dict) else None
        if isinstance(dst, str) and dst != "default":
            with contextlib.suppress(ValueError):
                found.append(ipaddress.IPv4Network(dst, strict=False))
    return found


def choose_subnet(cluster_id: str, used: Iterable[ipaddress.IPv4Network]) -> ipaddress.IPv4Network:
    """A /24 of a private range that overlaps nothing in ``used``. The search starts at a point derived from
    the cluster id, so two clusters started at the same moment almost never try the same /24 first."""
    taken = list(used)
    seed = int(hashlib.sha256(cluster_id.encode()).hexdigest(), 16)
    for space in CANDIDATE_RANGES:
        count = 2 ** (24 - space.prefixlen)
        start = seed % count
        for step in range(count):
            offset = (start + step) % count
            candidate = ipaddress.IPv4Network((int(space.network_address) + offset * 256, 24))
            if not any(candidate.overlaps(net) for net in taken):
                return candidate
    raise NetworkError("no free /24 in 10.0.0.0/8, 172.16.0.0/12 or 192.168.0.0/16 on this host")


def exec_prefix(ip: str, namespace: str) -> tuple[str, ...]:
    """What runs a command inside ``namespace``: ``ip netns exec`` replaces itself with the command (same pid),
    and everything the command starts inherits the namespace."""
    return (ip, "netns", "exec", namespace)


def unavailable_reason(*, euid: int, ip: str | None, platform: str = sys.platform) -> str | None:
    """Why network namespaces cannot be used here, or ``None`` when they can."""
    if not platform.startswith("linux"):
        return f"network namespaces are Linux only (this is {platform})"
    if euid != 0:
        return "network namespaces need root (creating namespaces, a bridge and veth pairs needs CAP_NET_ADMIN)"
    if ip is None:
        return "`ip` (iproute2) was not found on PATH or in /usr/sbin or /sbin"
    return None


# == the record of what was created ==============================================================================
class NetworkRecord(BaseModel):
    """``<data_dir>/network.json``: what one launcher creates, written before it is created."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    cluster_id: str
    owner_pid: int = Field(description="The launcher that created it.")
    owner_start_ticks: int | None = Field(description="Its start time (``/proc/<pid>/stat``): a reused pid differs.")
    bridge: str
    subnet: str
    gateway: str
    namespaces: list[str]
    veths: list[str]


def record_of(cluster_id: str, plan: NetworkPlan, *, owner_pid: int, owner_start_ticks: int | None) -> NetworkRecord:
    return NetworkRecord(
        cluster_id=cluster_id,
        owner_pid=owner_pid,
        owner_start_ticks=owner_start_ticks,
        bridge=plan.bridge,
        subnet=plan.subnet,
        gateway=plan.gateway,
        namespaces=[p.namespace for p in plan.pods],
        veths=[p.veth for p in plan.pods],
    )


def read_record(path: Path) -> NetworkRecord | None:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise NetworkError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        return NetworkRecord.model_validate_json(text)
    except ValidationError as exc:
        raise NetworkError(f"{path} is not a local cluster's network record; remove it by hand") from exc


def write_record(path: Path, record: NetworkRecord) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record.model_dump(mode="json"), indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


# == the shell ===================================================================================================
def find_ip() -> str | None:
    """The ``ip`` executable: on PATH, else in the sbin directories."""
    return shutil.which("ip") or shutil.which("ip", path=os.pathsep.join(_SEARCH_PATHS))


def ip_runner(ip: str) -> Runner:
    """Runs the real ``ip``; a failure becomes :class:`NetworkError` with the command and its stderr."""

    def run(args: Sequence[str]) -> str:
        command = [ip, *args]
        try:
            done = subprocess.run(command, check=True, capture_output=True, text=True, timeout=30)  # noqa: S603
        except subprocess.CalledProcessError as exc:
            reason = (exc.stderr or exc.stdout or "").strip() or f"exit code {exc.returncode}"
            raise NetworkError(f"`ip {' '.join(args)}` failed: {reason}") from exc
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise NetworkError(f"`ip {' '.join(args)}` could not run: {exc}") from exc
        return done.stdout

    return run


def create(plan: NetworkPlan, run: Runner) -> None:
    """The bridge, then each pod's namespace and veth pair, addresses, ``lo`` and the default route."""
    # nf_call_*=0: bridged pod-to-pod traffic never meets the host firewall's FORWARD chain (br_netfilter),
    # whose policy is DROP wherever Docker runs
    run(["link", "add", plan.bridge, "type", "bridge", "nf_call_iptables", "0", "nf_call_ip6tables", "0",
         "nf_call_arptables", "0"])  # fmt: skip
    run(["addr", "add", f"{plan.gateway}/{plan.prefix_len}", "dev", plan.bridge])
    run(["link", "set", plan.bridge, "up"])
    for pod in plan.pods:
        ns = pod.namespace
        run(["netns", "add", ns])
        run(["link", "add", pod.veth, "type", "veth", "peer", "name", POD_END, "netns", ns])
        run(["link", "set", pod.veth, "master", plan.bridge])
        run(["link", "set", pod.veth, "up"])
        run(["-n", ns, "addr", "add", f"{pod.ip}/{plan.prefix_len}", "dev", POD_END])
        run(["-n", ns, "link", "set", POD_END, "up"])
        run(["-n", ns, "link", "set", "lo", "up"])
        run(["-n", ns, "route", "add", "default", "via", plan.gateway])


def delete(record: NetworkRecord, run: Runner) -> list[str]:
    """Delete whatever of ``record`` still exists: veths, namespaces, then the bridge. Returns what could not be
    deleted (one line each); an empty list means nothing of it is left."""
    failures: list[str] = []
    try:
        links = {link.get("ifname") for link in _json_list(run(["-j", "link", "show"])) if isinstance(link, dict)}
        namespaces = {ns.get("name") for ns in _json_list(run(["-j", "netns", "list"])) if isinstance(ns, dict)}
    except NetworkError as exc:
        return [str(exc)]
    steps = [
        *(["link", "del", veth] for veth in record.veths if veth in links),
        *(["netns", "del", ns] for ns in record.namespaces if ns in namespaces),
        *([["link", "del", record.bridge]] if record.bridge in links else []),
    ]
    for step in steps:
        try:
            run(step)
        except NetworkError as exc:
            failures.append(str(exc))
    return failures


def open_network(
    *,
    cluster_id: str,
    pods: int,
    record_path: Path,
    run: Runner,
    owner_pid: int,
    owner_start_ticks: int | None,
    owner_alive: Callable[[NetworkRecord], bool],
) -> NetworkPlan:
    """Clean up what an earlier launcher on the same data dir left (refused while it still runs), choose a free
    /24, record the plan, create it. On any failure, what was created is deleted again."""
    earlier = read_record(record_path)
    if earlier is not None:
        if owner_alive(earlier):
            raise NetworkError(
                f"the cluster started by pid {earlier.owner_pid} from this data dir still owns its network "
                f"({earlier.bridge}, {earlier.subnet}); stop it first"
            )
        left = delete(earlier, run)
        if left:
            raise NetworkError("cannot clean up an earlier run's network: " + "; ".join(left))
        record_path.unlink(missing_ok=True)
    used = used_networks(run(["-j", "addr", "show"]), run(["-j", "route", "show"]))
    plan = plan_network(cluster_id, pods, choose_subnet(cluster_id, used))
    record = record_of(cluster_id, plan, owner_pid=owner_pid, owner_start_ticks=owner_start_ticks)
    write_record(record_path, record)
    try:
        create(plan, run)
    except BaseException:
        if not delete(record, run):
            record_path.unlink(missing_ok=True)
        raise
    return plan


def close_network(record: NetworkRecord, *, record_path: Path, run: Runner) -> list[str]:
    """Delete the cluster's network (idempotent); the record goes once nothing of it is left."""
    left = delete(record, run)
    if not left:
        current = None
        with contextlib.suppress(NetworkError):
            current = read_record(record_path)
        if current is None or current.cluster_id == record.cluster_id:
            record_path.unlink(missing_ok=True)
    return left


def _json_list(text: str) -> list[object]:
    """``ip -j`` output as a list (older ``ip`` prints nothing instead of ``[]``)."""
    if not text.strip():
        return []
    try:
        loaded = json.loads(text)
    except ValueError as exc:
        raise NetworkError(f"`ip -j` printed something that is not JSON: {text[:200]!r}") from exc
    return loaded if isinstance(loaded, list) else []
