"""XIDs from the kernel log: real line formats, the ring buffer read from its start, the card map, dedup with
NVML events, and an unreadable /dev/kmsg reported honestly."""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from heteroflow.agent.assembly import build_agent, probe_report, probe_xids
from heteroflow.agent.collectors import Selection
from heteroflow.agent.heartbeat import heartbeat_body
from heteroflow.agent.kernel_xid import (
    CardMap,
    DevKmsg,
    KernelXidReader,
    PciAddress,
    parse_bus_id,
    parse_record,
    parse_xid,
)
from heteroflow.agent.nvidia_smi import parse_bus_rows
from heteroflow.agent.nvml import NO_PERMISSION, NvmlCollector, nvml_card_map
from heteroflow.agent.readings import HealthCollection, XidEvent
from heteroflow.agent.settings import AgentSettings
from heteroflow.agent.testing import FakeCommandRunner, FakeGpu, FakeNvml, FakePlatformClient
from heteroflow.agent.xid_merge import XidMerger
from heteroflow.agent.xid_status import not_collected, with_kernel_log
from heteroflow.core.testing import FakeClock
from heteroflow.health.xid_collection import parse_xid_collection

BOOT = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)

# Lines as public captures show them (driver versions differ: with or without pid/name, Ch, PCI: prefix).
REAL_LINES = [
    (
        "4,1834,1234567890,-;NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, "
        "Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter",
        PciAddress(0, 0xCB, 0),
        13,
        1234567890,
    ),
    (
        "4,1835,1234568000,-;NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, Ch 00000008, "
        "errorString CTX SWITCH TIMEOUT, Info 0x58005",
        PciAddress(0, 0xCB, 0),
        109,
        1234568000,
    ),
    (
        "[24128.834365] NVRM: Xid (PCI:0000:01:00): 31, Ch 00000003, engmask 00000101, intr 10000000",
        PciAddress(0, 1, 0),
        31,
        24128834365,
    ),
    (
        "kernel: NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149",
        PciAddress(0, 0xDC, 0),
        45,
        None,
    ),
    (
        "4,77,99,-;NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 0x00000000)",
        PciAddress(0x19, 1, 0),
        149,
        99,
    ),
    ("NVRM: Xid (0000:03:00): 79, GPU has fallen off the bus.", PciAddress(0, 3, 0), 79, None),
    (
        "4,900,5000000,-,caller=T123;NVRM: Xid (PCI:0000:3b:00.0): 94, pid=1234, name=python3, Contained ECC error\n"
        " SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0",
        PciAddress(0, 0x3B, 0),
        94,
        5000000,
    ),
]


@pytest.mark.parametrize(("line", "pci", "xid", "usec"), REAL_LINES)
def test_real_xid_lines_are_read(line: str, pci: PciAddress, xid: int, usec: int | None) -> None:
    parsed = parse_xid(line)
    assert parsed is not None
    assert (parsed.pci, parsed.xid, parsed.usec) == (pci, xid, usec)


@pytest.mark.parametrize(
    "line",
    [
        "6,1,0,-;Linux version 6.8.0-49-generic",
        "4,2,3,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.127.05",
        "NVRM: Xid (PCI:zzzz:01:00): 13, odd",
        "NVRM: Xid (PCI:0000:01:00): , no code",
        "NVRM: Xid (PCI:0000:01:00): 99999999999, too large",
        "",
        "4,,,;",
    ],
)
def test_other_and_odd_lines_are_not_xids(line: str) -> None:
    assert parse_xid(line) is None


def test_a_continuation_line_is_not_part_of_the_message() -> None:
    record = parse_record("6,5,10,-;hello\n SUBSYSTEM=pci")
    assert (record.message, record.usec, record.sequence) == ("hello", 10, 5)


