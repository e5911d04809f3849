"""XIDs from the kernel log (``NVRM: Xid (PCI:…): NN, …``), the second XID source next to NVML events.

The NVIDIA driver writes every XID to the kernel log as well as to NVML's event sets, and the kernel keeps the
log in a ring buffer that outlives the agent: reading ``/dev/kmsg`` from the first record still in the buffer
recovers XIDs raised while the agent was down, and under the nvidia-smi fallback (no NVML events) it is the only
XID source there is. The line formats seen on real drivers (public captures):

- ``NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception …``
- ``NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, Ch 00000008, errorString …``
- ``NVRM: Xid (PCI:0000:01:00): 31, Ch 00000003, engmask 00000101, intr 10000000`` (no pid/name)
- ``NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (…)`` (NVLink, no pid)
- ``NVRM: Xid (0000:01:00): 79, …`` (old drivers, without ``PCI:``)

behind ``/dev/kmsg``'s ``priority,sequence,usec,flags[,…];`` record prefix, dmesg's ``[seconds.micros]`` prefix
or the journal's ``kernel:`` prefix. The parser is pure and never raises; the reader is a small port
(:class:`KernelLog`) so tests feed it a temporary file.

A card lost from the bus without an XID number (:class:`CardLostTracker`, pure, never raises). The driver
does not always print ``NVRM: Xid (…): 79`` when a card falls off the bus. Real logs show:

- ``NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5) installed in this system has`` /
  ``NVRM: fallen off the bus and is not responding to commands.`` — one ``printk`` whose text carries newlines
  (driver 570.158.01; the open kernel modules print ``The NVIDIA GPU %04x:%02x:%02x.%x\\n(PCI ID: …) installed in
  this system has\\nfallen off the bus…``): ``/dev/kmsg`` escapes the newlines as ``\\x0a`` in one record, dmesg
  shows two or three lines (the later ones without a timestamp), the journal one entry with real newlines;
- the same sentence on one line (``… installed in this system has fallen off the bus and is not responding …``);
- ``NVRM: GPU 0000:29:00.0: GPU has fallen off the bus.`` (other drivers, one line), and
  ``NVRM: GPU at PCI:0000:29:00: GPU-…`` lines around an ``Xid … 79``.

Each becomes the same card-lost event as XID 79 on that PCI address. One loss prints several such lines (the
sentence, an ``Xid 79``, and a flapping eGPU link thousands of times), so a card-lost event is reported once per
address: another one is reported only after :data:`LOST_REPEAT_USEC` of record time (or, where records carry no
time, after :data:`LOST_REPEAT_LINES` lines).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Final, Protocol

from heteroflow.agent.readings import XidEvent

DEV_KMSG: Final = "/dev/kmsg"
MAX_RECORD_BYTES: Final = 8192
MAX_LINE_CHARS: Final = 4096
_MAX_USEC: Final = 10**17  # ~3,000 years of uptime: anything larger is not a timestamp

_KMSG_PREFIX: Final = re.compile(r"^\s*(\d{1,3}),(\d{1,20}),(\d{1,20}),[^;]*;(.*)$", re.DOTALL)
_DMESG_PREFIX: Final = re.compile(r"^\s*\[\s*(\d{1,12})\.(\d{1,9})\]\s?(.*)$", re.DOTALL)
_XID: Final = re.compile(
    r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F]{1,8}):([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})(?:\.([0-7]))?\): (\d{1,9})\b"
)


@dataclass(frozen=True, slots=True, order=True)
class PciAddress:
    """A card's PCI location without the function number (the kernel log names domain:bus:device only)."""

    domain: int
    bus: int
    device: int

    def __str__(self) -> str:
        return f"{self.domain:04x}:{self.bus:02x}:{self.device:02x}"


_BUS_ID: Final = re.compile(r"^\s*([0-9a-fA-F]{1,8}):([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})(?:\.[0-7])?\s*$")


