"""context() in the client itself, outside any actor: the root instance. Inside actors
on procs: ``tests/integration/test_context.py``."""

from __future__ import annotations

from danaus.actor import context, current_actor_name, current_size


def test_context_outside_any_actor_is_the_root_client() -> None:
    ctx = context()
    inst = ctx.actor_instance
    assert inst.name == "root"
    assert inst.creator is None
    assert str(inst) == "<root>"
    assert current_actor_name() == str(inst.actor_id)
    assert current_actor_name().endswith("/root[0]")
    assert dict(ctx.message_rank) == {}
    assert current_size() == {}
