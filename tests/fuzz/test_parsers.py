"""Every reader of outside input and every configuration loader, on arbitrary input (hypothesis).

The property is the same everywhere: whatever the input, the reader returns a value or raises its documented
error, never anything else; what it returns is in range; and a valid value written out reads back the same.

Already covered next to their unit tests, and not repeated here: the vendor tools' pure parsers on arbitrary
text and table cells (``tests/unit/agent/test_nvidia_smi.py``, ``test_cnmon.py``, ``test_xpu_smi.py``,
``test_parsing.py``), the MindCluster ConfigMap, node and GPU-event parsers
(``tests/unit/serving/controller/test_monitor_parsers.py``), the heartbeat's stats, XID events and times
(``tests/unit/health/test_heartbeat.py``), the runtime codec's round trip
(``tests/unit/serving/controller/test_store_codec.py``) and the Coordinator's body checks
(``tests/unit/serving/coordinator/test_body.py``). What is here: the vendor collectors end to end on
mutated real tables and odd exit codes, NVML's values, the controller's YAML file, every ``LenientSettings``
group, the runtime codec on arbitrary bytes and damaged records, the NodeManager's instance spec file, and
the platform's hardware-event cursor.
"""

from __future__ import annotations

import json
import math
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic_settings import BaseSettings

import heteroflow
from heteroflow.agent.cnmon import CnmonCollector
from heteroflow.agent.commands import CommandResult
from heteroflow.agent.kernel_xid import (
    CardLostTracker,
    DevKmsg,
    KernelXidReader,
    PciAddress,
    parse_bus_id,
    parse_record,
    parse_xid,
    xid_of,
)
from heteroflow.agent.nvidia_smi import NvidiaSmiCollector, parse_bus_rows
from heteroflow.agent.nvml import NvmlCollector, XidWatcher
from heteroflow.agent.readings import HealthCollection, TelemetryCollection
from heteroflow.agent.settings import AgentSettings
from heteroflow.agent.testing import FakeCommandRunner, FakeGpu, FakeNvml
from heteroflow.agent.xpu_smi import XpuSmiCollector
from heteroflow.contracts.serving import HeartbeatRequest
from heteroflow.core.settings import LenientSettings
from heteroflow.core.testing import FakeClock
from heteroflow.engine_sim.settings import EngineSimSettings
from heteroflow.health.counters import COUNTER_MAX
from heteroflow.health.metrics_settings import GpuMetricsSettings
from heteroflow.health.prediction_settings import PredictionSettings
from heteroflow.health.settings import HealthStorageSettings
from heteroflow.platform_server.alert_delivery import AlertDeliverySettings
from heteroflow.platform_server.errors import BadRequest
from heteroflow.platform_server.routes.hardware_events import parse_cursor
from heteroflow.platform_server.settings import ServerSettings
from heteroflow.serving.controller.config import (
    ConfigFileError,
    ControllerConfig,
    ControllerSettings,
    FaultToleranceConfig,
    load_config,
)
from heteroflow.serving.controller.monitor.settings import ResourceMonitorSettings
from heteroflow.serving.controller.store import StoreCorruptError, decode_runtime, encode_runtime
from heteroflow.serving.coordinator.settings import CoordinatorSettings
from heteroflow.serving.node_manager.settings import NodeManagerSettings
from heteroflow.serving.node_manager.spec import InstanceSpec, SpecError, load_spec
from tests.unit.serving.controller.test_store_codec import persisted_runtimes

OWN_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "agent"

# Hypothesis gives every example the same folder; each example writes its own file name.
FILE_EXAMPLES = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])

scalars = (
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats() | st.text(max_size=20)
)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12,
)
"""Anything ``json.loads`` can return (NaN and infinities included, as Python's decoder accepts them)."""


# == vendor tools, end to end ===============================================================================
LINE_OPS = st.sampled_from(["keep", "keep", "keep", "drop", "repeat", "cut", "noise", "swap-digits"])