def test_bus_ids_of_nvml_and_nvidia_smi_map_to_the_kernel_log_address() -> None:
    assert parse_bus_id("00000000:CB:00.0") == PciAddress(0, 0xCB, 0)  # nvidia-smi pci.bus_id, NVML busId
    assert parse_bus_id(b"00000019:01:00.0\x00\x00") == PciAddress(0x19, 1, 0)
    assert parse_bus_id("0000:cb:00") == PciAddress(0, 0xCB, 0)
    assert parse_bus_id("[N/A]") is None
    assert parse_bus_id(None) is None
    rows = "0, GPU-a, 00000000:3B:00.0\n1, GPU-b, 00000000:CB:00.0\nGPU 2: [Unknown Error]\n3, [N/A], 0000:DC:00.0\n"
    assert parse_bus_rows(rows) == {
        PciAddress(0, 0x3B, 0): (0, "GPU-a"),
        PciAddress(0, 0xCB, 0): (1, "GPU-b"),
        PciAddress(0, 0xDC, 0): (3, None),
    }


def test_nvml_maps_cards_by_pci_info_and_skips_a_card_that_fails() -> None:
    fake = FakeNvml(
        [
            FakeGpu(uuid="GPU-a", pci_bus_id="00000000:3B:00.0"),
            FakeGpu(uuid="GPU-b", errors={"nvmlDeviceGetPciInfo": NO_PERMISSION}),
        ]
    )
    fake.nvmlInit()
    assert nvml_card_map(fake) == {PciAddress(0, 0x3B, 0): (0, "GPU-a")}


def _write(path: Path, *lines: str) -> None:
    with path.open("a", encoding="utf-8") as handle:
        for line in lines:
            handle.write(line + "\n")


def _reader(path: Path, clock: FakeClock, cards: dict[PciAddress, tuple[int, str | None]]) -> KernelXidReader:
    return KernelXidReader(
        log=DevKmsg(str(path), btime=lambda: BOOT),
        card_map=lambda: cards,
        now=clock.now,
        monotonic=clock.monotonic,
        dmesg_restrict=lambda: "0",
    )


CARDS: CardMap = {PciAddress(0, 0x3B, 0): (0, "GPU-a"), PciAddress(0, 0xCB, 0): (1, "GPU-b")}


def test_xids_logged_before_start_are_read_once_with_their_own_time(tmp_path: Path) -> None:
    clock = FakeClock(datetime(2026, 12, 1, 12, 0, tzinfo=UTC))
    kmsg = tmp_path / "kmsg"
    _write(
        kmsg,
        "6,1,1000,-;Linux version 6.8.0",
        "4,2,3600000000,-;NVRM: Xid (PCI:0000:cb:00): 48, pid=7, name=python3, An uncorrectable ECC error",
        "4,3,3600000500,-;NVRM: Xid (PCI:0000:99:00): 13, pid=7, name=python3, Graphics Exception",  # no card
    )
    reader = _reader(kmsg, clock, CARDS)
    assert reader.start()
    events = reader.poll()
    assert events == [
        XidEvent(index=1, uuid="GPU-b", xid=48, occurred_at=BOOT + timedelta(hours=1)),
    ]
    assert reader.poll() == []  # read once
    _write(kmsg, "4,4,7200000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.")
    assert reader.poll() == [XidEvent(index=0, uuid="GPU-a", xid=79, occurred_at=BOOT + timedelta(hours=2))]
    status = reader.status()
    assert status.readable
    assert status.cards == (0, 1)
    assert (status.xids_read, status.unmapped) == (3, 1)
    assert status.reason is not None
    assert "0000:99:00" in status.reason
    reader.close()


def test_a_restart_reads_the_same_records_with_the_same_times(tmp_path: Path) -> None:
    """The server stores each (node, card, xid, time) once: a replay after a restart must give the same time."""
    clock = FakeClock(datetime(2026, 12, 1, 12, 0, tzinfo=UTC))
    kmsg = tmp_path / "kmsg"
    _write(kmsg, "4,2,3600000000,-;NVRM: Xid (PCI:0000:cb:00): 48, pid=7, name=python3, DBE")
    first = _reader(kmsg, clock, CARDS)
    first.start()
    before = first.poll()
    first.close()
    clock.advance(600)
    second = _reader(kmsg, clock, CARDS)
    second.start()
    assert second.poll() == before
    second.close()


