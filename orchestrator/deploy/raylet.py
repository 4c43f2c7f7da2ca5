"""``ray start`` with loopback addresses kept loopback: ``python -m orchestrator.deploy.raylet start ...``.

The launcher starts every raylet through this module so that
``--node-ip-address 127.0.0.1`` and ``--address 127.0.0.1:PORT`` mean what they
say (see :func:`orchestrator.rayport.ray_api.keep_loopback`). Everything else
is Ray's own ``ray start``, flags included.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    from orchestrator.rayport import ray_api

    ray_api.ray_cli(list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
