"""``danaus.tools``: counterparts of ``monarch.tools`` — ``commands`` (jobs as servers,
contexts, exec and shell), ``config`` (``Config``, ``Workspace``), ``mesh_spec``,
``network``, ``utils`` and ``cli``."""
