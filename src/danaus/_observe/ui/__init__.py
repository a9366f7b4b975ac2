"""The dashboard's pages: jobs, meshes, actors, a timeline, log search and metric plots.

::

    GET /ui?token=T                   one page (head.html, app.html; app.css, app.js, svg.js,
        |                             timeline.js inline)
        |  #/jobs  #/meshes  #/actors  #/actor/MESH/RANK  #/timeline  #/logs  #/metrics
        |  (the topology picture is the dashboard's first page, /)
        v
    GET /api/ui/overview              the job, its meshes and actors, failures, restarts
    GET /api/ui/timeline?seconds=S    spans and messages of the last S seconds
    GET /api/ui/trace.json?seconds=S  the same in Chrome's trace format (Perfetto opens it)
    GET /api/ui/logs?q=&mesh=&rank=&level=&proc=   log lines of every proc, filtered
    GET /api/ui/metrics?seconds=S&name=N           metric series over the last S seconds

Every route sits on the dashboard's `HttpServer`, so every
request needs its token and the same limits hold. The data come through the telemetry
tables (``sql.query``: the live procs, or the kept history when a job keeps one), the
dashboard's state document (failures with their tracebacks, restarts) and the log files
of this host. The page is hand-written HTML, CSS and JavaScript: nothing is fetched
from anywhere else.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from ..web import Route
from . import entities, logsearch, metricsview, timeline
from .common import answer

__all__ = ["assemble", "routes"]

# The page may run only its own inlined script and style, and talk only to this server.
_CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'"
)


def _text(name: str) -> str:
    return resources.files("danaus._observe.ui").joinpath(name).read_text(encoding="utf-8")


def assemble(html: str) -> str:
    """A page of the dashboard from its own ``html``: behind the head every page shares
    (``head.html``), with the SVG helper (``svg.js``) in place of ``/*SVG_JS*/``."""
    return _text("head.html") + html.replace("/*SVG_JS*/", _text("svg.js"))


def page() -> bytes:
    """app.html with app.css, app.js, svg.js and timeline.js inlined (one request, no token
    in the page)."""
    css = _text("app.css")
    js = "\n".join(_text(f) for f in ("app.js", "svg.js", "timeline.js"))
    js += "\nroute();\n"  # every page's code is defined: show the one the URL names
    return (
        assemble(_text("app.html")).replace("/*APP_CSS*/", css).replace("/*APP_JS*/", js).encode()
    )


def routes(dash: Any) -> dict[str, Route]:
    """The pages' routes, for the dashboard ``dash`` (its state document and collector)."""

    async def app(request: Any) -> Any:
        return answer(200, page(), "text/html; charset=utf-8", **{"Content-Security-Policy": _CSP})

    out: dict[str, Route] = {"/ui": app, "/ui/": app}
    for module in (entities, timeline, logsearch, metricsview):
        out.update(module.routes(dash))
    return out
