"""The device registry: built-in data files, user data files, and devices registered in code.

Lookup order and rules:

- built-in files ``dippm_nas/devices/data/*.toml`` (one device per file);
- user files ``*.toml`` in every directory listed in ``$DIPPM_NAS_DEVICE_DIR`` (``os.pathsep``-separated),
  read again whenever the variable changes;
- devices passed to :func:`register_device`.

Ids are case-insensitive: every id is stored in lower case (a user file's ``id = "MyGPU"`` is the device
``mygpu``, found as ``MyGPU`` too). A user file that cannot be used (unreadable, not valid TOML, no
``id``; a FIFO, a directory or anything else that is not a regular file is never opened for reading) is
skipped with a warning (once) and named in the error of an unknown id; it affects no other device. A
user file's fields are checked against the schema of :class:`Device` when its id is first asked for
(an error naming the file, the field, the value and what is expected). An id defined twice (a user
file shadowing a built-in one, two files, or a second registration) is an error, raised when that id is
asked for, that names both origins: a silently replaced device would change every prediction.
A file whose ``measured`` key lists fields (``host-cpu``) is completed by the host microbenchmark at
its first :func:`get_device`.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from dippm_nas._toml import loads_toml
from dippm_nas._json import read_regular_file
from dippm_nas._logging import WarnOnce
from dippm_nas.devices._device import Device, device_from_dict
from dippm_nas.devices._host import host_facts
from dippm_nas.errors import DeviceError

__all__ = ["DEVICE_DIR_ENV", "get_device", "list_devices", "register_device", "unregister_device", "resolve_device"]

logger = logging.getLogger(__name__)

#: Environment variable naming directories of user device files.
DEVICE_DIR_ENV = "DIPPM_NAS_DEVICE_DIR"
#: The largest device file read, bytes (a built-in file is under 8 KB).
MAX_DEVICE_FILE_BYTES = 1 << 20

_lock = threading.RLock()
_builtin: dict[str, tuple[dict[str, Any], str]] | None = None
_user: dict[str, tuple[dict[str, Any], str]] = {}
_user_env: str | None = None
_registered: dict[str, Device] = {}
_built: dict[str, Device] = {}
#: user files skipped on the last read: ``{origin: why}``
_skipped: dict[str, str] = {}
#: ids defined twice among the user files of the last read: ``{id: the message naming both origins}``
_user_conflicts: dict[str, str] = {}
_warn_once = WarnOnce(logger)


def _read_toml(text: str, origin: str) -> dict[str, Any]:
    return loads_toml(text, origin, DeviceError)  # bounded nesting: a deep file is an error, not a RecursionError


def _check_id(d: Mapping[str, Any], origin: str) -> str:
    """The file's id in lower case (ids are case-insensitive)."""
    dev_id = d.get("id")
    if not isinstance(dev_id, str) or not dev_id.strip():
        raise DeviceError(f"{origin}: a device file must set id = \"...\" (a string), got {dev_id!r}")
    return dev_id.strip().lower()


def _load_builtin() -> dict[str, tuple[dict[str, Any], str]]:
    global _builtin
    if _builtin is None:
        found: dict[str, tuple[dict[str, Any], str]] = {}
        data = resources.files("dippm_nas.devices") / "data"
        for entry in sorted(data.iterdir(), key=lambda p: p.name):
            if not entry.name.endswith(".toml"):
                continue
            origin = f"built-in {entry.name}"
            d = _read_toml(entry.read_text(encoding="utf-8"), origin)
            dev_id = _check_id(d, origin)
            if dev_id in found:
                raise DeviceError(f"device id {dev_id!r} is defined twice: {found[dev_id][1]} and {origin}")
            found[dev_id] = (d, origin)
        _builtin = found
    return _builtin


def _skip(origin: str, why: str) -> None:
    _skipped[origin] = why
    _warn_once(f"{origin}:{why}", "%s: %s; skipped (the other devices are not affected)", origin, why)


