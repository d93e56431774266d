"""Writing a file a user named, for the scripts and benchmarks that write reports: never over one of the
writer's inputs, never a FIFO or a device, never half-written.

>>> from dippm_nas.files import write_output
>>> from dippm_nas.errors import InvalidValueError
>>> write_output("report.json", text, "--json", error=InvalidValueError, inputs=[args.data])  # doctest: +SKIP

:func:`check_output` checks a path with ``stat`` only (a directory, a FIFO, a device, a socket, a dangling
symbolic link, a missing directory or one of ``inputs`` is the given error, naming the path and what it is);
:func:`output_path` yields a temporary path in the destination's directory, renamed over it when the block
ends without an error; :func:`write_output` writes text or bytes through it. The package's own writers
(``Deployment.save``, ``dataset export``, ...) use the same functions.
"""

from __future__ import annotations

from dippm_nas._files import check_output, output_path, write_output

__all__ = ["check_output", "output_path", "write_output"]
