"""mkdocs hooks: the benchmark page's table and plots, and the example programs.

The example programs (``examples/*.py``) are copied into the site as they
are, under ``examples/``, so that ``docs/examples.md`` links to each file
(the repository has no public URL to link to).

The reference of the ``danaus`` command (``reference/cli.md``) is generated
from its argument parser: the ``--help`` of the command and of each
subcommand, so it cannot drift from the code.

The benchmark page's table and plots are made from ``benchmarks/RESULTS.md``.

The latest run's table (the first fenced block of a full run; RESULTS.md lists
runs newest first) is parsed, with whichever systems that run measured;
``on_files`` adds three SVG figures drawn with matplotlib, and
``on_page_markdown`` puts the table itself where ``benchmarks.md`` says
``<!-- benchmark-table -->``. Nothing is written into the source tree.
"""

from __future__ import annotations

import contextlib
import io
import os
import pathlib
import re
import sys
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
PLACEHOLDER = "<!-- benchmark-table -->"
CLI_PAGE = "reference/cli.md"
HELP_COLUMNS = "100"  # argparse wraps help to $COLUMNS: the same page on every terminal


def cli_help(argv: list[str]) -> str:
    """What ``danaus *argv --help`` prints (this repository's danaus)."""
    if str(ROOT / "src") not in sys.path:
        sys.path.insert(0, str(ROOT / "src"))
    from danaus._cli.main import main

    out = io.StringIO()
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        with contextlib.redirect_stdout(out):
            try:
                main([*argv, "--help"])
            except SystemExit:
                pass
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved
    return out.getvalue().rstrip() + "\n"


def cli_commands() -> list[str]:
    """The subcommands of ``danaus``, as its usage line lists them."""
    usage = cli_help([])
    m = re.search(r"\{([^}]+)\}", usage)
    assert m, f"no subcommands in the usage of danaus:\n{usage}"
    return m.group(1).split(",")


def cli_markdown() -> str:
    """The page ``reference/cli.md``: the help of ``danaus`` and of each subcommand."""
    parts = [
        "# The `danaus` command\n",
        "Generated from the command's argument parser when the site is built: what "
        "`danaus --help` and `danaus COMMAND --help` print. `python -m danaus` is the "
        "same command. [Jobs and SPMD](../jobs.md) and "
        "[Debugging and observing](../observing.md) show the commands at work.\n",
        "## `danaus`\n",
        "```text\n" + cli_help([]) + "```\n",
    ]
    for command in cli_commands():
        parts.append(f"## `danaus {command}`\n")
        parts.append("```text\n" + cli_help([command]) + "```\n")
    return "\n".join(parts)


def latest_block() -> str:
    """The text of the latest full run's fenced block in RESULTS.md (newest first)."""
    blocks = RESULTS.read_text().split("```")[1::2]
    return next(b for b in blocks if "danaus benchmarks, full mode" in b).strip("\n")


def parse(block: str) -> dict[str, dict[str, Any]]:
    """``{workload: {"unit": ..., "higher_is_better": bool, system: median}}``.

    The systems are the header's columns between ``unit`` and the ratios.
    """
    rows: dict[str, dict[str, Any]] = {}
    lines = block.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("workload"))
    columns = lines[head].split()[2:]
    names = [c for c in columns if "/" not in c]
    for line in lines[head + 2 :]:
        if not line.strip():
            break
        fields = re.split(r"\s{2,}", line.strip())
        workload, unit, cells = fields[0], fields[1], fields[2 : 2 + len(names)]
        row: dict[str, Any] = {"unit": unit.split(" (")[0], "higher_is_better": "(^)" in unit}
        for name, cell in zip(names, cells, strict=True):
            value = cell.split(" (")[0].replace(",", "")
            row[name] = float(value) if value not in ("-", "") else float("nan")
        rows[workload] = row
    return rows


def systems(rows: dict[str, dict[str, Any]]) -> list[str]:
    """The systems a run measured (the floor is a reference, not a system)."""
    first = next(iter(rows.values()))
    return [k for k in first if k not in ("unit", "higher_is_better", "floor")]


