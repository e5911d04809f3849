"""The floor of the heartbeat route on this stack: the work no heartbeat handler can avoid.

A bare Starlette app under uvicorn (same server, same HTTP parser as ``heteroflow server``) that checks the
bearer token against a set, decodes the JSON body and validates it with the project's own ``Heartbeat`` schema,
then answers 200. ``bench/ingest.py`` drives it with the same client and the same agent bodies as the real
server, in the same run, and prints the ratio. With ``FLOOR_DECODER=typed`` (``bench/ingest.py --floor-decoder
typed``) it decodes with the server's own typed decoder of the common agent body instead (``WIRE_BEAT``, msgspec:
decoding, types and bounds in one native step), a stricter floor than the schema's. Run by the bench, not by hand::

    FLOOR_TOKEN=... [FLOOR_DECODER=typed] python -m uvicorn floor_app:app --app-dir bench --port N
"""

from __future__ import annotations

import json
import os

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from heteroflow.contracts.heartbeat import Heartbeat
from heteroflow.health.beat_stats import WIRE_BEAT, WireBeat

TOKENS = {f"Bearer {os.environ['FLOOR_TOKEN']}"}
TYPED = os.environ.get("FLOOR_DECODER", "schema") == "typed"


async def heartbeat(request: Request) -> JSONResponse:
    if request.headers.get("authorization") not in TOKENS:
        return JSONResponse({"detail": "unauthorized"}, status_code=401)
    body = await request.body()
    beat: Heartbeat | WireBeat = WIRE_BEAT.decode(body) if TYPED else Heartbeat.model_validate(json.loads(body))
    return JSONResponse({"status": "ok", "stats": len(beat.gpu_stats)})


app = Starlette(routes=[Route("/api/v1/nodes/{node_id}/heartbeat", heartbeat, methods=["POST"])])