def _load_user() -> dict[str, tuple[dict[str, Any], str]]:
    global _user, _user_env
    env = os.environ.get(DEVICE_DIR_ENV, "")
    if env == _user_env:
        return _user
    found: dict[str, tuple[dict[str, Any], str]] = {}
    _skipped.clear()
    _user_conflicts.clear()
    for part in [p for p in env.split(os.pathsep) if p.strip()]:
        directory = Path(part).expanduser()
        if not directory.is_dir():
            _skip(f"${DEVICE_DIR_ENV} entry {str(directory)!r}", "not a directory")
            continue
        for path in sorted(directory.glob("*.toml")):
            origin = f"user file {path}"
            try:
                text = read_regular_file(path, "device file", DeviceError, max_bytes=MAX_DEVICE_FILE_BYTES
                                         ).decode("utf-8")
            except (DeviceError, UnicodeDecodeError) as e:
                _skip(origin, f"cannot be read ({e})")
                continue
            try:
                d = _read_toml(text, origin)
                dev_id = _check_id(d, origin)
            except DeviceError as e:
                _skip(origin, str(e).removeprefix(f"{origin}: "))
                continue
            if dev_id in found or dev_id in _user_conflicts:
                first = found.pop(dev_id, None)
                _user_conflicts[dev_id] = _user_conflicts.get(dev_id) or \
                    f"device id {dev_id!r} is defined twice: {first[1] if first else '?'} and {origin}"
                continue
            found[dev_id] = ({**d, "id": dev_id}, origin)
    # drop built devices that came from the previous user directory
    for dev_id in set(_user) | set(found):
        for k in [k for k in _built if k == dev_id or k.startswith(f"{dev_id}|threads=")]:
            del _built[k]
    _user, _user_env = found, env
    return _user


def _sources() -> tuple[dict[str, tuple[dict[str, Any], str]], dict[str, str]]:
    """Every usable device id's data and origin, and the ids defined twice (``{id: message}``), which are
    left out: asking for one is an error naming both origins, the other devices are not affected."""
    builtin = _load_builtin()
    user = _load_user()
    conflicts = dict(_user_conflicts)
    out = dict(builtin)
    for dev_id, (d, origin) in user.items():
        if dev_id in out:
            conflicts[dev_id] = (f"device id {dev_id!r} is defined twice: {out[dev_id][1]} and {origin}; "
                                 "give the user device another id")
            continue
        out[dev_id] = (d, origin)
    for dev_id in _registered:
        if dev_id in out:
            conflicts[dev_id] = (f"device id {dev_id!r} is defined twice: {out[dev_id][1]} and register_device(); "
                                 "give the registered device another id")
    for message in conflicts.values():
        _warn_once(f"conflict:{message}", "%s (asking for it is an error; the other devices are not affected)",
                   message)
    return out, conflicts


def _build(d: dict[str, Any], origin: str, threads: int | None = None, *, trusted: bool = False) -> Device:
    """The device of a data file's mapping (``trusted``: a built-in file, see :func:`device_from_dict`)."""
    measured = d.get("measured") or []
    if not measured:
        if threads is not None:
            raise DeviceError(f"{origin}: threads={threads!r} applies to a device measured on this host "
                              f"(kind = \"cpu\" with a measured list, e.g. host-cpu); {d.get('id')!r} is a spec sheet")
        return device_from_dict(d, origin=origin, trusted=trusted)
    if not isinstance(measured, list) or not all(isinstance(m, str) for m in measured):
        raise DeviceError(f"{origin}: measured must be a list of field names, got {measured!r}")
    if d.get("kind") != "cpu":
        raise DeviceError(f"{origin}: only kind = \"cpu\" devices can be measured on this host, got {d.get('kind')!r}")
    facts = host_facts(threads=threads)
    filled = dict(d)
    notes = [str(d.get("notes", ""))] if d.get("notes") else []
    for name in measured:
        if name not in facts:
            raise DeviceError(
                f"{origin}: measured field {name!r} is not produced by the host benchmark; "
                f"choices: {sorted(k for k in facts if k not in ('key', 'measured_at'))}"
            )
        value = facts[name]
        if value is None and name == "l2_mib":
            value = 1.0
            notes.append("l2_mib unknown (sysfs lists no cache sizes): 1.0 is a placeholder")
        filled[name] = value
    sources = dict(filled.get("sources", {}))
    sources.setdefault("measured", f"host benchmark {facts.get('key')} at {facts.get('measured_at')}")
    filled["sources"] = sources
    filled["notes"] = " ".join(notes)
    return device_from_dict(filled, origin=origin, trusted=trusted)


