"""``danaus.common``: the module paths under Monarch's ``monarch.common`` that programs import.

Monarch keeps its tensor engine's client in ``monarch.common``; programs and its
tests import a few names from there. Each submodule here holds danaus's
counterpart of those names, so such imports work with only ``monarch`` changed to
``danaus``: ``remote`` (``remote``, ``call_on_shard_and_fetch``), ``device_mesh``
(``no_mesh``, ``get_active_mesh``), ``tensor`` (``Tensor``), ``_coalescing``
(``coalescing``), ``future`` (``Future``), ``selection`` (``Selection``),
``opaque_ref`` (``OpaqueRef``) and ``function`` (``resolvers``, what ``remote``
consults). The rest of ``monarch.common`` is Monarch's controller internals, which
danaus does not have (``docs/monarch-differences.md``). Every submodule but
``future``, ``selection`` and ``function`` imports torch.
"""
