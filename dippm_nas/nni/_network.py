"""Keep NNI's Node.js manager (REST API + web portal) on the loopback interface.

NNI 3.0 starts its manager with ``app.listen(port)``: Node.js then binds **every** interface (IPv4 and IPv6),
and NNI has no option to choose the address. The REST API has no authentication: whoever reaches the port
can read the experiment, change its search space and kill trials.

The manager is started as ``node main.js ...`` with the environment of the Python process that starts the
experiment (``Experiment.start`` or ``nnictl create``). Node reads ``NODE_OPTIONS``, so a ``--require``
preload can change the default address before NNI's code runs: :data:`LOOPBACK_PRELOAD_JS` wraps
``net.Server.prototype.listen`` so that a ``listen`` call **without** an explicit host binds ``127.0.0.1``
(calls that name a host are left alone). This is dippm-nas's workaround, not an NNI feature; it suits the
``local`` training service only (remote and Kubernetes services need the manager reachable from other
machines).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

from dippm_nas.errors import DippmNasError

__all__ = ["LOOPBACK_PRELOAD_JS", "write_loopback_preload", "loopback_only", "free_port"]

logger = logging.getLogger(__name__)

#: The Node.js preload: default host of ``net.Server.listen`` becomes 127.0.0.1.
LOOPBACK_PRELOAD_JS = r"""'use strict';
// dippm-nas: bind servers that do not name a host to 127.0.0.1 instead of every interface.
const net = require('net');
const HOST = '127.0.0.1';
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  const a0 = args[0];
  const isPort = typeof a0 === 'number' || (typeof a0 === 'string' && /^\d+$/.test(a0));
  if (isPort) {
    if (args.length < 2 || typeof args[1] === 'function') args.splice(1, 0, HOST);
    else if (args[1] === undefined || args[1] === null) args[1] = HOST;
  } else if (a0 === undefined || typeof a0 === 'function') {
    args.splice(0, a0 === undefined ? 1 : 0, 0, HOST);
  } else if (a0 && typeof a0 === 'object' && a0.path === undefined && a0.fd === undefined &&
             a0.handle === undefined && a0._handle === undefined && a0.host === undefined) {
    args[0] = Object.assign({}, a0, { host: HOST });
  }
  return listen.apply(this, args);
};
"""

_PRELOAD_NAME = "dippm_nni_loopback.js"


def write_loopback_preload(directory: str | os.PathLike[str]) -> Path:
    """Write :data:`LOOPBACK_PRELOAD_JS` into ``directory`` (created if needed) and return the file's path.

    For ``nnictl``: ``NODE_OPTIONS="--require $(python -c 'from dippm_nas.nni import write_loopback_preload as w;
    print(w(".nni"))')" nnictl create --config config.yml``. Choose a directory only you can write to:
    Node runs whatever the file holds.

    Raises:
        DippmNasError: ``directory`` is not a path, is a file (or another non-directory), or cannot be created
            or written.
    """
    if not isinstance(directory, (str, os.PathLike)) or not str(directory).strip():
        raise DippmNasError(f"write_loopback_preload(): directory must be a path, got {directory!r}")
    d = Path(directory)
    try:
        d.mkdir(parents=True, exist_ok=True)
        p = d / _PRELOAD_NAME
        p.write_text(LOOPBACK_PRELOAD_JS)
    except (OSError, ValueError) as e:  # FileExistsError: a file of that name; ValueError: a NUL in the path
        raise DippmNasError(f"cannot write the loopback preload into {str(directory)!r}: "
                            f"{type(e).__name__}: {e}") from e
    return p.resolve()


@contextlib.contextmanager
def loopback_only() -> Iterator[Path]:
    """While active, an NNI manager started from this process listens on 127.0.0.1 only.

    Sets ``NODE_OPTIONS`` (keeping what it held) to ``--require <preload>`` with the preload in a private
    temporary directory, and restores both on exit. Start the experiment inside the block; the manager
    keeps the setting after the block ends. Every Node.js process started by this process meanwhile
    (from any thread) gets the preload too.

    Yields:
        The preload's path.
    """
    d = tempfile.mkdtemp(prefix="dippm-nni-")  # mode 0700: nobody else can swap the file
    old = os.environ.get("NODE_OPTIONS")
    try:
        path = write_loopback_preload(d)
        opt = f"--require {json.dumps(str(path))}"
        os.environ["NODE_OPTIONS"] = f"{old} {opt}" if old else opt
        logger.debug("NODE_OPTIONS=%s", os.environ["NODE_OPTIONS"])
        yield path
    finally:
        if old is None:
            os.environ.pop("NODE_OPTIONS", None)
        else:
            os.environ["NODE_OPTIONS"] = old
        shutil.rmtree(d, ignore_errors=True)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (asked from the OS; another process may take it before you do).

    Raises:
        DippmNasError: the OS gave no port.
    """
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            return int(s.getsockname()[1])
    except OSError as e:
        raise DippmNasError(f"could not get a free TCP port on {host}: {e}") from e
