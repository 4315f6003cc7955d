"""Independent generation jobs spread over the local devices: the corpus build on a machine of several GPUs.

The corpus is a list of pieces whose seeds are fixed in advance (``training/parts.py``), so pieces can run
anywhere in any order. ``DevicePool.map(fn, items)`` calls ``fn(params, item)`` for every item, one Python
thread per device, each with its own copy of the params and that device as JAX's default (so the arrays a job
creates land there too), the next item going to whichever device is free; results come back in item order.
JAX releases the GIL while a device works, so n devices generate ~n times as fast. One device (the CPU, a
one-GPU machine) runs the items in a plain loop, in this thread.
"""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Callable, Sequence

import jax


def first_devices(n: int | None, what: str) -> list[jax.Device]:
    """The first ``n`` local devices (None: all) that ``what`` runs on, or a ValueError saying how many exist."""
    avail = jax.local_devices()
    n = len(avail) if n is None else n
    if not 1 <= n <= len(avail):
        raise ValueError(f"{what} over {n} devices needs 1 to {len(avail)} (this process has {len(avail)} "
                         f"{avail[0].platform} devices)")
    return avail[:n]


class DevicePool:
    def __init__(self, params, devices: int | None = None):
        """``devices``: how many local devices (the first n; None: all)."""
        self.devices = first_devices(devices, "a device pool")
        self.params = [jax.device_put(params, d) for d in self.devices]

    def __len__(self) -> int:
        return len(self.devices)

    def map(self, fn: Callable, items: Sequence) -> list:
        """``[fn(params, item) for item in items]`` with ``params`` on the device that runs the item."""
        if len(self.devices) == 1:
            with jax.default_device(self.devices[0]):
                return [fn(self.params[0], item) for item in items]
        todo = iter(enumerate(items))
        results: dict[int, object] = {}
        take, failed = threading.Lock(), threading.Event()

        def worker(d: int) -> None:
            with jax.default_device(self.devices[d]):
                while not failed.is_set():  # after a job's error the other devices start no new item
                    with take:
                        nxt = next(todo, None)
                    if nxt is None:
                        return
                    try:
                        results[nxt[0]] = fn(self.params[d], nxt[1])
                    except BaseException:
                        failed.set()
                        raise

        with concurrent.futures.ThreadPoolExecutor(len(self.devices)) as ex:
            for f in [ex.submit(worker, d) for d in range(len(self.devices))]:
                f.result()  # re-raises a job's exception
        return [results[i] for i in range(len(items))]
