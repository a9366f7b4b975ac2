"""Monarch names added to ``danaus.actor`` and ``danaus`` (issue 28 §3), on real procs and in a
fresh interpreter. In the client itself: ``tests/unit/actor/test_monarch_names.py``."""

from __future__ import annotations

import io
import logging
import subprocess
import sys
from typing import Any

import pytest

import danaus
import danaus.actor
from danaus.actor import Actor, Channel, ProcId, ProcMesh, Uid, context, endpoint

from .conftest import REPLY_TIMEOUT


def _capture(name: str) -> tuple[logging.Logger, io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger(name)
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger, stream


class Named(Actor):
    @endpoint
    def log(self, prefix: bool) -> tuple[str, str]:
        danaus.actor.config.prefix_python_logs_with_actor = prefix
        try:
            logger, stream = _capture("named-actor")
            logger.error("HUH")
            logger.error("")  # empty messages stay empty (structured trace logging)
            return stream.getvalue(), str(context().actor_instance)
        finally:
            danaus.actor.config.prefix_python_logs_with_actor = True

    @endpoint
    def proc_id(self) -> tuple[str, Any]:
        inst = context().actor_instance
        return inst.proc_id, inst.actor_id.proc


class Replier(Actor):
    @endpoint
    async def reply_later(self, port: Any, value: Any) -> None:
        await port.resolve_and_send(value)


def test_actor_logs_start_with_the_actor_and_config_turns_it_off(procs: ProcMesh) -> None:
    mesh = procs.spawn("the_name", Named)
    text, me = mesh.slice(gpus=1).log.call_one(True).get(timeout=REPLY_TIMEOUT)
    assert "the_name" in me and me.startswith("<root>.")
    assert text.splitlines() == [f"[actor={me}] HUH", ""]
    text, _ = mesh.slice(gpus=1).log.call_one(False).get(timeout=REPLY_TIMEOUT)
    assert text.splitlines() == ["HUH", ""]


def test_proc_id_parses_an_instance_proc_id_back_to_the_proc(procs: ProcMesh) -> None:
    text, proc = procs.spawn("ids", Named).slice(gpus=0).proc_id.call_one().get(REPLY_TIMEOUT)
    parsed = ProcId.from_string(text)
    assert parsed == proc
    assert parsed.label == proc.name
    assert parsed.uid == Uid.singleton(proc.name) and parsed.uid.is_singleton
    with pytest.raises(ValueError, match="name@address"):
        ProcId.from_string("no-address")


def test_resolve_and_send_sends_a_mesh_from_a_coroutine(procs: ProcMesh) -> None:
    named = procs.spawn("named", Named)
    mesh = procs.spawn("replier", Replier)
    port, receiver = Channel.open()
    mesh.slice(gpus=0).reply_later.call_one(port, named).get(timeout=REPLY_TIMEOUT)
    sent = receiver.recv().get(timeout=REPLY_TIMEOUT)
    assert len(sent.proc_id.call().get(REPLY_TIMEOUT)) == 2  # usable on arrival


def test_fetch_and_common_module_paths_need_torch_only_when_imported() -> None:
    code = (
        "import sys, danaus, danaus.common, danaus.common.future; danaus.Future; "
        "assert 'torch' not in sys.modules; "
        "import danaus.fetch, danaus.common.remote, danaus.common.device_mesh, "
        "danaus.common.tensor, danaus.common._coalescing as c; "
        "assert danaus.fetch.fetch_shard is danaus.fetch_shard; "
        "assert danaus.fetch.inspect is danaus.inspect and danaus.fetch.show is danaus.show; "
        "assert danaus.common.remote.remote is danaus.remote; "
        "assert danaus.common.tensor.Tensor is danaus.Tensor; "
        "assert c.coalescing is danaus.coalescing; "
        "assert danaus.common.device_mesh.no_mesh is danaus.no_mesh"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
