"""Unit-test fakes for machine profiles (agentserve/profiles): one kind of machine's
profile replaced for the length of a test, through pytest's monkeypatch."""

from __future__ import annotations

from typing import Any

from agentserve import profiles

_SOURCE = {"command": "a unit test", "date": "2026-01-01", "rows": "none"}


def set_profile(monkeypatch, machine: str, **sections: Any) -> None:
    """`machine`'s profile with each named section's values replaced (None drops the
    section); the shipped profile's other sections stay, an unprofiled kind gets one."""
    shipped = profiles.machine_profile(machine)
    data = shipped.model_dump() if shipped is not None else {"machine": machine}
    for name, values in sections.items():
        data[name] = None if values is None else {"values": values, "source": _SOURCE}
    _replace(monkeypatch, machine, profiles.MachineProfile.model_validate(data))


def drop_profile(monkeypatch, machine: str) -> None:
    """`machine` as a kind of machine nothing was measured on."""
    _replace(monkeypatch, machine, None)


def _replace(monkeypatch, machine: str, fake) -> None:
    original = profiles.machine_profile

    def machine_profile(kind: str, directory=profiles.PROFILE_DIR):
        return fake if kind == machine else original(kind, directory)

    monkeypatch.setattr(profiles, "machine_profile", machine_profile)
