"""Lenient typed settings: an invalid value falls back to the field's default with a warning.

A configuration typo must never become the configured behaviour (a retention of ``0`` must not empty
the samples table, H-25), and it must never stop a server from starting either. So every settings group
derives from :class:`LenientSettings`: values that fail validation are dropped, the field keeps its
default, and a warning names the variable, the rejected value and the default used. The warnings are kept
on the instance (``config_warnings``) so that tests and status pages can show them, and are logged once
when the group is loaded.
"""

from __future__ import annotations

from typing import Any, ClassVar, Self

import structlog
from pydantic import AliasChoices, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

_log = structlog.get_logger(__name__)

ENV_PREFIX = "HETEROFLOW_"


def env_names(field: str, *seed_names: str) -> AliasChoices:
    """The environment names a field is read from, in order of precedence.

    The ``HETEROFLOW_``-prefixed name comes first; the design's own names (for example
    ``GPU_HEALTH_RETENTION_DAYS``, ``docs/design/health.md`` H-25) are read exactly as written after it. The bare
    field name is not an environment name: pydantic-settings matches names case-insensitively, so a generic
    ``DATABASE_URL``, ``PORT`` or ``LOG_LEVEL`` in an operator's shell would otherwise configure a service. Keyword
    arguments by field name still work (:class:`LenientSettings` translates them to the field's first name).
    """
    return AliasChoices(f"{ENV_PREFIX}{field.upper()}", *seed_names)


class LenientSettings(BaseSettings):
    """Base of every settings group. See the module docstring for the fallback rule."""

    # populate_by_name stays off: with it, pydantic-settings also reads the bare field name from the environment
    model_config = SettingsConfigDict(extra="ignore", validate_default=True)

    def __init__(self, **values: Any) -> None:
        """Keyword arguments by field name (``database_url=...``) are taken as the field's first alias."""
        fields = type(self).model_fields
        super().__init__(
            **{
                (aliases[0] if key in fields and (aliases := _aliases(type(self), key)) else key): value
                for key, value in values.items()
            }
        )

    config_warnings_: ClassVar[tuple[str, ...]] = ()

    @model_validator(mode="wrap")
    @classmethod
    def _fall_back_on_invalid(cls, data: Any, handler: Any) -> Any:
        if not isinstance(data, dict):
            return handler(data)
        values = dict(data)
        warnings: list[str] = []
        for _ in range(len(cls.model_fields) + 1):
            try:
                instance = handler(values)
            except ValidationError as exc:
                bad_fields = {str(err["loc"][0]) for err in exc.errors() if err["loc"]}
                if not bad_fields:
                    raise
                removed = False
                for field_name in sorted(bad_fields):
                    keys = [key for key in _keys_of(cls, field_name) if key in values]
                    for key in keys:
                        rejected = values.pop(key)
                        removed = True
                    if keys:
                        names = " or ".join(_env_names(cls, field_name))
                        default = cls.model_fields[_field_of(cls, field_name)].get_default(call_default_factory=True)
                        warnings.append(f"invalid value {rejected!r} for {names}; using the default {default!r}")
                if not removed:
                    raise
                continue
            for warning in warnings:
                _log.warning("config.invalid_value", settings=cls.__name__, detail=warning)
            object.__setattr__(instance, "_warnings", tuple(warnings))
            return instance
        raise RuntimeError("settings validation did not converge")  # pragma: no cover

    @property
    def config_warnings(self) -> tuple[str, ...]:
        """The fallbacks applied when this group was loaded, one sentence each."""
        return tuple(getattr(self, "_warnings", ()))

    @classmethod
    def load(cls, **overrides: Any) -> Self:
        """Build the group from the environment (and explicit overrides, which win)."""
        return cls(**overrides)


def _aliases(cls: type[BaseSettings], field_name: str) -> list[str]:
    alias = cls.model_fields[field_name].validation_alias
    if isinstance(alias, AliasChoices):
        return [str(choice) for choice in alias.choices if isinstance(choice, str)]
    if isinstance(alias, str):
        return [alias]
    return []


def _env_names(cls: type[BaseSettings], name: str) -> list[str]:
    field_name = _field_of(cls, name)
    return [alias for alias in _aliases(cls, field_name) if alias.isupper()] or [field_name]


def _keys_of(cls: type[BaseSettings], name: str) -> list[str]:
    """Every input key that feeds the field an error location names (field name or alias)."""
    field_name = _field_of(cls, name)
    return list(dict.fromkeys([field_name, *_aliases(cls, field_name)]))


def _field_of(cls: type[BaseSettings], key: str) -> str:
    if key in cls.model_fields:
        return key
    for field_name in cls.model_fields:
        if key.lower() in (alias.lower() for alias in _aliases(cls, field_name)):
            return field_name
    raise KeyError(key)
