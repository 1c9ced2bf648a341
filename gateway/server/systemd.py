"""sd_notify without libsystemd: READY, STOPPING and WATCHDOG datagrams to $NOTIFY_SOCKET.

Everything here is a no-op where systemd did not start us (no NOTIFY_SOCKET: macOS, a
terminal, a container), so the gateway never depends on it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket

log = logging.getLogger(__name__)


class Notifier:
    def __init__(self, env: dict[str, str] | None = None):
        env = dict(os.environ if env is None else env)
        addr = env.get("NOTIFY_SOCKET", "")
        self.address = ("\0" + addr[1:]) if addr.startswith("@") else addr  # "@": the abstract namespace
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        ours = not pid or pid == str(os.getpid())
        self.watchdog_interval = int(usec) / 2e6 if usec.isdigit() and int(usec) > 0 and ours else None

    def notify(self, message: str) -> None:
        if not self.address or not hasattr(socket, "AF_UNIX"):
            return
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                s.sendto(message.encode(), self.address)
        except OSError as e:
            log.warning("sd_notify %r failed: %s", message, e)

    async def watchdog(self) -> None:
        """Ping from the event loop itself: if the loop is stuck, the pings stop and systemd restarts us."""
        if self.watchdog_interval is None:
            return
        while True:
            self.notify("WATCHDOG=1")
            await asyncio.sleep(self.watchdog_interval)
