"""The platform server's hardware-events feed (``GET /api/v1/hardware-events``, ``docs/api.md``).

The server serves it (``heteroflow.platform_server.routes.hardware_events``) and the serving controller's GPU-health
source polls it (``heteroflow.serving.controller.monitor.gpu_health``): XID events and increases of a card's
uncorrectable-ECC or row-remap-failure counter, read forward from an opaque cursor.

The server answers a :class:`HardwareFeedPage`. A poller reads the same page in two steps — the envelope as a
:class:`HardwareFeedEnvelope`, then each event on its own as a :class:`HardwareFeedEvent` — so that one
unreadable event (a bad entry from one node) is one problem and never costs the other events of its page.
Numbers, names and flags are strict: ``"79"`` is not the XID 79 and ``true`` is not 1.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field, StrictBool, StrictInt, StrictStr

from heteroflow.contracts.heartbeat import NodeSource

FEED_PATH = "/api/v1/hardware-events"

HardwareEventKind = Literal["xid", "ecc_uncorrected", "remap_failure"]


class HardwareFeedEvent(BaseModel):
    node_id: StrictStr
    node_name: StrictStr = Field(description="The node's hostname (Kubernetes node name on a cluster).")
    gpu_index: StrictInt
    uuid: StrictStr | None = Field(description="The card's uuid (GPU-…); null when the agent could not read it.")
    kind: HardwareEventKind
    value: StrictInt = Field(description="The XID code, or the counter's new value.")
    previous: StrictInt | None = Field(description="The counter's value before the increase; null for an XID.")
    at: datetime
    tenant_id: StrictStr | None = Field(default=None, description="The node's tenant; null for a node without one.")
    card_known: StrictBool = Field(
        default=True,
        description=(
            "False for an XID naming a card uuid the node never reported in a health reading: no evidence about "
            "a card the serving plane runs on (the controller's source skips it)."
        ),
    )
    identity_changed: StrictBool = Field(
        default=False,
        description=(
            "True when the node's credential was issued again shortly before the server got this event (within "
            "HETEROFLOW_NODE_REISSUE_HOLD_SECONDS): who speaks for the node changed, so the event is held for an "
            "operator (the controller's source never reconfigures the serving plane on it)."
        ),
    )


class HardwareFeedPage(BaseModel):
    source: NodeSource
    events: list[HardwareFeedEvent]
    next_cursor: StrictStr = Field(description="Pass it back as ?cursor= to read on from here.")
    more: StrictBool = Field(description="A page limit was reached: ask again at once with next_cursor.")


class HardwareFeedEnvelope(BaseModel):
    """A :class:`HardwareFeedPage` as a poller takes it: the cursor and ``more`` checked, each event left as it
    came, to be read on its own with :class:`HardwareFeedEvent`."""

    events: list[Any]
    next_cursor: StrictStr
    more: StrictBool