@st.composite
def mutated(draw: st.DrawFn, text: str) -> str:
    """``text`` with some lines dropped, repeated, cut short, replaced by noise or with digits changed."""
    out: list[str] = []
    for line in text.splitlines():
        op = draw(LINE_OPS)
        if op == "keep":
            out.append(line)
        elif op == "repeat":
            out += [line, line]
        elif op == "cut":
            out.append(line[: draw(st.integers(0, max(len(line) - 1, 0)))])
        elif op == "noise":
            out.append(draw(st.text(max_size=60)))
        elif op == "swap-digits":
            digit = draw(st.sampled_from(["-1", "N/A", "99999999999999999999999", "1.5", "", "x", "[N/A]"]))
            out.append("".join(digit if ch.isdigit() else ch for ch in line))
    return "\n".join(out)


exit_codes = st.sampled_from([0, 0, 0, 1, 2, 6, 9, 127, 255, -9])


def assert_in_range(health: HealthCollection, telemetry: TelemetryCollection) -> None:
    for gpu in health.gpus:
        for value in gpu.counters.as_dict().values():
            assert value is None or (type(value) is int and 0 <= value <= COUNTER_MAX), gpu
        assert gpu.uuid is None or isinstance(gpu.uuid, str)
    for card in telemetry.gpus:
        for number in (card.temperature_c, card.utilization_pct, card.memory_used_mib, card.memory_total_mib):
            assert number is None or (math.isfinite(number) and number >= 0), card
    assert all(isinstance(warning, str) for warning in (*health.warnings, *telemetry.warnings))


@pytest.mark.parametrize(
    ("collector", "tool", "fixture"),
    [
        (CnmonCollector, "cnmon", "cnmon.ecc-second-line.synthetic.txt"),
        (CnmonCollector, "cnmon", "cnmon.v1-layout.synthetic.txt"),
        (XpuSmiCollector, "xpu-smi", "xpu-smi.gen3.synthetic.txt"),
        (XpuSmiCollector, "xpu-smi", "xpu-smi.no-ecc-column.synthetic.txt"),
    ],
)
def test_table_tools_never_raise_on_damaged_tables_or_odd_exit_codes(collector: Any, tool: str, fixture: str) -> None:
    table = (OWN_FIXTURES / fixture).read_text()

    @given(mutated(table), exit_codes, st.text(max_size=80))
    def check(stdout: str, code: int, stderr: str) -> None:
        runner = FakeCommandRunner({tool: CommandResult(returncode=code, stdout=stdout, stderr=stderr)})
        reader = collector(runner=runner, clock=FakeClock())
        assert_in_range(reader.read_health(), reader.read_telemetry())

    check()


def test_nvidia_smi_never_raises_on_damaged_help_or_query_output_or_odd_exit_codes() -> None:
    help_text = (OWN_FIXTURES / "help-query-gpu.synthetic.txt").read_text()
    csv_text = (OWN_FIXTURES / "query-gpu.synthetic.csv").read_text()
    refusal = st.sampled_from(["", 'Field "ecc.errors.corrected.aggregate.total" is not a valid field to query.'])

    @given(mutated(help_text), mutated(csv_text), exit_codes, exit_codes, refusal)
    def check(helps: str, rows: str, help_code: int, query_code: int, stderr: str) -> None:
        def nvidia_smi(argv: Any) -> CommandResult:
            if "--help-query-gpu" in argv:
                return CommandResult(returncode=help_code, stdout=helps, stderr="")
            return CommandResult(returncode=query_code, stdout=rows, stderr=stderr)

        reader = NvidiaSmiCollector(runner=FakeCommandRunner({"nvidia-smi": nvidia_smi}), clock=FakeClock())
        assert_in_range(reader.read_health(), reader.read_telemetry())

    check()


# == NVML ===================================================================================================
c_ints = st.integers(min_value=-(2**64), max_value=2**64)
"""What a C binding can hand back: any 64-bit value, signed or not."""
nvml_codes = st.sampled_from([1, 2, 3, 4, 9, 12, 13, 15, 17, 999])
nvml_functions = st.sampled_from(
    [
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetName",
        "nvmlDeviceGetEccMode",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetRetiredPages",
        "nvmlDeviceGetRetiredPagesPendingStatus",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetIndex",
    ]
)
nvml_text = st.text(max_size=300) | st.binary(max_size=300)  # older bindings hand back bytes
fake_gpus = st.builds(
    FakeGpu,
    uuid=nvml_text,
    name=nvml_text,
    ecc_mode=st.tuples(c_ints, c_ints),
    ecc_uncorrected=c_ints,
    ecc_corrected=c_ints,
    retired_sbe=st.integers(0, 64),
    retired_dbe=st.integers(0, 64),
    retired_pending=c_ints,
    remapped=st.tuples(c_ints, c_ints, c_ints, c_ints),
    temperature=c_ints,
    utilization=c_ints,
    memory_used=c_ints,
    memory_total=c_ints,
    power_mw=c_ints,
    errors=st.dictionaries(nvml_functions, nvml_codes, max_size=4),
)


