"""The documentation says what the code does.

The code blocks of every page run, page by page: ``tests/test_doc_blocks.py``
(with the runner ``tests/docrunner.py``).

The design pages (``docs/design.md`` and ``docs/internals/``) say what the code
is: their lists of the node's parts and of who handles each frame kind are those
of the code (as ``docs/config.md``'s settings are, in
``tests/config/test_config.py``), and every module, source path and private name
they mention exists in ``src/danaus``.
"""

from __future__ import annotations

import ast
import pathlib
import re
from typing import Any

import source_ast

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


# -- the design pages against the code ---------------------------------------------

SRC = ROOT / "src" / "danaus"
DESIGN = DOCS / "design.md"
INTERNALS = DOCS / "internals"
NODE_PAGE = INTERNALS / "node.md"  # the node's parts: its '## The parts'
MESSAGES_PAGE = INTERNALS / "messages.md"  # who handles each frame kind: '## Frames and routing'


def _table(page: pathlib.Path, section: str, header: list[str]) -> list[list[str]]:
    """The rows of the table headed ``header`` in section ``## section`` of ``page``."""
    text = page.read_text()
    name = page.relative_to(ROOT)
    m = re.search(rf"^## {re.escape(section)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert m, f"{name} has no section '## {section}'"
    lines = m.group(1).splitlines()
    for i, line in enumerate(lines):
        if [c.strip() for c in line.strip().strip("|").split("|")] == header:
            rows = []
            for row in lines[i + 2 :]:
                if not row.startswith("|"):
                    break
                rows.append([c.strip() for c in row.strip().strip("|").split("|")])
            return rows
    raise AssertionError(f"{name}'s '## {section}' has no table headed {header}")


def _module(path: pathlib.Path) -> str:
    """``_actor/owned`` for src/danaus/_actor/core/owned.py."""
    return path.relative_to(SRC).with_suffix("").as_posix()


def _imported_from(tree: ast.Module, path: pathlib.Path, name: str) -> str | None:
    """The module (as ``_module`` names it) that ``path`` imports ``name`` from."""
    package = list(path.relative_to(SRC).parts[:-1])
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any(
            (a.asname or a.name) == name for a in node.names
        ):
            mod = node.module.split(".") if node.module else []
            if node.level:
                return "/".join([*package[: len(package) - (node.level - 1)], *mod])
            if mod[:1] == ["danaus"]:
                return "/".join(mod[1:])
    return None


def _node_parts_in_code() -> set[str]:
    """``module.Class`` of every class passed to ``node.part(cls)`` in src/danaus."""
    found = set()
    for path in sorted(SRC.rglob("*.py")):
        tree = source_ast.parse(path.read_text())
        classes = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
        for call in ast.walk(tree):
            if not (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr == "part"
            ):
                continue
            where = f"{path.relative_to(SRC)}:{call.lineno}"
            assert len(call.args) == 1 and isinstance(call.args[0], ast.Name), (
                f"{where}: pass node.part() a class by name, so this test can find it"
            )
            name = call.args[0].id
            module = _module(path) if name in classes else _imported_from(tree, path, name)
            assert module, f"{where}: cannot tell where {name} is defined"
            found.add(f"{module}.{name}")
    return found


def _frame_handlers_in_code() -> dict[str, set[str]]:
    """Frame kind name -> the modules that call ``register(Kind.X, ...)`` for it."""
    found: dict[str, set[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        for call in ast.walk(source_ast.parse(path.read_text())):
            if (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr == "register"
                and call.args
                and isinstance(kind := call.args[0], ast.Attribute)
                and isinstance(kind.value, ast.Name)
                and kind.value.id == "Kind"
            ):
                found.setdefault(kind.attr, set()).add(path.relative_to(SRC).as_posix())
    return found


def test_the_design_lists_every_part_of_the_node() -> None:
    rows = _table(NODE_PAGE, "The parts", ["part", "holds"])
    documented = set()
    for row in rows:
        m = re.fullmatch(r"`(_\w+(?:/\w+)*\.\w+)`", row[0])
        assert m, f"{NODE_PAGE.name}: a node part is written `_layer/module.Class`, not {row[0]}"
        assert row[1], f"{NODE_PAGE.name}: say what node part {row[0]} holds"
        documented.add(m.group(1))
    code = _node_parts_in_code()
    assert len(code) >= 10
    assert documented == code, (
        "docs/internals/node.md's table of node parts ('## The parts') is out of date: "
        f"add {sorted(code - documented)}, remove {sorted(documented - code)}"
    )


def test_the_design_names_the_handler_of_every_frame_kind() -> None:
    from danaus._wire.protocol import Kind

    documented: dict[str, set[str]] = {}
    for row in _table(MESSAGES_PAGE, "Frames and routing", ["module", "frame kinds it handles"]):
        m = re.match(r"`(_\w+(?:/\w+)*\.py)`", row[0])
        assert m, f"{MESSAGES_PAGE.name}: a routing row starts with `_layer/module.py`: {row[0]}"
        for kind in re.findall(r"`([A-Z][A-Z_]*)`", row[1]):
            documented.setdefault(kind, set()).add(m.group(1))
    code = _frame_handlers_in_code()
    every = {k.name for k in Kind}
    assert set(code) == every, f"frame kinds no module handles: {sorted(every - set(code))}"
    assert set(documented) == every, (
        "docs/internals/messages.md's routing table ('## Frames and routing') is out of date: add "
        f"{sorted(every - set(documented))}, remove {sorted(set(documented) - every)}"
    )
    wrong = {k: (sorted(documented[k]), sorted(code[k])) for k in every if documented[k] != code[k]}
    assert not wrong, (
        f"docs/internals/messages.md's routing table names the wrong modules (doc, code): {wrong}"
    )


# Named by the design pages as they will be once the branches of issue 39 that are
# merged after the docs are in (helper ``runtime``: a mesh's route and its headers).
# Allowed to be missing until then; empty this once they exist.
AFTER_MERGE: set[str] = set()  # the runtime branch has landed


def _design_pages() -> list[pathlib.Path]:
    return [DESIGN, *sorted(INTERNALS.glob("*.md"))]


def _spans(page: pathlib.Path) -> list[str]:
    """The inline code of ``page`` (its backticked spans, fenced blocks left out)."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    return re.findall(r"`([^`\n]+)`", text)


def _source(path: pathlib.Path) -> str:
    return path.read_text() if path.is_file() else ""


def _missing_names(page: pathlib.Path, sources: dict[str, str], every: str) -> list[str]:
    """What ``page`` names that ``src/danaus`` does not have: module paths
    (``danaus._x.y``, with a name of that module after them), source paths
    (``_layer/path.py``, ``_layer/dir/``, ``_layer/module.Name``) and private names
    (``_name``, ``Class._name(``)."""
    missing = []
    for span in _spans(page):
        for dotted in re.findall(r"\bdanaus\.(_\w+(?:\.\w+)*)", span):
            parts = dotted.split(".")
            for i in range(len(parts), 0, -1):
                base = SRC.joinpath(*parts[:i])
                module = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base
                if module.exists():
                    rest = parts[i:]
                    text = _source(module if module.is_file() else module / "__init__.py")
                    if rest and not re.search(rf"\b{re.escape(rest[0])}\b", text):
                        missing.append(f"danaus.{dotted} ({rest[0]} is not in that module)")
                    break
            else:
                missing.append(f"danaus.{dotted} (no such module)")
        for path, dot_py, attr in re.findall(
            r"(?<![\w/.])(_[a-z_]+(?:/[a-z_0-9]+)+)(\.py)?(?:\.([A-Za-z_]\w*))?", span
        ):
            if path in AFTER_MERGE:
                continue
            base = SRC / path
            if base.with_suffix(".py").is_file():
                if attr and not re.search(rf"\b{attr}\b", sources[path]):
                    missing.append(f"{path}.{attr} (not in {path}.py)")
            elif not (base.is_dir() and not dot_py):
                missing.append(f"{path}{dot_py} (no such file or folder)")
        for name in re.findall(r"(?<![\w/])_[A-Za-z][A-Za-z0-9_]*", span):
            if name.endswith("__") or (SRC / name).exists() or (SRC / f"{name}.py").exists():
                continue  # a dunder, or a layer named by itself
            if not re.search(rf"\b{re.escape(name)}\b", every):
                missing.append(f"{name} (no such name in src/danaus)")
    return missing


def test_the_design_pages_name_only_what_exists_in_the_code() -> None:
    """A renamed or moved module, file or private function makes its mention in the
    design pages fail here, so the pages cannot drift from the code unnoticed."""
    files = sorted(SRC.rglob("*.py"))
    sources = {p.relative_to(SRC).with_suffix("").as_posix(): p.read_text() for p in files}
    every = "\n".join(sources.values())
    pages = _design_pages()
    assert len(pages) >= 10, "docs/internals/ has the design's detail, one page per subsystem"
    missing = {p.relative_to(ROOT).as_posix(): _missing_names(p, sources, every) for p in pages}
    missing = {page: names for page, names in missing.items() if names}
    assert not missing, f"the design pages name what the code does not have: {missing}"


def test_the_name_check_catches_a_stale_name(tmp_path: pathlib.Path) -> None:
    """The check above fails on what it must: a module, a path and a private name that
    do not exist, and not on ones that do."""
    files = sorted(SRC.rglob("*.py"))
    sources = {p.relative_to(SRC).with_suffix("").as_posix(): p.read_text() for p in files}
    every = "\n".join(sources.values())
    page = tmp_path / "page.md"
    page.write_text(
        "`danaus._runtime.node.this_node()` and `_runtime/node.py` and `_actor/core/` and "
        "`Node.part` and `_boothook` and `__supervise__` exist.\n"
        "`danaus._runtime.nowhere`, `danaus._runtime.node.nothing_here()`, `_actor/core/gone.py`, "
        "`_runtime/node.Nobody` and `Runtime._no_such_method(` do not.\n"
        "```text\n`_only_in_a_drawing`\n```\n"
    )
    missing = _missing_names(page, sources, every)
    assert [m.split(" ")[0] for m in missing] == [
        "danaus._runtime.nowhere",
        "danaus._runtime.node.nothing_here",
        "_actor/core/gone.py",
        "_runtime/node.Nobody",
        "_no_such_method",
    ], missing


def test_the_config_page_lists_each_monarch_option_name_as_the_code_treats_it() -> None:
    from danaus import _config

    text = (DOCS / "config.md").read_text()
    section = text.split("## Monarch's option names", 1)[1].split("\n## ", 1)[0]
    rows = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in section.splitlines()
        if line.startswith("| `")
    ]
    documented = {row[0].strip("`"): row[3] for row in rows}
    code = {o.name: o for o in _config.MONARCH_OPTIONS}
    assert set(documented) == set(code), (
        "docs/config.md's table of Monarch's option names is out of date: add "
        f"{sorted(set(code) - set(documented))}, remove {sorted(set(documented) - set(code))}"
    )
    for name, does in documented.items():
        opt = code[name]
        expected = f"alias of `{opt.setting}`" if opt.setting else "no effect:"
        assert does.startswith(expected), f"docs/config.md: {name} is {expected!r}, not {does!r}"
    assert _config.monarch_markdown_table() in section, (
        "docs/config.md's table of Monarch's option names differs from the code: paste the "
        "second table `python -m danaus._config` prints"
    )


# -- the API reference against the public names ------------------------------------------

REFERENCE = DOCS / "reference"


def _facades() -> list[str]:
    """Every public module: ``danaus``, ``danaus.X`` and ``danaus.tools.X`` with an ``__all__``."""
    names = ["danaus"]
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        if parts[-1] == "__init__":  # a package: danaus.actor, danaus.tools.config
            parts = parts[:-1]
        if not parts or any(p.startswith("_") for p in parts):
            continue
        names.append(".".join(["danaus", *parts]))
    return names


def _directives() -> list[tuple[pathlib.Path, str, list[str] | None]]:
    """``(page, identifier, members or None)`` of each ``::: identifier`` in the reference."""
    found = []
    for page in sorted(REFERENCE.glob("*.md")):
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            m = re.match(r"^::: (\S+)\s*$", line)
            if not m:
                continue
            members: list[str] | None = None
            for opt in lines[i + 1 :]:
                if opt.strip() and not opt.startswith(" "):
                    break
                if opt.strip() == "members:":
                    members = []
                elif members is not None and (item := re.match(r"^\s+- (\S+)$", opt)):
                    members.append(item.group(1))
            found.append((page, m.group(1), members))
    return found


def _resolve(identifier: str) -> object:
    import importlib

    parts = identifier.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise AssertionError(f"the reference names {identifier}, which does not exist")


def _bound_in_source(module: object) -> set[str]:
    """The names a module's source binds at top level (not those its ``__getattr__`` loads)."""
    path = getattr(module, "__file__", None)
    assert path, f"{module} has no source"
    names = set()
    for node in source_ast.parse(pathlib.Path(path).read_text()).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def test_every_public_name_has_an_api_reference_entry() -> None:
    """A ``::: module`` directive documents the names of the module's ``__all__`` that its
    source binds (mkdocstrings reads the source: names loaded lazily are not there), or
    those of its ``members:``."""
    import importlib
    import types

    covered: list[object] = []
    for page, identifier, members in _directives():
        obj = _resolve(identifier)
        covered.append(obj)  # a module too: ``danaus.timer`` is a name in ``danaus.__all__``
        if not isinstance(obj, types.ModuleType):
            continue
        if members is None:
            bound = _bound_in_source(obj)
            names = [n for n in getattr(obj, "__all__", []) if n in bound]
        else:
            names = members
        for name in names:
            assert hasattr(obj, name), f"{page.name}: {identifier} has no member {name}"
            covered.append(getattr(obj, name))
    facades = _facades()
    assert {"danaus.actor", "danaus.spmd", "danaus.testing", "danaus.tools.config"} <= set(facades)
    missing = []
    for facade in facades:
        module = importlib.import_module(facade)
        for name in getattr(module, "__all__", []):
            value = getattr(module, name)
            if not any(value is c for c in covered):
                missing.append(f"{facade}.{name}")
    assert not missing, (
        f"public names with no entry in docs/reference/: {missing} (add a `::: module` "
        "directive, or the name to a directive's `members:`)"
    )


def _hooks() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "scripts" / "docs_hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_command_line_reference_is_generated_from_the_parser_for_every_command() -> None:
    hooks = _hooks()
    commands = hooks.cli_commands()
    assert {"worker", "apply", "kill", "exec", "debug", "logs"} <= set(commands)
    page = hooks.cli_markdown()
    sections = re.split(r"^## ", page, flags=re.M)[1:]
    titles = [s.split("\n", 1)[0] for s in sections]
    assert titles == ["`danaus`", *[f"`danaus {c}`" for c in commands]]
    for command, section in zip(commands, sections[1:], strict=True):
        assert f"usage: danaus {command} " in section, section
    worker = sections[1 + commands.index("worker")]
    for option in ("--listen", "--secret-file", "--insecure", "--tls-cert"):
        assert option in worker


def test_docstring_markup_is_rendered_and_what_is_left_is_found() -> None:
    """The reference shows Sphinx roles as code (linked when the path is documented) and
    ``Example::`` as ``Example:``; ``scripts/docs`` fails on any that the built site still
    shows, with ``literal_markup``."""
    hooks = _hooks()
    raw = (
        "<p>Returns a :class:<code>ValueMesh</code> (see "
        ":meth:<code>~danaus.actor.Future.get</code>"
        " and :func:<code>danaus.actor.this_host</code>). Example::</p>"
    )
    assert len(hooks.literal_markup(raw)) == 4
    out = hooks.render_docstring_markup(raw)
    assert hooks.literal_markup(out) == []
    assert '<autoref identifier="danaus.actor.ValueMesh" optional><code>ValueMesh</code>' in out
    link = '<autoref identifier="danaus.actor.Future.get" optional><code>get</code></autoref>'
    assert link in out
    assert '<autoref identifier="danaus.actor.this_host" optional>' in out
    assert out.endswith("Example:</p>")


def test_docstrings_use_one_style_markdown_not_sphinx_roles() -> None:
    # The reference renders docstrings as Markdown: a cross-reference is
    # [`Name`][danaus.module.Name], code is `code`; Sphinx roles (:class:`X`) and
    # reST literal-block intros (Example::) would be shown as written.
    role = re.compile(r":(?:py:)?(?:class|func|meth|attr|mod|exc|data|obj):`")
    intro = re.compile(r"\w::$", re.M)
    found = [
        f"{path.relative_to(SRC)}:{text.count(chr(10), 0, m.start()) + 1}"
        for path in sorted(SRC.rglob("*.py"))
        for text in [path.read_text()]
        for m in [*role.finditer(text), *intro.finditer(text)]
    ]
    assert not found, f"Sphinx markup in docstrings: {found[:20]}"
