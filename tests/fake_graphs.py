"""torch.cuda's CUDA-graph API emulated on the CPU, for the tests of emit/graphs.py's replay
bookkeeping (tests/e2e/test_cuda_graphs.py) and of the backend's training steps replayed
(tests/e2e/test_backend.py)."""
import contextlib

import torch


class FakeGraphs:
    """torch.cuda's graph API emulated on the CPU, enough to run `graphed`'s bookkeeping in CI:
    a forward built by `forward()` below records its work while a capture is open (a real capture
    runs no kernel either) and a replay runs the recorded work on the captured tensors. `mod`: a
    copy of emit/graphs.py whose `capturable` takes CPU tensors too (the real one refuses them)."""

    def __init__(self, monkeypatch, mod=None):
        fake = self
        self.open, self.captures, self.replays = None, 0, 0

        class Graph:
            def __init__(self):
                self.work = []

            def replay(self):
                fake.replays += 1
                for w in self.work:
                    w()

            def pool(self):
                return id(self)

        @contextlib.contextmanager
        def graph(g, pool=None):  # as torch's: a capture ending in an error leaves the capture stream current
            self.open, before, self.stream = g, self.stream, "capture"
            try:
                yield
                self.captures += 1
                self.stream = before
            finally:
                self.open = None

        self.stream = "caller's"
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: self.stream)
        monkeypatch.setattr(torch.cuda, "set_stream", lambda stream: setattr(self, "stream", stream))

        monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
        monkeypatch.setattr(torch.cuda, "graph", graph)
        monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
        if mod is not None:
            self.take_cpu_tensors(monkeypatch, mod)

    @staticmethod
    def take_cpu_tensors(monkeypatch, mod):
        """`mod` (emit/graphs.py or a module's shipped copy) captures forwards on CPU tensors."""
        monkeypatch.setattr(mod, "capturable", lambda args: True)

    def forward(self, w, calls):
        """x -> x * w + 1, run now or recorded into the open capture; `calls` counts its runs."""
        def forward(x):
            calls.append(1)
            out = torch.empty_like(x)

            def work():
                torch.mul(x, w, out=out)
                out.add_(1)
            if self.open is not None:
                self.open.work.append(work)
            else:
                work()
            return out
        return forward