def test_an_unknown_address_asks_for_the_card_map_again_at_most_once_a_minute(tmp_path: Path) -> None:
    clock = FakeClock()
    kmsg = tmp_path / "kmsg"
    cards: dict[PciAddress, tuple[int, str | None]] = {}
    asked: list[int] = []

    def card_map() -> dict[PciAddress, tuple[int, str | None]]:
        asked.append(1)
        return dict(cards)

    reader = KernelXidReader(
        log=DevKmsg(str(kmsg), btime=lambda: BOOT), card_map=card_map, now=clock.now, monotonic=clock.monotonic
    )
    kmsg.touch()
    reader.start()
    cards.update(CARDS)  # the driver came up after the agent
    _write(kmsg, "4,1,1,-;NVRM: Xid (PCI:0000:cb:00): 13, Graphics Exception")
    assert reader.poll() == []  # asked at start, a minute has not passed
    clock.advance(61)
    _write(kmsg, "4,2,2,-;NVRM: Xid (PCI:0000:cb:00): 13, Graphics Exception")
    assert [event.index for event in reader.poll()] == [1]
    assert len(asked) == 2


class _DeniedLog:
    """The kernel log as an unprivileged process sees it: open fails as the kernel makes it fail."""

    path = "/dev/kmsg"

    def __init__(self, code: int) -> None:
        self.code = code

    def open(self) -> None:
        raise PermissionError(self.code, "Operation not permitted", self.path)

    def read(self) -> list[str] | None:
        raise AssertionError("never read after a failed open")

    def boot_time(self) -> datetime | None:
        return BOOT

    def close(self) -> None:
        return None


@pytest.mark.parametrize(("code", "restrict", "words"), [(errno.EPERM, "1", "CAP_SYSLOG"), (errno.EACCES, "0", "root")])
def test_no_permission_to_read_the_kernel_log_is_reported_everywhere(code: int, restrict: str, words: str) -> None:
    clock = FakeClock()
    reader = KernelXidReader(
        log=_DeniedLog(code),
        card_map=lambda: CARDS,
        now=clock.now,
        monotonic=clock.monotonic,
        dmesg_restrict=lambda: restrict,
    )
    assert not reader.start()
    assert reader.poll() == []
    status = reader.status()
    assert not status.readable
    assert status.reason is not None
    assert "no permission to read /dev/kmsg" in status.reason
    assert words in status.reason
    if restrict == "1":
        assert "dmesg_restrict=1" in status.reason
    # under the nvidia-smi fallback the kernel log was the only source: not collected, and why
    xid = with_kernel_log(
        not_collected("no NVML"), readable=False, reason=status.reason, cards=status.cards, nvml=False
    )
    assert xid.state == "not_collected"
    assert xid.reason is not None
    assert "kernel log not read: no permission" in xid.reason
    wire = heartbeat_body(health=None, telemetry=None, xid_events=[], xid_collection=xid)["xid_collection"]
    assert wire["kernel_log"] == status.reason
    report = parse_xid_collection(wire)  # what the node page shows
    assert report is not None
    assert report.kernel_log == status.reason
    assert report.state == "not_collected"


def test_the_probe_reports_the_kernel_log_source_and_its_cards(tmp_path: Path) -> None:
    clock = FakeClock()
    fake = FakeNvml([FakeGpu(uuid="GPU-a", errors={"nvmlDeviceRegisterEvents": NO_PERMISSION}), FakeGpu(uuid="GPU-b")])
    collector = NvmlCollector(clock=clock, loader=lambda: fake)
    assert collector.available()[0]
    selection = Selection(collector=collector, first_health=None, warnings=())
    kmsg = tmp_path / "kmsg"
    kmsg.touch()
    xid = probe_xids(selection, clock, DevKmsg(str(kmsg), btime=lambda: BOOT))
    assert xid.sources == ("nvml", "kernel_log")
    assert xid.state == "collected"  # the card NVML cannot watch is read from the kernel log
    assert xid.watched == (0, 1)
    assert xid.unwatched == ()
    assert xid.reason is not None
    assert "NVML events" in xid.reason
    denied = probe_xids(selection, clock, _DeniedLog(errno.EPERM))
    assert denied.state == "partial"
    assert denied.kernel_log is not None
    report = probe_report(selection, HealthCollection(collector="nvml", collected_at=clock.now()), denied)
    assert any("kernel log not read" in warning for warning in report["warnings"])
    assert report["xid_events"]["sources"] == ["nvml"]


