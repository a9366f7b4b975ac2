"""``danaus.tools.mesh_spec``: Monarch's ``MeshSpec`` and ``ServerSpec`` (what
``danaus.tools.commands.info`` returns), with TorchX's ``AppState`` values, and
Monarch's ``tag_as_metadata``/``mesh_spec_from_metadata`` (a mesh's spec in a TorchX
``AppDef``'s metadata)."""

from __future__ import annotations

import string
from typing import Any

from .._job.servers import _UNSET_INT, _UNSET_STR, AppState, MeshSpec, ServerSpec
from .._job.servers import DEFAULT_REMOTE_ALLOCATOR_PORT as DEFAULT_REMOTE_ALLOCATOR_PORT

__all__ = [
    "DEFAULT_REMOTE_ALLOCATOR_PORT",
    "AppState",
    "MeshSpec",
    "ServerSpec",
    "mesh_spec_from_metadata",
    "tag_as_metadata",
]

for _cls in (AppState, MeshSpec, ServerSpec):
    _cls.__module__ = __name__
del _cls


# Where Monarch keeps a mesh's spec in a TorchX AppDef's metadata (the same keys, so an
# AppDef tagged by either reads back in both).
_TAG_MESHES_PREFIX = "monarch/meshes/${mesh_name}/"
_TAG_HOST_TYPE = _TAG_MESHES_PREFIX + "host_type"
_TAG_GPUS = _TAG_MESHES_PREFIX + "gpus"
_TAG_TRANSPORT = _TAG_MESHES_PREFIX + "transport"


def _tag(mesh_name: str, template: str) -> str:
    return string.Template(template).substitute(mesh_name=mesh_name)


def tag_as_metadata(mesh_spec: MeshSpec, appdef: Any) -> None:
    """Record ``mesh_spec``'s host type, GPUs and transport in ``appdef.metadata`` (a
    TorchX ``AppDef``, or any object with a ``metadata`` dict), under Monarch's keys."""
    appdef.metadata[_tag(mesh_spec.name, _TAG_HOST_TYPE)] = mesh_spec.host_type
    appdef.metadata[_tag(mesh_spec.name, _TAG_GPUS)] = str(mesh_spec.gpus)
    appdef.metadata[_tag(mesh_spec.name, _TAG_TRANSPORT)] = mesh_spec.transport


def mesh_spec_from_metadata(appdef: Any, mesh_name: str) -> MeshSpec | None:
    """The ``MeshSpec`` of role ``mesh_name`` of ``appdef`` (a TorchX ``AppDef``: its
    ``roles``, each with ``name``, ``image``, ``num_replicas`` and ``port_map``, and its
    ``metadata`` as ``tag_as_metadata`` wrote it); ``None`` without such a role.

    danaus does not need TorchX; this reads the attributes only, so any object shaped
    like an ``AppDef`` works.
    """
    metadata = getattr(appdef, "metadata", None) or {}
    for role in getattr(appdef, "roles", None) or ():
        if role.name == mesh_name:
            port_map = getattr(role, "port_map", None) or {}
            return MeshSpec(
                name=mesh_name,
                image=role.image,
                num_hosts=role.num_replicas,
                host_type=metadata.get(_tag(mesh_name, _TAG_HOST_TYPE), _UNSET_STR),
                gpus=int(metadata.get(_tag(mesh_name, _TAG_GPUS), str(_UNSET_INT))),
                transport=metadata.get(_tag(mesh_name, _TAG_TRANSPORT), "tcp"),
                port=port_map.get("mesh", DEFAULT_REMOTE_ALLOCATOR_PORT),
            )
    return None
