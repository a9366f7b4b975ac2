"""``MeshFailure``: what an owner is told when actors of a mesh it owns fail."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .._actor.api.mesh import ActorMesh


class GaveUp(Protocol):
    """A supervisor that gave up (``supervisor.Supervisor``), as a failure names it."""

    name: str

    @property
    def status(self) -> str: ...


__all__ = ["MeshFailure"]


class MeshFailure:
    """The failure of ``crashed_ranks`` of the actor mesh named ``mesh_name``.

    ``reason`` says what happened (an exception with no reply, a process
    killed by a signal, ...); ``traceback`` is the remote traceback text when
    there is one. ``mesh`` is the owner's ``ActorMesh``, or the ``Supervisor`` that
    gave up (compare it, or ``mesh_name``, with the meshes you own). ``log_tail``
    holds the last lines the process wrote (stdout and stderr) when it crashed,
    else is empty. ``actor`` is Monarch's name of the (first) failed actor,
    ``<root>.<module.Class mesh{'dim': i/n}>``, when known; `report()` starts
    with Monarch's sentence about it.
    """

    def __init__(
        self,
        mesh_name: str,
        crashed_ranks: list[int],
        reason: str,
        traceback: str = "",
        mesh: ActorMesh[Any] | GaveUp | None = None,
        log_tail: list[str] | tuple[str, ...] = (),
        actor: str = "",
    ) -> None:
        self.mesh_name = mesh_name
        self.crashed_ranks = list(crashed_ranks)
        self.reason = reason
        self.traceback = traceback
        self.mesh = mesh
        self.log_tail = list(log_tail)
        self.actor = actor

    def report(self) -> str:
        """A readable multi-line report, with the remote traceback if any.

        It starts as Monarch's does (programs match on it): ``The actor <root>.<mod.Cls
        mesh{'dim': i/n}> and all its descendants have failed:``, then the reason
        indented; danaus's detail (mesh, ranks, traceback, last lines) follows.
        """
        where = f"MeshFailure on actor mesh {self.mesh_name!r}, crashed_ranks={self.crashed_ranks}"
        if self.actor:
            lines = [
                f"The actor {self.actor} and all its descendants have failed:",
                f"  {self.reason}",
                f"  {where}",
            ]
        else:
            lines = [f"{where}:", f"  {self.reason}"]
        if self.traceback.strip():
            lines.append("  Traceback of the failure (remote):")
            lines.extend("    " + line for line in self.traceback.rstrip().splitlines())
        if self.log_tail:
            lines.append(f"  Last {len(self.log_tail)} lines of output of the process:")
            lines.extend("    " + line for line in self.log_tail)
        return "\n".join(lines)

    def __str__(self) -> str:
        return (
            f"MeshFailure(mesh_name={self.mesh_name!r}, crashed_ranks={self.crashed_ranks}, "
            f"reason={self.reason!r})"
        )

    __repr__ = __str__

    def __reduce__(self) -> Any:
        return (
            MeshFailure,
            (
                self.mesh_name,
                self.crashed_ranks,
                self.reason,
                self.traceback,
                None,
                self.log_tail,
                self.actor,
            ),
        )