def parse_bus_id(value: object) -> PciAddress | None:
    """NVML's ``busId`` / nvidia-smi's ``pci.bus_id`` (``00000000:3B:00.0``) as a :class:`PciAddress`. Never raises."""
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    if not isinstance(value, str):
        return None
    match = _BUS_ID.match(value.rstrip("\x00"))
    if match is None:
        return None
    return PciAddress(int(match.group(1), 16), int(match.group(2), 16), int(match.group(3), 16))


@dataclass(frozen=True, slots=True)
class KernelRecord:
    """One kernel log record: its text and, where the prefix gave it, microseconds since boot."""

    message: str
    usec: int | None = None
    sequence: int | None = None


@dataclass(frozen=True, slots=True)
class KernelXid:
    """One ``NVRM: Xid`` line: the card's PCI address, the XID code and the record's time since boot."""

    pci: PciAddress
    xid: int
    usec: int | None
    sequence: int | None


def parse_record(line: str) -> KernelRecord:
    """A record of ``/dev/kmsg`` (``6,123,456789,-;text``), a dmesg line (``[  12.345678] text``) or bare text."""
    line = line[:MAX_LINE_CHARS]
    match = _KMSG_PREFIX.match(line)
    if match is not None:
        usec = int(match.group(3))
        text = match.group(4).split("\n", 1)[0]  # continuation lines (" KEY=value") are not the message
        return KernelRecord(message=text, usec=usec if usec < _MAX_USEC else None, sequence=int(match.group(2)))
    match = _DMESG_PREFIX.match(line)
    if match is not None:
        micros = int(match.group(1)) * 1_000_000 + int(match.group(2).ljust(6, "0")[:6])
        return KernelRecord(message=match.group(3), usec=micros if micros < _MAX_USEC else None)
    return KernelRecord(message=line)


def parse_xid(line: str) -> KernelXid | None:
    """The XID of one kernel log line, or ``None`` when the line is not an ``NVRM: Xid`` line. Never raises."""
    if "Xid" not in line:
        return None
    return xid_of(parse_record(line))


def xid_of(record: KernelRecord) -> KernelXid | None:
    """The XID of one parsed record, or ``None``. Never raises."""
    if "Xid" not in record.message:
        return None
    match = _XID.search(record.message)
    if match is None:
        return None
    xid = int(match.group(5))
    if xid > 2**31 - 1:
        return None
    pci = PciAddress(int(match.group(1), 16), int(match.group(2), 16), int(match.group(3), 16))
    return KernelXid(pci=pci, xid=xid, usec=record.usec, sequence=record.sequence)


CARD_LOST_XID: Final = 79
"""The XID a lost card is reported as: the controller's L6 card fault, stored and shown as XID 79."""
LOST_REPEAT_USEC: Final = 3_600 * 1_000_000
"""A second loss of the same address within an hour of record time is the same loss (a card lost from the bus
stays lost until the node is serviced; an hour keeps a re-seated card's next loss visible)."""
LOST_REPEAT_LINES: Final = 10_000
"""Without record times (bare lines), the same address is reported again only after this many lines."""
PENDING_RECORDS: Final = 4
"""How many records after ``The NVIDIA GPU <addr>`` may carry ``fallen off the bus`` (the split sentence)."""

_ADDRESS: Final = r"(?:PCI:)?([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.[0-7])?"
_THE_GPU: Final = re.compile(r"NVRM: The NVIDIA GPU " + _ADDRESS)
_GPU_PREFIX: Final = re.compile(r"NVRM: GPU (?:at )?" + _ADDRESS + r":")
_FALLEN: Final = "fallen off the bus"


def _address(match: re.Match[str]) -> PciAddress:
    return PciAddress(int(match.group(1), 16), int(match.group(2), 16), int(match.group(3), 16))


@dataclass(frozen=True, slots=True)
class _Pending:
    pci: PciAddress
    record: KernelRecord
    left: int


