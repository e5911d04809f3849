"""The nvidia-smi collector: probe the driver's field list, query only listed fields (H-11).

One invalid field fails a whole ``--query-gpu`` call, and field names move between drivers
(``retired_pages.double_bit.count`` is not ``double_bit_ecc``). So the field names are never trusted blindly:
``--help-query-gpu`` is read (cached 30 minutes), and a health field the help text does not list is simply not
queried — its key stays unknown. Columns are mapped by the requested order with
``--format=csv,noheader,nounits`` (the ``csv`` header carries unit suffixes).

Row remapping moved between switches: the R535 branch's ``--help-query-gpu`` lists no ``remapped_rows.*`` field,
while its ``--query-remapped-rows=`` switch (fields listed by ``--help-query-remapped-rows``) answers them, one
row per GPU keyed by ``gpu_uuid`` / ``gpu_bus_id``. Where the main help lacks them, that switch's help is probed
and cached like the main one, and its rows are joined to the GPUs by uuid (PCI address where a uuid is missing)
— one extra call per tick at most. Retired pages need no such switch: every branch's ``--help-query-gpu`` lists
their counts (``--query-retired-pages`` lists the pages themselves, one row per page).

The parsing functions are pure; :class:`NvidiaSmiCollector` is the thin shell around the tool.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from heteroflow.agent.commands import CommandError, CommandRunner
from heteroflow.agent.kernel_xid import CardMap, parse_bus_id
from heteroflow.agent.parsing import add_counts, parse_count, parse_flag, parse_measure
from heteroflow.agent.readings import (
    CollectorName,
    GpuHealth,
    GpuTelemetry,
    HealthCollection,
    TelemetryCollection,
)
from heteroflow.contracts.counters import Counters
from heteroflow.core.clock import Clock

TOOL: Final = "nvidia-smi"
PROBE_TTL_SEC: Final = 1800.0
PROBE_RETRY_SEC: Final = 60.0
"""After a failed ``--help-query-gpu``, the base fields are used for this long before the probe runs again."""

#: What is queried when ``--help-query-gpu`` fails or lists nothing: identity and telemetry fields every driver
#: has had for a decade. The health fields are the ones whose names move between drivers, so without the help
#: text they are not queried and stay unknown — but temperature, memory and power live on (the seed: a failed
#: probe makes the health fields unknown, never the other metrics).
BASE_FIELDS: Final = frozenset(
    {"index", "uuid", "name", "temperature.gpu", "utilization.gpu", "memory.used", "memory.total", "power.draw"}
)

IDENTITY_FIELDS: Final = (("index",), ("uuid", "gpu_uuid"), ("name", "gpu_name"))
TELEMETRY_FIELDS: Final = (
    ("temperature.gpu",),
    ("utilization.gpu",),
    ("memory.used",),
    ("memory.total",),
    ("power.draw",),
)
#: Each health field by its candidate names, preferred first (aliases from the driver's help text).
#: Where the driver splits ECC counts by location (590-series help text: ``.aggregate.dram`` "errors detected in
#: global device memory", ``.aggregate.sram`` "in global SRAMs"), the ECC keys hold the DRAM (HBM) count the rules
#: are about — ``.total`` mixes in on-die SRAM errors — and the SRAM counts are kept apart.
HEALTH_FIELDS: Final = (
    ("ecc.errors.uncorrected.aggregate.dram", "ecc.errors.uncorrected.aggregate.total"),
    ("ecc.errors.corrected.aggregate.dram", "ecc.errors.corrected.aggregate.total"),
    ("retired_pages.single_bit_ecc.count", "retired_pages.sbe"),
    ("retired_pages.double_bit.count", "retired_pages.dbe"),
    ("remapped_rows.pending",),
    ("remapped_rows.failure",),
    ("remapped_rows.correctable", "remapped_rows.sbe"),
    ("remapped_rows.uncorrectable", "remapped_rows.dbe"),
    ("ecc.errors.uncorrected.aggregate.sram",),
    ("ecc.errors.corrected.aggregate.sram",),
)

#: Shown by ``agent probe`` (extras), never sent: pending page retirement.
EXTRA_FIELDS: Final = (("retired_pages.pending",),)
EXTRA_KEYS: Final = ("retired_pages_pending",)

#: The remap keys, by index into :data:`HEALTH_FIELDS`, that the ``--query-remapped-rows`` switch can answer.
REMAP_SLOTS: Final = (4, 5, 6, 7)
#: What identifies a GPU in a ``--query-remapped-rows`` row (this switch has no ``index`` field).
REMAP_UUID: Final = ("gpu_uuid", "uuid")
REMAP_BUS_ID: Final = ("gpu_bus_id", "pci.bus_id")

_HELP_FIELD_LINE = re.compile(r'^"([A-Za-z0-9_.\-]+)"(?:\s+or\s+"([A-Za-z0-9_.\-]+)")*\s*$')
_QUOTED = re.compile(r'"([A-Za-z0-9_.\-]+)"')
_INVALID_FIELD = re.compile(r'Field "([^"]*)" is not a valid field to query', re.IGNORECASE)


def parse_help_fields(help_text: str) -> frozenset[str]:
    """Every field name (and alias) that ``nvidia-smi --help-query-gpu`` lists, one per line as
    ``"name"`` or ``"name" or "alias"``. Anything else in the text is ignored."""
    names: set[str] = set()
    for line in help_text.splitlines():
        stripped = line.strip()
        if _HELP_FIELD_LINE.match(stripped):
            names.update(_QUOTED.findall(stripped))
    return frozenset(names)


def choose_fields(available: frozenset[str], wanted: Sequence[tuple[str, ...]]) -> dict[tuple[str, ...], str]:
    """For each wanted field (by its candidate names), the first name the driver lists; absent → omitted."""
    chosen: dict[tuple[str, ...], str] = {}
    for candidates in wanted:
        for name in candidates:
            if name in available:
                chosen[candidates] = name
                break
    return chosen


def query_argv(fields: Sequence[str], *, switch: str = "--query-gpu") -> list[str]:
    return [TOOL, f"{switch}={','.join(fields)}", "--format=csv,noheader,nounits"]


def _join_key(row: Mapping[str, str], uuid_name: str | None, bus_name: str | None) -> tuple[str, object] | None:
    if uuid_name is not None:
        uuid = row.get(uuid_name, "")
        if uuid.startswith(("GPU-", "MIG-")):
            return "uuid", uuid
    if bus_name is not None:
        address = parse_bus_id(row.get(bus_name, ""))
        if address is not None:
            return "bus", address
    return None


def join_remap_rows(
    rows: Sequence[Mapping[str, str]],
    chosen: Mapping[tuple[str, ...], str],
    remap_rows: Sequence[Mapping[str, str]],
    remap_chosen: Mapping[tuple[str, ...], str],
) -> tuple[list[dict[str, str]], dict[tuple[str, ...], str], int]:
    """The main query's rows with each GPU's ``--query-remapped-rows`` values added, the field choice that reads
    them, and how many GPU rows found no remap row (their remap keys stay unknown). Pure.

    A remap row is matched by uuid, or by PCI address where either side lacks a readable uuid; a remap row that
    matches no GPU, or two GPUs' keys that collide, add nothing — a value is never given to the wrong card.
    """
    main_uuid = chosen.get(("uuid", "gpu_uuid"))
    main_bus = chosen.get(("pci.bus_id",))
    by_key: dict[tuple[str, object], Mapping[str, str] | None] = {}
    for remap in remap_rows:
        for key in (
            _join_key(remap, remap_chosen.get(REMAP_UUID), None),
            _join_key(remap, None, remap_chosen.get(REMAP_BUS_ID)),
        ):
            if key is not None:
                by_key[key] = None if key in by_key else remap  # a duplicate key matches nothing
    merged_chosen = dict(chosen)
    for slot in REMAP_SLOTS:
        candidates = HEALTH_FIELDS[slot]
        if candidates in remap_chosen:
            merged_chosen[candidates] = f"remap:{remap_chosen[candidates]}"
    merged: list[dict[str, str]] = []
    unmatched = 0
    for row in rows:
        found: Mapping[str, str] | None = None
        for key in (_join_key(row, main_uuid, None), _join_key(row, None, main_bus)):
            if key is not None and by_key.get(key) is not None:
                found = by_key[key]
                break
        extended = dict(row)
        if found is None:
            unmatched += 1
        else:
            for slot in REMAP_SLOTS:
                name = remap_chosen.get(HEALTH_FIELDS[slot])
                if name is not None:
                    extended[f"remap:{name}"] = found.get(name, "")
        merged.append(extended)
    return merged, merged_chosen, unmatched


def parse_query_rows(stdout: str, fields: Sequence[str]) -> tuple[list[dict[str, str]], list[str]]:
    """Rows of a ``csv,noheader,nounits`` answer keyed by the requested field names, and warnings.

    A line with the wrong number of columns (``Unable to determine the device handle for GPU…``) is
    skipped with a warning; the other GPUs' rows are kept (H-11).
    """
    rows: list[dict[str, str]] = []
    warnings: list[str] = []
    for line in stdout.splitlines():
        if not line.strip():
            continue
        try:
            cells = next(csv.reader([line], skipinitialspace=True))
        except (csv.Error, StopIteration):
            cells = []
        if len(cells) != len(fields):
            warnings.append(f"nvidia-smi: skipped an unreadable line: {line.strip()[:160]}")
            continue
        rows.append({name: cell.strip() for name, cell in zip(fields, cells, strict=True)})
    return rows, warnings


def _pick(row: Mapping[str, str], chosen: Mapping[tuple[str, ...], str], candidates: tuple[str, ...]) -> str:
    name = chosen.get(candidates)
    return row.get(name, "") if name is not None else ""


def _index_of(row: Mapping[str, str]) -> int | None:
    index = parse_count(row.get("index"))
    return index if index is not None and index <= 4095 else None


def _uuid_of(row: Mapping[str, str], chosen: Mapping[tuple[str, ...], str]) -> str | None:
    uuid = _pick(row, chosen, ("uuid", "gpu_uuid"))
    return uuid if uuid.startswith(("GPU-", "MIG-")) and len(uuid) <= 128 else None


def health_from_rows(
    rows: Sequence[Mapping[str, str]], chosen: Mapping[tuple[str, ...], str]
) -> tuple[list[GpuHealth], list[str]]:
    """Health readings from query rows; a row without a readable index (a lost GPU) is left out."""
    gpus: list[GpuHealth] = []
    warnings: list[str] = []
    for row in rows:
        index = _index_of(row)
        if index is None:
            warnings.append("nvidia-smi: a GPU row has no readable index (lost GPU?); left out")
            continue
        sbe = parse_count(_pick(row, chosen, HEALTH_FIELDS[2]))
        dbe = parse_count(_pick(row, chosen, HEALTH_FIELDS[3]))
        counters = Counters(
            ecc_uncorrected_total=parse_count(_pick(row, chosen, HEALTH_FIELDS[0])),
            ecc_corrected_total=parse_count(_pick(row, chosen, HEALTH_FIELDS[1])),
            # Both causes, or unknown: a half sum would read as a (false) decrease when the other appears.
            retired_pages=add_counts(sbe, dbe),
            remapped_rows_pending=parse_flag(_pick(row, chosen, HEALTH_FIELDS[4])),
            remapped_rows_failure=parse_flag(_pick(row, chosen, HEALTH_FIELDS[5])),
            remapped_rows_correctable=parse_count(_pick(row, chosen, HEALTH_FIELDS[6])),
            remapped_rows_uncorrectable=parse_count(_pick(row, chosen, HEALTH_FIELDS[7])),
            ecc_sram_uncorrected_total=parse_count(_pick(row, chosen, HEALTH_FIELDS[8])),
            ecc_sram_corrected_total=parse_count(_pick(row, chosen, HEALTH_FIELDS[9])),
        )
        gpus.append(
            GpuHealth(
                index=index,
                vendor="NVIDIA",
                uuid=_uuid_of(row, chosen),
                name=_pick(row, chosen, ("name", "gpu_name"))[:200],
                counters=counters,
                extras=((EXTRA_KEYS[0], parse_flag(_pick(row, chosen, EXTRA_FIELDS[0]))),),
            )
        )
    return gpus, warnings


def telemetry_from_rows(rows: Sequence[Mapping[str, str]], chosen: Mapping[tuple[str, ...], str]) -> list[GpuTelemetry]:
    gpus: list[GpuTelemetry] = []
    for row in rows:
        index = _index_of(row)
        if index is None:
            continue
        gpus.append(
            GpuTelemetry(
                index=index,
                uuid=_uuid_of(row, chosen),
                name=_pick(row, chosen, ("name", "gpu_name"))[:200],
                temperature_c=parse_measure(_pick(row, chosen, ("temperature.gpu",))),
                utilization_pct=parse_measure(_pick(row, chosen, ("utilization.gpu",))),
                memory_used_mib=parse_measure(_pick(row, chosen, ("memory.used",))),
                memory_total_mib=parse_measure(_pick(row, chosen, ("memory.total",))),
                power_w=parse_measure(_pick(row, chosen, ("power.draw",))),
            )
        )
    return gpus


def invalid_field_in(output: str) -> str | None:
    match = _INVALID_FIELD.search(output)
    return match.group(1) if match else None


@dataclass(frozen=True, slots=True)
class _Probe:
    fields: frozenset[str]
    at_monotonic: float


@dataclass(frozen=True, slots=True)
class _ProbeTarget:
    """One help switch and what it answers for (the main query, or the remapped rows)."""

    help_flag: str
    what: str


_MAIN: Final = _ProbeTarget("--help-query-gpu", "main")
_REMAP: Final = _ProbeTarget("--help-query-remapped-rows", "remap")


class NvidiaSmiCollector:
    """Reads all NVIDIA GPUs with one ``nvidia-smi --query-gpu`` call per tick.

    The ``--help-query-gpu`` probe is cached for ``probe_ttl_sec`` (30 minutes), so a tick normally starts
    exactly one process; a failed query drops the cache so the next tick re-probes.
    """

    name: CollectorName = "nvidia-smi"

    def __init__(
        self,
        *,
        runner: CommandRunner,
        clock: Clock,
        timeout_sec: float = 10.0,
        probe_ttl_sec: float = PROBE_TTL_SEC,
    ) -> None:
        self._runner = runner
        self._clock = clock
        self._timeout_s = timeout_sec
        self._probe_ttl_s = probe_ttl_sec
        self._probe: _Probe | None = None
        self._probe_failure: tuple[str, float] | None = None
        self._remap_probe: _Probe | None = None
        self.probe_runs = 0
        """How many times ``--help-query-gpu`` ran (tests pin the 30-minute cache with it)."""
        self.remap_probe_runs = 0
        """How many times ``--help-query-remapped-rows`` ran (cached like the main probe)."""

    def available(self) -> tuple[bool, str]:
        if self._runner.which(TOOL) is None:
            return False, "nvidia-smi is not installed (not found on PATH); NVIDIA GPUs are not collected"
        return True, ""

    def _fields(self) -> tuple[frozenset[str], str | None]:
        """The fields the driver lists, or the base fields and why (the probe failed; retried after a minute)."""
        now = self._clock.monotonic()
        if self._probe is not None and now - self._probe.at_monotonic < self._probe_ttl_s:
            return self._probe.fields, None
        if self._probe_failure is not None and now - self._probe_failure[1] < PROBE_RETRY_SEC:
            return BASE_FIELDS, self._probe_failure[0]
        self.probe_runs += 1
        try:
            result = self._runner.run([TOOL, "--help-query-gpu"], timeout_sec=self._timeout_s)
        except CommandError as exc:
            return self._probe_failed(f"nvidia-smi --help-query-gpu failed ({exc})", now)
        fields = parse_help_fields(result.stdout)
        if result.returncode != 0 or not fields:
            why = "listed no field" if result.returncode == 0 else f"exit {result.returncode}"
            return self._probe_failed(f"nvidia-smi --help-query-gpu failed ({why})", now)
        self._probe = _Probe(fields=fields, at_monotonic=now)
        self._probe_failure = None
        return fields, None

    def _probe_failed(self, why: str, now: float) -> tuple[frozenset[str], str]:
        self._probe = None
        self._probe_failure = (why, now)
        return BASE_FIELDS, why

    def _remap_fields(self) -> frozenset[str]:
        """The fields ``--help-query-remapped-rows`` lists (cached like the main probe; a failure or a driver
        without that switch lists nothing, also cached, so a pre-Ampere node does not pay a call per tick)."""
        now = self._clock.monotonic()
        if self._remap_probe is not None and now - self._remap_probe.at_monotonic < self._probe_ttl_s:
            return self._remap_probe.fields
        self.remap_probe_runs += 1
        try:
            result = self._runner.run([TOOL, _REMAP.help_flag], timeout_sec=self._timeout_s)
        except CommandError:
            fields: frozenset[str] = frozenset()
            self._remap_probe = _Probe(fields=fields, at_monotonic=now - self._probe_ttl_s + PROBE_RETRY_SEC)
            return fields
        fields = parse_help_fields(result.stdout) if result.returncode == 0 else frozenset()
        self._remap_probe = _Probe(fields=fields, at_monotonic=now)
        return fields

    def _query_remaps(
        self, rows: list[dict[str, str]], chosen: dict[tuple[str, ...], str], warnings: list[str]
    ) -> tuple[list[dict[str, str]], dict[tuple[str, ...], str]]:
        """Where the main help lists no remap field, read them through ``--query-remapped-rows`` (R535)."""
        if any(HEALTH_FIELDS[slot] in chosen for slot in REMAP_SLOTS) or not rows:
            return rows, chosen
        available = self._remap_fields()
        wanted = [HEALTH_FIELDS[slot] for slot in REMAP_SLOTS]
        remap_chosen = choose_fields(available, [REMAP_UUID, REMAP_BUS_ID, *wanted])
        if not any(names in remap_chosen for names in wanted):
            return rows, chosen
        if REMAP_UUID not in remap_chosen and REMAP_BUS_ID not in remap_chosen:
            warnings.append("nvidia-smi --query-remapped-rows lists no GPU uuid or bus id; remap keys unknown")
            return rows, chosen
        fields = list(dict.fromkeys(remap_chosen.values()))
        try:
            result = self._runner.run(query_argv(fields, switch="--query-remapped-rows"), timeout_sec=self._timeout_s)
        except CommandError as exc:
            warnings.append(f"nvidia-smi --query-remapped-rows failed ({exc}); remap keys unknown")
            return rows, chosen
        if result.returncode != 0:
            if invalid_field_in(result.stdout + result.stderr) is not None:
                self._remap_probe = None  # the driver disagrees with its help text: re-probe next tick
            warnings.append(f"nvidia-smi --query-remapped-rows exited {result.returncode}; remap keys unknown")
            return rows, chosen
        remap_rows, remap_warnings = parse_query_rows(result.stdout, fields)
        warnings.extend(remap_warnings)
        merged, merged_chosen, unmatched = join_remap_rows(rows, chosen, remap_rows, remap_chosen)
        if unmatched:
            warnings.append(f"nvidia-smi --query-remapped-rows had no row for {unmatched} GPU(s); their remaps unknown")
        return merged, merged_chosen

    def _query(
        self, wanted: Sequence[tuple[str, ...]]
    ) -> tuple[list[dict[str, str]], dict[tuple[str, ...], str], list[str]]:
        available, probe_failed = self._fields()
        if probe_failed is not None and self._runner.which(TOOL) is None:
            raise CommandError(probe_failed)  # the tool itself is gone: nothing to query
        identity = list(IDENTITY_FIELDS)
        if HEALTH_FIELDS[REMAP_SLOTS[0]] in wanted and not any(name.startswith("remapped_rows.") for name in available):
            identity.append(("pci.bus_id",))  # to join the remap switch's rows where a uuid is unreadable
        chosen = choose_fields(available, [*identity, *wanted])
        if ("index",) not in chosen:
            raise CommandError("nvidia-smi does not list the field 'index'; GPUs cannot be told apart")
        fields = list(dict.fromkeys(chosen.values()))
        result = self._runner.run(query_argv(fields), timeout_sec=self._timeout_s)
        rows, warnings = parse_query_rows(result.stdout, fields)
        if result.returncode != 0:
            bad = invalid_field_in(result.stdout + result.stderr)
            if bad is not None:
                self._probe = None  # the driver disagrees with its help text: re-probe next tick
                raise CommandError(f"nvidia-smi rejected the field {bad!r}; this tick's values are unknown")
            warnings.append(f"nvidia-smi exited {result.returncode}; kept the {len(rows)} readable rows")
        if probe_failed is not None:
            warnings.append(f"{probe_failed}; health values unknown, telemetry read from the base fields")
        return rows, chosen, warnings

    def read_health(self) -> HealthCollection:
        now = self._clock.now()
        try:
            rows, chosen, warnings = self._query((*HEALTH_FIELDS, *EXTRA_FIELDS))
        except CommandError as exc:  # missing, hung, or a field the driver refused
            return HealthCollection(collector="nvidia-smi", collected_at=now, warnings=(str(exc),))
        rows, chosen = self._query_remaps(rows, chosen, warnings)
        missing = [names[0] for names in HEALTH_FIELDS if names not in chosen]
        if missing and len(missing) < len(HEALTH_FIELDS):
            warnings.append(f"nvidia-smi does not list {', '.join(missing)}; those keys are unknown")
        gpus, row_warnings = health_from_rows(rows, chosen)
        return HealthCollection(
            collector="nvidia-smi",
            collected_at=now,
            gpus=tuple(gpus),
            warnings=tuple(warnings + row_warnings),
        )

    def read_telemetry(self) -> TelemetryCollection:
        now = self._clock.now()
        try:
            rows, chosen, warnings = self._query(TELEMETRY_FIELDS)
        except CommandError as exc:
            return TelemetryCollection(collector="nvidia-smi", collected_at=now, warnings=(str(exc),))
        return TelemetryCollection(
            collector="nvidia-smi",
            collected_at=now,
            gpus=tuple(telemetry_from_rows(rows, chosen)),
            warnings=tuple(warnings),
        )

    def card_map(self) -> CardMap:
        """Each card's PCI address (``pci.bus_id``) → (index, uuid), for the kernel log's XID lines."""
        try:
            result = self._runner.run(
                [TOOL, "--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader,nounits"],
                timeout_sec=self._timeout_s,
            )
        except CommandError:
            return {}
        return parse_bus_rows(result.stdout)

    def close(self) -> None:
        return None


def parse_bus_rows(stdout: str) -> CardMap:
    """``index, uuid, pci.bus_id`` rows as PCI address → (index, uuid). Never raises; odd rows are skipped."""
    cards: CardMap = {}
    for line in stdout.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) != 3 or not parts[0].isdigit() or len(parts[0]) > 4:
            continue
        address = parse_bus_id(parts[2])
        if address is not None:
            uuid = parts[1] if parts[1].startswith("GPU-") else None
            cards[address] = (int(parts[0]), uuid)
    return cards