def test_merger_reports_an_xid_seen_by_both_sources_once_with_the_kernel_time() -> None:
    clock = FakeClock()
    out: list[XidEvent] = []
    merger = XidMerger(sink=out.append, monotonic=clock.monotonic, window_sec=5.0)
    merger.hold_nvml_events(True)
    nvml_time, kernel_time = clock.now(), clock.now() - timedelta(seconds=2)
    merger.offer("nvml", XidEvent(index=0, uuid="GPU-a", xid=48, occurred_at=nvml_time))
    assert out == []  # held, waiting for its kernel record
    clock.advance(1)
    merger.offer("kernel_log", XidEvent(index=0, uuid="GPU-a", xid=48, occurred_at=kernel_time))
    assert out == [XidEvent(index=0, uuid="GPU-a", xid=48, occurred_at=kernel_time)]
    # kernel first, NVML second: still once
    merger.offer("kernel_log", XidEvent(index=1, uuid="GPU-b", xid=79, occurred_at=kernel_time))
    merger.offer("nvml", XidEvent(index=1, uuid="GPU-b", xid=79, occurred_at=nvml_time))
    # a burst stays a burst (one-to-one), another card or code is another XID
    merger.offer("nvml", XidEvent(index=0, uuid="GPU-a", xid=13, occurred_at=nvml_time))
    merger.offer("nvml", XidEvent(index=0, uuid="GPU-a", xid=13, occurred_at=nvml_time + timedelta(seconds=1)))
    merger.offer("kernel_log", XidEvent(index=0, uuid="GPU-a", xid=13, occurred_at=kernel_time))
    clock.advance(6)
    merger.flush()  # the second XID 13 had no kernel record within the window: passed on with its own time
    assert [(e.index, e.xid, e.occurred_at) for e in out] == [
        (0, 48, kernel_time),
        (1, 79, kernel_time),
        (0, 13, kernel_time),
        (0, 13, nvml_time + timedelta(seconds=1)),
    ]
    assert merger.duplicates == 3
    # outside the window the same card and code is a new XID
    merger.offer("kernel_log", XidEvent(index=1, uuid="GPU-b", xid=79, occurred_at=kernel_time + timedelta(seconds=9)))
    assert len(out) == 5


def test_merger_passes_nvml_events_through_when_the_kernel_log_is_not_read() -> None:
    clock = FakeClock()
    out: list[XidEvent] = []
    merger = XidMerger(sink=out.append, monotonic=clock.monotonic)
    merger.offer("nvml", XidEvent(index=0, uuid=None, xid=48, occurred_at=clock.now()))
    assert len(out) == 1


