"""What every config section shares: the error type, sizes, the strict base model."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


class ConfigError(Exception):
    """A config problem, already phrased for the user (field and file)."""


_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(text: str | int) -> int:
    """Bytes in a size like `512MB`, `16GiB` or `1048576`; ValueError if malformed."""
    if isinstance(text, int):
        return text
    t = str(text).strip().upper().replace(" ", "")
    num = t.rstrip("KMGTIB")
    unit = t[len(num):]
    try:
        value = float(num)
    except ValueError:
        value = -1.0
    if unit not in _UNITS or value < 0:
        raise ValueError(f"'{text}' is not a size (use e.g. 512MB or 16GiB)")
    return int(value * _UNITS[unit])


_PositiveFinite = Annotated[float, Field(gt=0, allow_inf_nan=False)]  # used by AdmissionConfig


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
