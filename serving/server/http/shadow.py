"""``GET /v1/shadow``: how the shadow candidate (``mtgate serve --shadow``) compares with the production model on the
requests it shadowed (``serving.server.shadow``): agreement, chrF/BLEU/length-ratio means and quantiles, both
latencies, cross-likelihood, the most-disagreeing recent pairs, and what was shed. ``POST /v1/shadow/canary``: an
operator sets the canary's fraction (above 0 re-arms a rolled-back canary), behind the API key."""

from __future__ import annotations

import math
from typing import Any

from fastapi import APIRouter, Request

from serving.engine.errors import InvalidInput
from serving.server.client_json import parse_client_json
from serving.server.errors import CanaryNotConfigured, ShadowNotConfigured
from serving.server.http.deps import ApiKeyDep, ServiceDep
from serving.server.http.schemas import error_responses
from serving.server.service import TranslationService
from serving.server.shadow import Shadow

router = APIRouter(prefix="/v1", tags=["v1"])

_CANARY_BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": {
    "type": "object", "required": ["fraction"],
    "properties": {"fraction": {"type": "number", "minimum": 0, "maximum": 1}}}}}}}


def _shadow(service: TranslationService) -> Shadow:
    if service.shadow is None:
        raise ShadowNotConfigured("this server runs no shadow candidate (start it with --shadow CANDIDATE)")
    return service.shadow


@router.get("/shadow", responses=error_responses(404))
async def shadow_summary(service: ServiceDep) -> dict[str, Any]:
    """The shadow candidate's comparison with production so far (404 without ``--shadow``)."""
    return _shadow(service).to_json()


@router.post("/shadow/canary", openapi_extra=_CANARY_BODY, responses=error_responses(400, 401, 404))
async def set_canary_fraction(request: Request, service: ServiceDep, _: ApiKeyDep) -> dict[str, Any]:
    """Set the canary's fraction, ``{"fraction": F}`` with 0 <= F <= 1: above 0 re-arms a canary that was rolled back
    (its rollback state and sliding window cleared), 0 turns it off. Answers what ``GET /v1/shadow`` shows. 404
    without ``--shadow`` or without a canary (``--canary-fraction``), 400 for a body that is not that object."""
    shadow = _shadow(service)
    if shadow.canary is None:
        raise CanaryNotConfigured("this server runs no canary (start it with --canary-fraction F, F > 0)")
    body = parse_client_json(await request.body(), "the request body")
    fraction = body.get("fraction") if isinstance(body, dict) else None
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not math.isfinite(fraction):
        raise InvalidInput('the request body must be a JSON object {"fraction": F} with a number 0 <= F <= 1')
    shadow.canary.set_fraction(float(fraction))
    return shadow.to_json()