@given(st.lists(fake_gpus, max_size=4))
def test_nvml_values_of_any_range_or_failure_give_in_range_readings(gpus: list[FakeGpu]) -> None:
    reader = NvmlCollector(clock=FakeClock(), loader=lambda: FakeNvml(gpus))
    health, telemetry = reader.read_health(), reader.read_telemetry()
    assert [gpu.index for gpu in health.gpus] == list(range(len(gpus)))
    assert all(len(gpu.name) <= 200 for gpu in health.gpus)
    assert_in_range(health, telemetry)


@given(st.lists(st.tuples(st.integers(0, 3), c_ints), max_size=6), st.lists(fake_gpus, min_size=4, max_size=4))
def test_xid_events_with_any_event_data_are_events_in_range_or_dropped(
    raw: list[tuple[int, int]], gpus: list[FakeGpu]
) -> None:
    fake = FakeNvml(gpus)
    fake.nvmlInit()
    watcher = XidWatcher(api=fake, clock=FakeClock())
    watcher.start()
    for device, data in raw:
        fake.emit_xid(device, data)
    for device, data in raw:
        event = watcher.poll(0)
        if event is not None:
            assert event.xid == data
            assert 0 <= event.xid <= 2**31 - 1
            assert event.index == device
    assert watcher.poll(0) is None


