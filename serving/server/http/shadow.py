"""``GET /v1/shadow``: how the shadow candidate (``mtgate serve --shadow``) compares with the production model on the
requests it shadowed (``serving.server.shadow``): agreement, chrF/BLEU/length-ratio means and quantiles, both
latencies, cross-likelihood, the most-disagreeing recent pairs, and what was shed."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from serving.server.errors import ShadowNotConfigured
from serving.server.http.deps import ServiceDep
from serving.server.http.schemas import error_responses

router = APIRouter(prefix="/v1", tags=["v1"])


@router.get("/shadow", responses=error_responses(404))
async def shadow_summary(service: ServiceDep) -> dict[str, Any]:
    """The shadow candidate's comparison with production so far (404 without ``--shadow``)."""
    if service.shadow is None:
        raise ShadowNotConfigured("this server runs no shadow candidate (start it with --shadow CANDIDATE)")
    return service.shadow.to_json()