def _poll(predicate: Callable[[], bool], timeout_sec: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_sec
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_the_agent_reports_an_xid_from_nvml_and_the_kernel_log_once_and_earlier_ones_too(tmp_path: Path) -> None:
    clock = FakeClock(datetime(2026, 12, 1, 12, 0, tzinfo=UTC))
    fake = FakeNvml([FakeGpu(uuid="GPU-a", pci_bus_id="00000000:3B:00.0"), FakeGpu(uuid="GPU-b")])
    kmsg = tmp_path / "kmsg"
    # raised while the agent was down: only the ring buffer still has it
    _write(kmsg, "4,10,3600000000,-;NVRM: Xid (PCI:0000:3b:00): 94, pid=1234, name=python3, Contained ECC error")
    settings = AgentSettings.load(collector="nvml", heartbeat_interval_seconds=0.05, health_interval_seconds=0.5)
    client = FakePlatformClient()
    agent = build_agent(
        settings,
        runner=FakeCommandRunner(installed=[]),
        clock=clock,
        client=client,
        nvml_loader=lambda: fake,
        kernel_log=DevKmsg(str(kmsg), btime=lambda: BOOT),
    )
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    try:
        _poll(lambda: len(client.stored_xids) == 1)
        _poll(lambda: 0 in fake.registered and 1 in fake.registered)
        fake.emit_xid(1, 48)  # NVML hears it first ...
        _poll(lambda: agent._merger.held == 1)
        _write(kmsg, "4,11,7200000000,-;NVRM: Xid (PCI:0000:02:00): 48, pid=7, name=python3, DBE")  # ... then the log
        _poll(lambda: len(client.stored_xids) == 2)
        _poll(lambda: agent.status().xid.pending == 0)
        status = agent.status().xid_collection
        assert status.state == "collected"
        assert status.sources == ("nvml", "kernel_log")
    finally:
        agent.stop_event.set()
        thread.join(10)
    assert not thread.is_alive()
    stored = sorted((index, xid, at) for _, index, xid, at in client.stored_xids)
    assert stored == [
        (0, 94, (BOOT + timedelta(hours=1)).isoformat()),
        (1, 48, (BOOT + timedelta(hours=2)).isoformat()),
    ]
    assert agent.xid_duplicates == 1
    sent = client.beats[-1][1]["xid_collection"]
    assert sent["sources"] == ["nvml", "kernel_log"]


# --- a card lost from the bus without an XID number -----------------------------------------------------------

LOST_CARDS: CardMap = {
    PciAddress(0, 0xB3, 0): (2, "GPU-lost-b3"),
    PciAddress(0, 0x29, 0): (3, "GPU-lost-29"),
    PciAddress(0, 0x01, 0): (4, "GPU-lost-01"),
}

# Shapes of real logs: the split sentence of driver 570.158.01 as /dev/kmsg (one record, newlines escaped),
# dmesg (continuation lines without a timestamp), the journal (one entry with real newlines); the one-line
# sentence; the short "GPU has fallen off the bus." line of other drivers.
LOST_LOGS = [
    (
        [
            "3,812,1843308145,-;NVRM: The NVIDIA GPU 0000:b3:00.0\\x0aNVRM: (PCI ID: 10de:26b5) installed in this "
            "system has\\x0aNVRM: fallen off the bus and is not responding to commands."
        ],
        2,
        1843308145,
    ),
    (
        [
            "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5) installed in this system has",
            "               NVRM: fallen off the bus and is not responding to commands.",
        ],
        2,
        1843308145,
    ),
    (
        [
            "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0",
            "               NVRM: (PCI ID: 10de:26b5) installed in this system has",
            "               NVRM: fallen off the bus and is not responding to commands.",
        ],
        2,
        1843308145,
    ),
    (
        [
            "kernel: NVRM: The NVIDIA GPU 0000:01:00.0 (PCI ID: 10de:1e07) installed in this\n"
            "NVRM: system has fallen off the bus and is not responding to commands."
        ],
        4,
        None,
    ),
    (
        [
            "NVRM: The NVIDIA GPU 0000:01:00.0 installed in this system has fallen off the bus and is not "
            "responding to commands."
        ],
        4,
        None,
    ),
    (["4,90,7000000,-;NVRM: GPU 0000:29:00.0: GPU has fallen off the bus."], 3, 7000000),
]


@pytest.mark.parametrize(("lines", "index", "usec"), LOST_LOGS)
def test_a_card_lost_without_an_xid_number_is_an_xid_79_on_its_address(
    tmp_path: Path, lines: list[str], index: int, usec: int | None
) -> None:
    clock = FakeClock(datetime(2026, 12, 1, 12, 0, tzinfo=UTC))
    kmsg = tmp_path / "kmsg"
    _write(kmsg, "6,1,1000,-;Linux version 6.8.0", *lines)
    reader = _reader(kmsg, clock, LOST_CARDS)
    reader.start()
    events = reader.poll()
    when = BOOT + timedelta(microseconds=usec) if usec is not None else clock.now()
    uuid = LOST_CARDS[next(a for a, c in LOST_CARDS.items() if c[0] == index)][1]
    assert events == [XidEvent(index=index, uuid=uuid, xid=79, occurred_at=when)]
    reader.close()


def test_one_loss_is_reported_once_whatever_the_number_of_lines(tmp_path: Path) -> None:
    clock = FakeClock(datetime(2026, 12, 1, 12, 0, tzinfo=UTC))
    kmsg = tmp_path / "kmsg"
    _write(
        kmsg,
        "4,10,5000000,-;NVRM: GPU at PCI:0000:29:00: GPU-lost-29",
        "4,11,5000010,-;NVRM: Xid (PCI:0000:29:00): 79, pid=0, GPU has fallen off the bus.",
        "4,12,5000020,-;NVRM: GPU 0000:29:00.0: GPU has fallen off the bus.",
        *(
            f"3,{13 + i},{5000030 + i},-;NVRM: The NVIDIA GPU 0000:29:00.0 installed in this system has fallen off "
            "the bus and is not responding to commands."
            for i in range(50)
        ),
        "4,99,5000500,-;NVRM: Xid (PCI:0000:b3:00): 79, pid=0, GPU has fallen off the bus.",  # another card
    )
    reader = _reader(kmsg, clock, LOST_CARDS)
    reader.start()
    events = reader.poll()
    assert [(e.index, e.xid, e.occurred_at) for e in events] == [
        (3, 79, BOOT + timedelta(microseconds=5000010)),
        (2, 79, BOOT + timedelta(microseconds=5000500)),
    ]
    # an hour of record time later, a loss of the same address is a new loss
    _write(kmsg, "4,100,3605000011,-;NVRM: GPU 0000:29:00.0: GPU has fallen off the bus.")
    assert [e.index for e in reader.poll()] == [3]
    reader.close()


def test_a_lost_card_missing_from_the_tools_answer_keeps_its_address(tmp_path: Path) -> None:
    """The tool stops listing a card that fell off the bus; its address still maps to it."""
    clock = FakeClock()
    kmsg = tmp_path / "kmsg"
    kmsg.touch()
    answers = [dict(LOST_CARDS), {a: c for a, c in LOST_CARDS.items() if c[0] != 3}]
    reader = KernelXidReader(
        log=DevKmsg(str(kmsg), btime=lambda: BOOT),
        card_map=lambda: answers.pop(0) if len(answers) > 1 else answers[0],
        now=clock.now,
        monotonic=clock.monotonic,
    )
    reader.start()
    clock.advance(61)
    _write(kmsg, "4,1,1,-;NVRM: Xid (PCI:0000:77:00): 13, unknown card: the map is asked again")
    assert reader.poll() == []
    _write(kmsg, "4,2,2,-;NVRM: GPU 0000:29:00.0: GPU has fallen off the bus.")
    assert [e.index for e in reader.poll()] == [3]
    reader.close()


@pytest.mark.parametrize(
    "lines",
    [
        ["NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5) installed in this system has"],  # cut short
        [
            "NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5) installed in this system has",
            "a",
            "b",
            "c",
            "d",
            "NVRM: fallen off the bus and is not responding to commands.",  # too far from its start
        ],
        ["NVRM: fallen off the bus and is not responding to commands."],  # no address anywhere
        ["NVRM: The NVIDIA GPU 0000:zz:00.0 fallen off the bus"],
        ["usb 1-1: device fallen off the bus"],
    ],
)
def test_no_card_is_invented_from_partial_or_odd_lines(tmp_path: Path, lines: list[str]) -> None:
    kmsg = tmp_path / "kmsg"
    _write(kmsg, *lines)
    reader = _reader(kmsg, FakeClock(), LOST_CARDS)
    reader.start()
    assert reader.poll() == []
    reader.close()