@dataclass(slots=True)
class CardLostTracker:
    """Reads kernel records in order and says when one (or a few) of them report a card lost from the bus.

    :meth:`feed` takes each record's message (XID lines included, so an ``Xid 79`` and the sentence that
    follows it are one loss) and returns the card-lost event to report, or ``None``.
    """

    _pending: _Pending | None = None
    _reported: dict[PciAddress, tuple[int | None, int]] = field(default_factory=dict)
    _lines: int = 0

    def feed(self, record: KernelRecord, xid: KernelXid | None = None) -> KernelXid | None:
        """The card-lost event this record completes, if it is not a repeat of a loss already reported.

        ``xid``: the record's ``NVRM: Xid`` reading, when it has one; an XID 79 is returned (or suppressed as a
        repeat) here too, so that the caller reports every card loss through one gate.
        """
        self._lines += 1
        if xid is not None:
            if xid.xid != CARD_LOST_XID:
                return xid
            return self._report(xid.pci, record)
        if self._pending is None and "NVRM" not in record.message:
            return None  # nearly every kernel line: nothing to do
        text = record.message.replace("\\x0a", "\n")
        found = self._match(text, record)
        if found is not None:
            self._pending = None
            return self._report(found[0], found[1])
        return None

    def _match(self, text: str, record: KernelRecord) -> tuple[PciAddress, KernelRecord] | None:
        the_gpu = _THE_GPU.search(text)
        if the_gpu is not None:
            if _FALLEN in text[the_gpu.end() :]:
                return _address(the_gpu), record
            self._pending = _Pending(_address(the_gpu), record, PENDING_RECORDS)  # the sentence goes on
            return None
        if _FALLEN in text:
            prefixed = _GPU_PREFIX.search(text)
            if prefixed is not None:
                return _address(prefixed), record
            if self._pending is not None:
                return self._pending.pci, self._pending.record  # the time of the sentence's first line
            return None
        if self._pending is not None:
            left = self._pending.left - 1
            self._pending = _Pending(self._pending.pci, self._pending.record, left) if left > 0 else None
        return None

    def _report(self, pci: PciAddress, record: KernelRecord) -> KernelXid | None:
        last = self._reported.get(pci)
        if last is not None:
            last_usec, last_line = last
            if record.usec is not None and last_usec is not None:
                if 0 <= record.usec - last_usec < LOST_REPEAT_USEC:
                    return None
            elif self._lines - last_line < LOST_REPEAT_LINES:
                return None
        if len(self._reported) >= 4096:
            self._reported.clear()
        self._reported[pci] = (record.usec, self._lines)
        return KernelXid(pci=pci, xid=CARD_LOST_XID, usec=record.usec, sequence=record.sequence)


class KernelLog(Protocol):
    """The port to the kernel log: ``/dev/kmsg`` in production (:class:`DevKmsg`), a temporary file in tests."""

    def open(self) -> None:
        """Open from the first record still in the ring buffer. Raises ``OSError`` (``PermissionError``)."""
        ...

    def read(self) -> list[str] | None:
        """The records available now (possibly none), or ``None`` once the log has ended. Raises ``OSError``."""
        ...

    def boot_time(self) -> datetime | None:
        """The wall-clock time the records' microseconds count from, or ``None`` when unknown."""
        ...

    def close(self) -> None: ...


def read_btime(path: str = "/proc/stat") -> datetime | None:
    """The kernel's boot time (``btime`` of ``/proc/stat``): stable across agent restarts, so a record re-read
    after a restart gets the same time and the server stores it once."""
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("btime "):
                    return datetime.fromtimestamp(int(line.split()[1]), UTC)
    except (OSError, ValueError, IndexError, OverflowError):
        return None
    return None


