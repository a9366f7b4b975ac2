"""``danaus.tools``: counterparts of ``monarch.tools`` (``danaus.tools.config.Workspace``)."""