def list_devices() -> list[str]:
    """Ids of every known device (built-in, user files, registered), sorted."""
    with _lock:
        sources, conflicts = _sources()
        return sorted(set(sources) | set(_registered) | set(conflicts))


def get_device(device_id: str, *, threads: int | None = None) -> Device:
    """The :class:`Device` with this id.

    Args:
        device_id: a catalogue id, e.g. ``"a100-sxm4-40gb"``; case-insensitive.
        threads: for a device measured on this host (``host-cpu``), the torch thread count its peaks are
            measured with (default: this process's count at first use). A host-cpu checkpoint asks for
            the count its labels were measured with, so its features do not depend on the caller's.

    Raises:
        DeviceError: unknown id (the valid ids are listed, and the user files skipped), an id defined twice
            (both origins named), or an invalid data file of this id.
    """
    if not isinstance(device_id, str):
        raise DeviceError(f"device must be a device id string or a Device, got {type(device_id).__name__}")
    key = device_id.strip().lower()
    with _lock:
        sources, conflicts = _sources()
        if key in conflicts:
            raise DeviceError(conflicts[key])
        if key in _registered:
            if threads is not None:
                raise DeviceError(f"threads={threads!r} applies to a device measured on this host (host-cpu); "
                                  f"{key!r} was registered in code")
            return _registered[key]
        if key not in sources:
            skipped = "; ".join(f"{origin} ({why})" for origin, why in _skipped.items())
            raise DeviceError(f"unknown device {device_id!r}; choices: {sorted(set(sources) | set(_registered))}"
                              + (f"; skipped, so not among them: {skipped}" if skipped else ""))
        slot = key if threads is None else f"{key}|threads={threads}"
        if slot not in _built:
            d, origin = sources[key]
            _built[slot] = _build(d, origin, threads, trusted=key in _load_builtin())
        return _built[slot]


def resolve_device(device: "Device | str") -> Device:
    """Accept a :class:`Device` or an id; return the device."""
    if isinstance(device, Device):
        return device
    return get_device(device)


def register_device(device: Device | Mapping[str, Any]) -> Device:
    """Add a device defined in code (a :class:`Device` or the mapping a data file would hold).

    Raises:
        DeviceError: the id already exists (built-in, user file or registered), or the mapping is invalid.
    """
    with _lock:
        if isinstance(device, Mapping) and isinstance(device.get("id"), str):
            device = {**device, "id": device["id"].strip().lower()}
        dev = device if isinstance(device, Device) else device_from_dict(device, origin="register_device()")
        sources, _conflicts = _sources()
        if dev.id in sources or dev.id in _registered:
            where = sources[dev.id][1] if dev.id in sources else "an earlier register_device()"
            raise DeviceError(f"device id {dev.id!r} already exists ({where}); choose another id")
        _registered[dev.id] = dev
        return dev


def unregister_device(device_id: str) -> None:
    """Remove a device added with :func:`register_device` (tests, notebooks).

    Raises:
        DeviceError: the id was not registered in code (catalogue files cannot be removed).
    """
    if isinstance(device_id, str):
        device_id = device_id.strip().lower()
    with _lock:
        if device_id not in _registered:
            raise DeviceError(
                f"device {device_id!r} was not added with register_device(); registered: {sorted(_registered)}"
            )
        del _registered[device_id]