class DevKmsg:
    """``/dev/kmsg`` (or any file of records, one per line), read without blocking.

    Opening ``/dev/kmsg`` positions the reader at the first record still in the ring buffer, so what the driver
    logged before the agent started is read too. Each ``read(2)`` of ``/dev/kmsg`` returns one record; ``EAGAIN``
    means none is waiting, ``EPIPE`` that the ring buffer overwrote records before they were read (counted in
    :attr:`overwritten`, then reading goes on). A regular file (tests) is split on newlines, and its end means
    "nothing more now", so lines appended later are read by the next call.
    """

    def __init__(self, path: str = DEV_KMSG, *, btime: Callable[[], datetime | None] = read_btime) -> None:
        self.path = path
        self._btime = btime
        self._fd: int | None = None
        self._partial = b""
        self.overwritten = 0

    def open(self) -> None:
        self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)

    def read(self) -> list[str] | None:
        if self._fd is None:
            return None
        lines: list[str] = []
        for _ in range(1024):  # bounded per call; the caller comes back
            try:
                chunk = os.read(self._fd, MAX_RECORD_BYTES)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    self.overwritten += 1
                    continue
                if exc.errno == errno.EINVAL:  # a record longer than the buffer: skip it
                    continue
                raise
            if not chunk:
                break
            data = self._partial + chunk
            *complete, self._partial = data.split(b"\n")
            if len(self._partial) > MAX_RECORD_BYTES:
                self._partial = b""
            lines.extend(line.decode("utf-8", "replace") for line in complete)
        return lines

    def boot_time(self) -> datetime | None:
        return self._btime()

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


def permission_reason(exc: OSError, path: str, *, dmesg_restrict: str | None) -> str:
    """Why the kernel log cannot be read, in the operator's terms."""
    if isinstance(exc, PermissionError) or exc.errno in (errno.EPERM, errno.EACCES):
        why = f"no permission to read {path} ({os.strerror(exc.errno or errno.EPERM)})"
        if dmesg_restrict == "1":
            why += "; kernel.dmesg_restrict=1: the agent needs CAP_SYSLOG"
        else:
            why += "; run the agent as root or with CAP_SYSLOG"
        return why
    if exc.errno == errno.ENOENT:
        return f"{path} does not exist (mount the host's /dev/kmsg into the agent's container)"
    return f"cannot read {path} ({os.strerror(exc.errno) if exc.errno else type(exc).__name__})"


def read_dmesg_restrict(path: str = "/proc/sys/kernel/dmesg_restrict") -> str | None:
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return None


CardMap = dict[PciAddress, tuple[int, str | None]]
"""PCI address → (card index, uuid), from what the collector already read (NVML busId, nvidia-smi pci.bus_id)."""


@dataclass(frozen=True, slots=True)
class KernelLogStatus:
    readable: bool
    reason: str | None
    """Why the kernel log is not read, or what is wrong with it (unmapped addresses); ``None`` when all is well."""
    cards: tuple[int, ...] = ()
    """Card indexes whose PCI address is known, so their kernel-log XIDs can be reported."""
    xids_read: int = 0
    unmapped: int = 0
    """XID lines whose PCI address matches no card (reported nowhere, counted here)."""
    lost: tuple[int, ...] = ()
    """Card indexes the kernel log reported lost from the bus (XID 79 or the card-lost lines) since it was opened."""