# == the controller's configuration file ====================================================================
CONFIG_KEYS = st.sampled_from(
    [
        "controller",
        "fault_tolerance_config",
        "instances",
        "dp_scale_down_config",
        "enable_fault_tolerance",
        "enable_dp_scale_down",
        "enable_dp_scale_down_proxy",
        "heartbeat_interval_sec",
        "host",
        "port",
        "model",
        "fallback",
        "inst-1",
    ]
)
yaml_scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20)
yaml_keys = CONFIG_KEYS | st.text(max_size=10) | st.integers(-5, 5) | st.booleans() | st.none()
config_documents = st.recursive(
    yaml_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(yaml_keys, children, max_size=5),
    max_leaves=20,
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("parsers")


def _config_or_error(path: Path) -> ControllerConfig | None:
    try:
        config = load_config(path, environ={})
    except ConfigFileError as exc:
        refusal = str(exc)
    else:
        assert all(isinstance(warning, str) for warning in config.warnings)
        return config
    assert str(path) in refusal  # the error names the file
    return None


any_file = st.binary(max_size=300) | st.text(max_size=300).map(lambda text: text.encode("utf-8"))


@FILE_EXAMPLES
@given(any_file)
def test_any_file_is_a_configuration_or_a_config_file_error(folder: Path, content: bytes) -> None:
    path = folder / "any.yaml"
    path.write_bytes(content)
    _config_or_error(path)


@FILE_EXAMPLES
@given(config_documents)
def test_any_yaml_document_is_a_configuration_or_a_config_file_error(folder: Path, document: object) -> None:
    path = folder / "document.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    config = _config_or_error(path)
    if isinstance(document, dict) and config is not None:
        # whatever the values, the settings are valid ones: invalid values fell back to defaults with a warning
        assert ControllerSettings.load(**config.settings.model_dump()).config_warnings == ()
        assert FaultToleranceConfig.load(**config.ft.model_dump()).config_warnings == ()


@pytest.mark.parametrize("depth", [50, 5_000])
def test_a_deeply_nested_configuration_is_a_config_file_error_or_ignored(folder: Path, depth: int) -> None:
    path = folder / f"deep-{depth}.yaml"
    path.write_text("controller: " + "[" * depth + "]" * depth, encoding="utf-8")
    config = _config_or_error(path)
    assert config is None or config.warnings == ("'controller' must be a mapping; ignored",)


# == every LenientSettings group ============================================================================
SETTINGS_GROUPS: list[type[LenientSettings]] = [
    ServerSettings,
    HealthStorageSettings,
    PredictionSettings,
    GpuMetricsSettings,
    AlertDeliverySettings,
    AgentSettings,
    ControllerSettings,
    FaultToleranceConfig,
    ResourceMonitorSettings,
    CoordinatorSettings,
    NodeManagerSettings,
    EngineSimSettings,
]


def test_every_settings_group_is_listed() -> None:
    source = Path(heteroflow.__file__).parent
    declared = {
        name
        for module in source.rglob("*.py")
        for name in re.findall(r"^class (\w+)\(LenientSettings\)", module.read_text(encoding="utf-8"), re.M)
    }
    assert declared == {group.__name__ for group in SETTINGS_GROUPS}


def _keys(group: type[BaseSettings]) -> list[str]:
    """Every name a value can be given under: field names and their environment names."""
    keys: list[str] = []
    for name, info in group.model_fields.items():
        keys.append(name)
        alias = info.validation_alias
        keys += [choice for choice in getattr(alias, "choices", []) if isinstance(choice, str)]
    return sorted(set(keys))


@pytest.mark.parametrize("group", SETTINGS_GROUPS, ids=lambda group: group.__name__)
def test_any_values_load_to_valid_settings(group: type[LenientSettings]) -> None:
    # values are given under field names and environment names alike (the environment itself is emptied of
    # HeteroFlow's variables by the suite's conftest)
    keys = st.sampled_from(_keys(group))
    environment_text = st.text(max_size=12) | st.integers(-(2**40), 2**40).map(str) | st.sampled_from(["nan", "inf"])

    @settings(max_examples=40)
    @given(st.dictionaries(keys, json_values | environment_text, max_size=6))
    def check(values: dict[str, Any]) -> None:
        loaded = group.load(**values)
        assert all(isinstance(warning, str) for warning in loaded.config_warnings)
        # what was kept is valid: loading it again changes nothing and warns about nothing
        again = group.load(**{name: getattr(loaded, name) for name in group.model_fields})
        assert again.config_warnings == ()
        assert again.model_dump() == loaded.model_dump()

    check()


# == the FtRuntimeStore codec ===============================================================================
@given(st.binary(max_size=400) | st.text(max_size=400).map(lambda t: t.encode("utf-8", "surrogatepass")))
def test_any_bytes_decode_to_a_record_or_a_corrupt_error(data: bytes) -> None:
    try:
        record = decode_runtime(data)
    except StoreCorruptError as exc:
        refusal = str(exc)
    else:
        assert decode_runtime(encode_runtime(record)) == record
        return
    assert refusal


@st.composite
def damaged_records(draw: st.DrawFn) -> bytes:
    """A valid record with one value replaced (at the top or inside ``write_ahead``), removed, or added."""
    document = json.loads(encode_runtime(draw(persisted_runtimes())))
    target = document
    if isinstance(document.get("write_ahead"), dict) and draw(st.booleans()):
        target = document["write_ahead"]
    key = draw(st.sampled_from(sorted(target)) | st.text(max_size=8))
    if draw(st.booleans()):
        target.pop(key, None)
    else:
        target[key] = draw(json_values)
    return json.dumps(target if draw(st.integers(0, 9)) == 0 else document).encode()


@given(damaged_records())
def test_a_damaged_record_decodes_to_a_valid_record_or_a_corrupt_error(data: bytes) -> None:
    try:
        record = decode_runtime(data)
    except StoreCorruptError as exc:
        refusal = str(exc)
    else:
        assert record.dead_committed <= record.original_dp_ranks
        assert decode_runtime(encode_runtime(record)) == record
        return
    assert refusal


# == the NodeManager's instance spec ========================================================================
VALID_SPEC: dict[str, Any] = {
    "instance_id": "inst-1",
    "dp_size": 4,
    "dp_master_ip": "10.0.0.1",
    "dp_rpc_port": 29500,
    "dp_store_port": 29600,
    "dead_ranks": [3],
    "endpoints": [
        {"id": 0, "port": 8100, "device_infos": [{"device_id": "GPU-0", "index": 0}]},
        {"id": 1, "port": 8101},
    ],
}


def _spec_or_error(path: Path) -> InstanceSpec | None:
    try:
        spec = load_spec(path)
    except SpecError as exc:
        refusal = str(exc)
    else:
        return _checked(spec)
    assert str(path) in refusal  # the error names the file
    return None


def _checked(spec: InstanceSpec) -> InstanceSpec:
    assert all(rank >= 0 for rank in (*spec.dead_ranks, *spec.endpoint_ids))
    assert spec.endpoint_ids <= set(range(spec.dp_size))
    return spec


@FILE_EXAMPLES
@given(st.sampled_from(["spec.json", "spec.toml"]), any_file)
def test_any_spec_file_is_a_spec_or_a_spec_error(folder: Path, name: str, content: bytes) -> None:
    path = folder / name
    path.write_bytes(content)
    _spec_or_error(path)


@FILE_EXAMPLES
@given(st.sampled_from(sorted(InstanceSpec.model_fields)) | st.text(max_size=8), json_values, st.booleans())
def test_a_spec_with_any_value_anywhere_is_a_spec_or_a_spec_error(
    folder: Path, key: str, value: object, nested: bool
) -> None:
    document = json.loads(json.dumps(VALID_SPEC))
    (document["endpoints"][0] if nested else document)[key] = value
    path = folder / "damaged.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    _spec_or_error(path)


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("deep.json", "[" * 5_000 + "]" * 5_000),
        ("deep.toml", "a = " + "[" * 5_000 + "]" * 5_000),
        ("deep.toml", "a = " + "{b = " * 3_000 + "1" + "}" * 3_000),
    ],
)
def test_a_deeply_nested_spec_file_is_a_spec_error(folder: Path, name: str, text: str) -> None:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    assert _spec_or_error(path) is None


