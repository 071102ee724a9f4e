"""A retry-policy table checked key by key (pydantic), and its JSON Schema: loaded only where a table says something.

`[retry]` in trackway.toml and a `--retry-policy FILE` are checked against these models before
anything is recorded; the first bad key or value is refused in one line naming it and what it
takes. supervisor/policy.py builds the policy from what they let through, and imports this module
only to check a table that is not empty: every `submit` and supervisor loads the policy and most
projects set none, so building these models (pydantic with its core) cost each of them about 30 ms
for nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trackway.errors import InputError
from trackway.settings.refusal import shown
from trackway.taxonomy import TerminationReason as R

ACTIONS = ("resume", "stop", "none")
CONDITIONS = ("newer_checkpoint", "changed_memory_fingerprint")
# Bounds of policy fields: far beyond any sensible policy, well short of what breaks a timer or a counter.
MAX_BUDGET = 1000
MAX_BACKOFF_S = 7 * 24 * 3600.0
MAX_BACKOFF_FACTOR = 10.0
MAX_GPU_HOURS = 1e9


class RuleOverride(BaseModel):
    """One `[reasons.NAME]` table of a policy file: any subset of a ReasonRule's fields, each checked."""

    # strict: TOML's "3" is not 3 and true is not 1; no inf/nan: a timer or a budget must end.
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)

    action: Literal["resume", "stop", "none"] | None = None
    budget: Annotated[int, Field(ge=0, le=MAX_BUDGET)] | None = None
    backoff_seconds: Annotated[float, Field(ge=0, le=MAX_BACKOFF_S)] | None = None
    backoff_factor: Annotated[float, Field(ge=1, le=MAX_BACKOFF_FACTOR)] | None = None
    backoff_max_seconds: Annotated[float, Field(ge=0, le=MAX_BACKOFF_S)] | None = None
    requires: Literal["newer_checkpoint", "changed_memory_fingerprint"] | None = None


class PolicyTop(BaseModel):
    """The top level of a policy file: the run-level budget and the per-reason tables."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)

    gpu_hours_budget: Annotated[float, Field(gt=0, le=MAX_GPU_HOURS)] | None = None
    on_data_change: Literal["warn", "stop"] | None = None
    in_pieces: bool | None = None
    reasons: dict[str, Any] | None = None


# What each field takes, said in the one-line refusal of a bad value.
EXPECTED: dict[str, str] = {
    "action": f"one of {', '.join(ACTIONS)}",
    "budget": f"a whole number of retries from 0 to {MAX_BUDGET}",
    "backoff_seconds": f"a finite number of seconds from 0 to {MAX_BACKOFF_S:g}",
    "backoff_factor": f"a finite number from 1 to {MAX_BACKOFF_FACTOR:g}",
    "backoff_max_seconds": f"a finite number of seconds from 0 to {MAX_BACKOFF_S:g}",
    "requires": f"one of {', '.join(CONDITIONS)}",
    "gpu_hours_budget": f"a positive finite number of GPU-hours, at most {MAX_GPU_HOURS:g}",
    "on_data_change": "one of warn, stop",
    "in_pieces": "true or false: the run's time limit is its total, run in pieces of the longest QoS tier",
    "reasons": "a table of [reasons.NAME] tables",
}


def checked(model: type[BaseModel], doc: Mapping[str, Any], source: str, where: str) -> Any:
    """`doc` as `model` holds it; InputError names the first unknown key or bad value, where it is and what it takes."""
    try:
        return model.model_validate(dict(doc))
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0])
        if error["type"] == "extra_forbidden":
            known = ", ".join(model.model_fields)
            raise InputError(f"{source}: {where}{field}: unknown key; expected one of {known}") from None
        raise InputError(f"{source}: {where}{field} {shown(error['input'])}: expected {EXPECTED[field]}") from None


def policy_json_schema() -> dict[str, Any]:
    """The JSON Schema of a policy table (`[retry]` in trackway.toml, a `--retry-policy` file), for editors."""
    schema = PolicyTop.model_json_schema()
    rule = RuleOverride.model_json_schema()
    for name, text in EXPECTED.items():
        for model_schema in (schema, rule):
            if name in model_schema["properties"]:
                model_schema["properties"][name]["description"] = text
    schema["properties"]["reasons"] = {
        "type": "object",
        "description": EXPECTED["reasons"],
        "propertyNames": {"enum": [reason.value for reason in R]},
        "additionalProperties": rule,
    }
    return schema