def _svg(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    return buf.getvalue()


def figures(rows: dict[str, dict[str, Any]]) -> dict[str, bytes]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out: dict[str, bytes] = {}
    measured = systems(rows)
    groups = {
        "latency.svg": ("us", "median latency, µs (lower is better)"),
        "bandwidth.svg": ("MiB/s", "payload bandwidth, MiB/s (higher is better)"),
    }
    for name, (unit, title) in groups.items():
        names = [w for w, r in rows.items() if r["unit"] == unit]
        fig, ax = plt.subplots(figsize=(7, 3.2))
        width = 0.8 / len(measured)
        for i, system in enumerate(measured):
            xs = [j + i * width for j in range(len(names))]
            ax.bar(xs, [rows[w][system] for w in names], width, label=system)
        ax.set_xticks([j + width for j in range(len(names))], names)
        ax.set_title(title)
        ax.legend()
        out[name] = _svg(fig)
        plt.close(fig)
    # How many times better danaus is than each other system, workload by workload.
    fig, ax = plt.subplots(figsize=(7, 3.6))
    names = list(rows)
    others = [m for m in measured if m != "danaus"]
    for i, other in enumerate(others):
        factors = []
        for w in names:
            r = rows[w]
            d, o = r["danaus"], r[other]
            factors.append(d / o if r["higher_is_better"] else o / d)
        ax.bar([j + i * 0.4 for j in range(len(names))], factors, 0.4, label=f"vs {other}")
    ax.set_yscale("log")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([j + 0.2 for j in range(len(names))], names, rotation=30, ha="right")
    ax.set_title("times better than the other system (log scale; > 1: danaus is better)")
    ax.legend()
    out["speedup.svg"] = _svg(fig)
    plt.close(fig)
    return out


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for name, data in figures(parse(latest_block())).items():
        files.append(File.generated(config, f"benchmarks/{name}", content=data))
    files.append(File.generated(config, CLI_PAGE, content=cli_markdown()))
    for example in sorted((ROOT / "examples").glob("*.py")):
        files.append(File.generated(config, f"examples/{example.name}", abs_src_path=str(example)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if PLACEHOLDER in markdown:
        markdown = markdown.replace(PLACEHOLDER, "```text\n" + latest_block() + "\n```")
    return markdown


# -- docstrings: Sphinx markup, rendered -------------------------------------------------
#
# The docstrings use Sphinx's cross-reference roles (``:class:`ValueMesh```) and
# ``Example::`` before an indented example; mkdocstrings reads them as Markdown
# (``docstring_style: null``), which would show both literally. ``on_page_content``
# turns a role into the name as code, linked to its entry in the reference where
# one exists (an ``autoref`` that mkdocs-autorefs resolves, or leaves as code), and
# ``Example::`` into ``Example:`` (the indented block after it is already code).
# ``scripts/docs`` then fails if the built site still shows any (``literal_markup``).

ROLE_HTML = re.compile(
    r":(?:class|func|meth|attr|mod|data|exc|obj|py:\w+):<code>~?\.?([^<]+)</code>"
)
LITERAL_INTRO = re.compile(r"(\w)::(</p>)")
LITERAL_MARKUP = re.compile(r":(?:class|func|meth|attr|mod|data|exc|obj):(?:<code>|`)|\w::</p>")


FACADES = (
    "danaus.actor", "danaus.rdma", "danaus.job", "danaus.supervisor", "danaus.elastic",
    "danaus.simulator", "danaus.spmd", "danaus.config", "danaus.telemetry", "danaus.testing",
    "danaus",
)  # fmt: skip
_public: dict[str, str] = {}


def public_names() -> dict[str, str]:
    """Each public name -> its identifier in the reference (``ValueMesh`` ->
    ``danaus.actor.ValueMesh``): the first facade of ``FACADES`` exporting it."""
    if not _public:
        import importlib

        if str(ROOT / "src") not in sys.path:
            sys.path.insert(0, str(ROOT / "src"))
        for facade in FACADES:
            for name in getattr(importlib.import_module(facade), "__all__", []):
                _public.setdefault(name, f"{facade}.{name}")
    return _public


def _role(m: re.Match[str]) -> str:
    target = m.group(1).removesuffix("()")
    shown = target.rsplit(".", 1)[-1] if m.group(0).split("<code>")[1].startswith("~") else target
    head, _, rest = target.partition(".")
    if head != "danaus" and head in public_names():  # ValueMesh.values: a public name's
        target = public_names()[head] + (f".{rest}" if rest else "")
    if target.startswith("danaus."):  # linked where the reference documents it, else code
        return f'<autoref identifier="{target}" optional><code>{shown}</code></autoref>'
    return f"<code>{shown}</code>"


def render_docstring_markup(html: str) -> str:
    """Sphinx roles and ``Example::`` in rendered HTML, as Markdown would have them."""
    return LITERAL_INTRO.sub(r"\1:\2", ROLE_HTML.sub(_role, html))


def literal_markup(html: str) -> list[str]:
    """The Sphinx markup left in a built page (a few characters around each)."""
    return [html[max(0, m.start() - 30) : m.end() + 30] for m in LITERAL_MARKUP.finditer(html)]


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    return render_docstring_markup(html)