@FILE_EXAMPLES
@given(st.lists(st.integers(-3, 6), max_size=4), st.lists(st.integers(-3, 6), min_size=1, max_size=4, unique=True))
def test_a_loaded_spec_names_only_ranks_the_wire_accepts(folder: Path, dead: list[int], ids: list[int]) -> None:
    document = {
        **VALID_SPEC,
        "dead_ranks": dead,
        "endpoints": [{"id": rank, "port": 8000 + n} for n, rank in enumerate(ids)],
    }
    path = folder / "ranks.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    spec = _spec_or_error(path)
    if spec is not None:  # what the NodeManager will tell the controller about this pod must be well-formed
        HeartbeatRequest(
            pod_id="pod",
            instance_id=spec.instance_id,
            endpoint_ids=sorted(spec.endpoint_ids),
            expected_endpoint_ids=sorted(spec.endpoint_ids),
            retired_endpoint_ids=sorted(set(spec.dead_ranks)),
            sent_at=datetime.now(UTC),
        )


@FILE_EXAMPLES
@given(
    st.integers(1, 64).flatmap(
        lambda size: st.fixed_dictionaries(
            {
                "dp_size": st.just(size),
                "ids": st.lists(st.integers(0, size - 1), min_size=1, max_size=size, unique=True),
                "dead": st.lists(st.integers(0, size - 1), max_size=size, unique=True),
                "instance_id": st.text(min_size=1, max_size=20),
            }
        )
    )
)
def test_a_valid_spec_round_trips_through_its_file(folder: Path, drawn: dict[str, Any]) -> None:
    spec = InstanceSpec.model_validate(
        {
            **VALID_SPEC,
            "instance_id": drawn["instance_id"],
            "dp_size": drawn["dp_size"],
            "dead_ranks": drawn["dead"],
            "endpoints": [{"id": rank, "port": 8000 + rank} for rank in drawn["ids"]],
            "num_logical_experts": 1,  # any ranks left hold it: the world's expert capacity is not what this is about
        }
    )
    path = folder / "valid.json"
    path.write_text(spec.model_dump_json(), encoding="utf-8")
    assert load_spec(path) == spec


# == the platform's hardware-event cursor ===================================================================
# any text, and dotted runs of any Unicode digits: '²' and '٣' are digits to str.isdigit(), int() reads only '٣'
unicode_digits = st.text(alphabet=st.characters(categories=["Nd", "No"]), max_size=19)


