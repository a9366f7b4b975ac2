"""The tree router's sender side against a fake runtime: sends, failed sends, routing around."""

from __future__ import annotations

from typing import Any

from danaus._mesh import Slice
from danaus._mesh.tree import Selection, node_children, root_children
from danaus._runtime.messaging.faces import TreeCalls
from danaus._runtime.messaging.gathers import GatherCalls
from danaus._runtime.messaging.tree import TreeRouter
from danaus._wire.ids import ProcId
from danaus._wire.protocol import Cast


class FakeRuntime:
    """Records sends; a send to a proc in ``refuse`` fails (its ``on_fail`` is called)."""

    def __init__(self, refuse: set[str]) -> None:
        self.refuse = refuse
        self.fresh: dict[str, ProcId] = {}  # addresses READYs brought (resolve)
        self.handlers: dict[Any, Any] = {}
        self.sent: list[tuple[str, Cast, list[Any]]] = []

    def register(self, kind: Any, handler: Any) -> None:
        self.handlers[kind] = handler

    def is_lost(self, name: str) -> str | None:
        return None

    def resolve(self, proc: ProcId) -> ProcId:
        return self.fresh.get(proc.name, proc)

    def send(self, proc: ProcId, header: Cast, body: Any, buffers: Any, on_fail: Any) -> None:
        if proc.name in self.refuse:
            on_fail("connection refused")
        else:
            self.sent.append((proc.name, header, list(buffers)))

    def calls(self) -> TreeCalls:
        """What the router is handed: these fakes, and nothing else of a runtime."""

        def unused(*args: Any) -> Any:
            raise AssertionError("the sender side does not call this")

        me = ProcId("client", "/tmp/client")
        return TreeCalls(
            me=lambda: me,
            register=self.register,
            handler=self.handlers.get,
            send=self.send,
            reply=unused,
            bounce=unused,
            resolve=self.resolve,
            is_lost=self.is_lost,
            deliver_call=unused,
            port=unused,
            gather=GatherCalls(unused, unused, unused, unused, self.send),
        )


def test_a_subtree_whose_send_fails_fails_its_rank_and_its_children_get_it_with_routes() -> None:
    n, fanout = 40, 4
    procs = [ProcId(f"p{r}", f"/tmp/p{r}") for r in range(n)]
    victim_lo, victim_hi = root_children(n, fanout)[1]
    rt = FakeRuntime({procs[victim_lo].name})
    router = TreeRouter(rt.calls())
    selection = Selection.of(Slice(0, [n], [1]))
    header = Cast(
        "m",
        "mesh",
        "f",
        None,
        False,
        selection.to_wire(),
        0,
        0,
        fanout,
        None,
        ("r",),
        (n,),
        None,
        (),
        0,
        0,
    )
    buf = bytearray(b"payload")
    failed: list[tuple[int, int, str]] = []
    router.cast(procs, selection, header, b"body", [buf], on_fail=lambda *a: failed.append(a))

    assert failed == [(victim_lo, victim_lo, failed[0][2])]
    assert f"its proc {procs[victim_lo].name} is unreachable: connection refused" in failed[0][2]
    assert router.stats.rerouted == 1
    sent = {h.lo: (name, h) for name, h, _ in rt.sent}
    expected = [
        *(k for k in root_children(n, fanout) if k[0] != victim_lo),
        *node_children(victim_lo, victim_hi, fanout),
    ]
    assert sorted(sent) == sorted(lo for lo, _ in expected)
    for lo, hi in expected:
        name, h = sent[lo]
        assert name == procs[lo].name and (h.lo, h.hi, h.hops) == (lo, hi, 1)
        assert h.table == tuple(procs[lo:hi])  # the first cast installs routes everywhere
    below = {a for a, _ in node_children(victim_lo, victim_hi, fanout)}
    for _, h, bufs in rt.sent:
        # the caller's own buffer where the first send took it; past the failed send, a
        # snapshot (the caller may have reused its arrays by the time a send fails)
        assert bufs == [b"payload"]
        assert (bufs[0] is buf) == (h.lo not in below)


def test_routes_carry_each_procs_address_from_its_ready_not_the_meshs_first_one() -> None:
    # A mesh holds the address its spawner first gave each proc (a Unix path on the
    # spawner's host); a proc on another host says its TCP address in its READY. The
    # procs that forward dial what the routes say: the address from the READY.
    n, fanout = 40, 4
    procs = [ProcId(f"p{r}", f"unix:/tmp/p{r}.sock") for r in range(n)]
    rt = FakeRuntime(set())
    rt.fresh = {p.name: ProcId(p.name, f"tcp://10.0.0.{r}:7000;host:h{r}") for r, p in
                enumerate(procs)}  # fmt: skip
    router = TreeRouter(rt.calls())
    selection = Selection.of(Slice(0, [n], [1]))
    header = Cast(
        "m", "mesh", "f", None, False, selection.to_wire(), 0, 0, fanout, None, ("r",), (n,),
        None, (), 0, 0,
    )  # fmt: skip
    router.cast(procs, selection, header, b"body", [])
    assert len(rt.sent) == len(root_children(n, fanout))
    for _, h, _ in rt.sent:
        assert h.table == tuple(rt.fresh[p.name] for p in procs[h.lo : h.hi])
