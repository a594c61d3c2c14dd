"""A request's stage durations, as the pipeline marks them (environ["qag.timing"]): Server-Timing, and spans."""

from __future__ import annotations

import time


class Stages(dict):
    """stage name -> seconds spent in it: app.py (auth) and api/run.py (bind, policy, cache, query, encode) add to
    it; app.server_timing() turns it into the Server-Timing header. Tracing (observe/tracing.py) uses a subclass
    that also keeps when each mark was set, so its spans reuse these boundaries instead of measuring again."""

    __slots__ = ()

    def failed(self, name: str, mark: float, error) -> None:
        """A stage that raised `error` after starting at `mark` (time.perf_counter()): its time counts all the
        same, so a failed call's header still says where the time went."""
        self[name] = self.get(name, 0.0) + time.perf_counter() - mark