@given(st.text(max_size=40) | st.lists(unicode_digits, min_size=1, max_size=3).map(".".join))
def test_any_cursor_text_is_a_position_or_a_400(text: str) -> None:
    try:
        xid, sample = parse_cursor(text)
    except BadRequest as exc:
        refusal = exc.message
    else:
        assert 0 <= xid < 10**18
        assert 0 <= sample < 10**18
        assert parse_cursor(f"{xid}.{sample}") == (xid, sample)
        return
    assert "cursor" in refusal


@given(st.integers(0, 10**18 - 1), st.integers(0, 10**18 - 1))
def test_every_cursor_the_route_hands_out_reads_back(xid: int, sample: int) -> None:
    assert parse_cursor(f"{xid}.{sample}") == (xid, sample)


# == the kernel log's XID lines ==============================================================================
_kmsg_prefixes = st.sampled_from(["", "4,1834,1234567890,-;", "[24128.834365] ", "kernel: ", "6,,,;", "[ 1.] "])
_xid_lines = st.builds(
    lambda prefix, address, code, rest: f"{prefix}NVRM: Xid (PCI:{address}): {code}{rest}",
    _kmsg_prefixes,
    st.from_regex(r"[0-9a-fA-F]{0,9}:[0-9a-fA-F]{0,3}:[0-9a-fA-F]{0,3}(\.[0-9])?", fullmatch=True),
    st.integers(-5, 2**40).map(str) | st.text(max_size=6),
    st.text(max_size=80),
)


@given(_xid_lines | st.text(max_size=300) | st.binary(max_size=300).map(lambda b: b.decode("utf-8", "replace")))
def test_any_kernel_log_line_is_an_xid_in_range_or_none(line: str) -> None:
    parsed = parse_xid(line)
    record = parse_record(line)
    assert isinstance(record.message, str)
    if parsed is not None:
        assert 0 <= parsed.xid <= 2**31 - 1
        assert 0 <= parsed.pci.bus <= 0xFF
        assert 0 <= parsed.pci.device <= 0xFF
        assert parsed.usec is None or parsed.usec >= 0
        assert parse_bus_id(str(parsed.pci)) == parsed.pci


_lost_lines = st.sampled_from(
    [
        "NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5) installed in this system has",
        "NVRM: fallen off the bus and is not responding to commands.",
        "NVRM: GPU 0000:29:00.0: GPU has fallen off the bus.",
        "NVRM: Xid (PCI:0000:29:00): 79, GPU has fallen off the bus.",
        "4,1,5,-;NVRM: The NVIDIA GPU 0000:01:00.0\\x0aNVRM: fallen off the bus",
    ]
)


@given(st.lists(_lost_lines | st.text(max_size=120), max_size=30))
def test_card_lost_lines_never_raise_and_report_each_address_at_most_once_without_times(lines: list[str]) -> None:
    tracker = CardLostTracker()
    reported: list[PciAddress] = []
    for line in lines:
        record = parse_record(line)
        event = tracker.feed(record, xid_of(record))
        if event is not None and event.xid == 79 and event.usec is None:
            reported.append(event.pci)
    assert len(reported) == len(set(reported))


@given(st.text(max_size=400))
def test_any_bus_id_rows_map_to_cards_in_range(stdout: str) -> None:
    for address, (index, uuid) in parse_bus_rows(stdout).items():
        assert parse_bus_id(str(address)) == address
        assert 0 <= index <= 9999
        assert uuid is None or uuid.startswith("GPU-")


@given(st.text(max_size=400) | st.binary(max_size=400).map(lambda b: b.decode("latin-1")))
def test_any_kernel_log_file_is_read_without_raising(tmp_path_factory: pytest.TempPathFactory, content: str) -> None:
    path = tmp_path_factory.mktemp("kmsg") / "kmsg"
    path.write_text(content, encoding="utf-8", errors="surrogateescape")
    clock = FakeClock()
    reader = KernelXidReader(
        log=DevKmsg(str(path), btime=lambda: datetime(2026, 1, 1, tzinfo=UTC)),
        card_map=lambda: {PciAddress(0, bus, 0): (bus, None) for bus in range(256)},
        now=clock.now,
        monotonic=clock.monotonic,
    )
    assert reader.start()
    for event in reader.poll():
        assert 0 <= event.index <= 255
        assert event.occurred_at.tzinfo is not None
    reader.close()