class KernelXidReader:
    """Reads ``NVRM: Xid`` lines through a :class:`KernelLog` and turns them into :class:`XidEvent`s.

    An event's time is the boot time plus the record's microseconds since boot (so the records replayed from the
    ring buffer after a restart carry their own time, not the time they were read); without either, the time the
    line was read. Lines are mapped to cards by PCI address through ``card_map`` (asked again when an address is
    unknown, at most once a minute). Never raises from :meth:`poll`.
    """

    REMAP_INTERVAL_SEC: Final = 60.0

    def __init__(
        self,
        *,
        log: KernelLog,
        card_map: Callable[[], CardMap],
        now: Callable[[], datetime],
        monotonic: Callable[[], float],
        dmesg_restrict: Callable[[], str | None] = read_dmesg_restrict,
    ) -> None:
        self._log = log
        self._card_map = card_map
        self._now = now
        self._monotonic = monotonic
        self._dmesg_restrict = dmesg_restrict
        self._lock = threading.Lock()
        self._cards: CardMap = {}
        self._mapped_at: float | None = None
        self._open = False
        self._ended = False
        self._reason: str | None = "the kernel log has not been opened"
        self._boot: datetime | None = None
        self._xids = 0
        self._unmapped = 0
        self._unmapped_addresses: set[PciAddress] = set()
        self._lost = CardLostTracker()
        self._lost_cards: set[int] = set()

    def start(self) -> bool:
        """Open the log at the first record still buffered; ``False`` (with the reason in :meth:`status`) if not."""
        path = getattr(self._log, "path", DEV_KMSG)
        try:
            self._log.open()
        except OSError as exc:
            with self._lock:
                self._reason = permission_reason(exc, path, dmesg_restrict=self._dmesg_restrict())
            return False
        self._boot = self._log.boot_time()
        self._refresh_cards()
        with self._lock:
            self._open = True
            self._reason = None
        return True

    def _refresh_cards(self) -> None:
        try:
            cards = self._card_map()
        except Exception:  # a failing collector seam must not stop the reader
            cards = {}
        with self._lock:
            # merged, not replaced: a card lost from the bus drops out of the tool's answer, and the lines that
            # report its loss still name its address
            self._cards = {**self._cards, **cards}
            self._mapped_at = self._monotonic()

    def status(self) -> KernelLogStatus:
        with self._lock:
            reason = self._reason
            if self._open and self._unmapped_addresses:
                addresses = ", ".join(str(a) for a in sorted(self._unmapped_addresses)[:8])
                reason = f"{self._unmapped} XID line(s) name a PCI address of no known card ({addresses})"
            return KernelLogStatus(
                readable=self._open and not self._ended,
                reason=reason,
                cards=tuple(sorted(index for index, _ in self._cards.values())),
                xids_read=self._xids,
                unmapped=self._unmapped,
                lost=tuple(sorted(self._lost_cards)),
            )

    def poll(self) -> list[XidEvent]:
        """The XID events among the records available now (none when the log cannot be read)."""
        if not self._open or self._ended:
            return []
        try:
            lines = self._log.read()
        except OSError as exc:
            with self._lock:
                self._open = False
                self._reason = f"reading the kernel log failed ({os.strerror(exc.errno) if exc.errno else exc})"
            return []
        if lines is None:
            with self._lock:
                self._ended = True
                self._reason = "the kernel log ended"
            return []
        events: list[XidEvent] = []
        for line in lines:
            record = parse_record(line)
            parsed = self._lost.feed(record, xid_of(record))  # XID 79 and the card-lost sentences: once per loss
            if parsed is None:
                continue
            event = self._event(parsed)
            if event is not None:
                events.append(event)
        return events

    def _event(self, parsed: KernelXid) -> XidEvent | None:
        card = self._cards.get(parsed.pci)
        if card is None and (self._mapped_at is None or self._monotonic() - self._mapped_at >= self.REMAP_INTERVAL_SEC):
            self._refresh_cards()
            card = self._cards.get(parsed.pci)
        with self._lock:
            self._xids += 1
            if card is None:
                self._unmapped += 1
                if len(self._unmapped_addresses) < 64:
                    self._unmapped_addresses.add(parsed.pci)
                return None
        occurred_at = self._now()
        if self._boot is not None and parsed.usec is not None:
            try:
                occurred_at = self._boot + timedelta(microseconds=parsed.usec)
            except OverflowError:
                occurred_at = self._now()
        index, uuid = card
        if parsed.xid == CARD_LOST_XID:
            with self._lock:
                self._lost_cards.add(index)
        return XidEvent(index=index, uuid=uuid, xid=parsed.xid, occurred_at=occurred_at)

    def close(self) -> None:
        with self._lock:
            self._open = False
        with contextlib.suppress(OSError):
            self._log.close()
