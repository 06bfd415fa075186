"""The JSON API's users (reference §20): a caller erasing their own data."""

from __future__ import annotations

from typing import Any

from tether.api.routes import AUTH, Caller, EngineDep, json_router, responses
from tether.api.schemas import ErasedOut

router = json_router()


@router.delete(
    "/users/me/data",
    response_model=ErasedOut,
    tags=["users"],
    summary="Erase the caller's data",
    description=(
        "Cancels the caller's runs in flight, then deletes every run, thread, schedule, "
        "key and session of theirs and the account itself: the key that asked no longer "
        "authenticates. The caller's audit records keep their seq, time, kind and outcome, "
        "with a digest of the name. Counts what went; zeros when nothing was stored."
    ),
    responses=responses(
        (401, AUTH),
        (429, "`too_many_attempts`: this key failed too often lately (an erased key, sent again)"),
    ),
)
async def erase_my_data(user: Caller, engine: EngineDep) -> dict[str, Any]:
    erased = await engine.operator.erase_user(user, by=user)
    return {"erased": erased.to_json()}
