"""The fast engine's request record."""
from __future__ import annotations

from simcore.request import Request, RequestSpec


class FastRequest(Request):
    """A request record of the fast engine: the SimPy engine's record, plus its row in the run's columns
    (`index`, the spec's place in the workload), its place in the batch (`order`) and, while `lazy`, its
    progress as a lazy decoder. While lazy, its progress fields are stale: the truth is `base_computed +
    step` computed and `base_generated + step` generated (LazyDecoders.step), and its last token came at the
    decoders' last step if it joined before it."""
    __slots__ = ("index", "lazy", "base_computed", "base_generated", "joined_step", "order", "phase")

    def __init__(self, spec: RequestSpec, index: int = 0):
        super().__init__(spec)
        self.index, self.lazy, self.order, self.phase = index, False, 0, None
