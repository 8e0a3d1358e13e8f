"""mkdocs hooks: pages that are generated from the code, so they cannot drift from it.

``<!-- cli-reference -->`` in a page becomes the ``--help`` of ``dspy-pxn`` and of each of its
subcommands, read from the parser the command line itself uses.
"""

from __future__ import annotations

import argparse

MARKER = "<!-- cli-reference -->"


def _help(parser: argparse.ArgumentParser) -> str:
    return parser.format_help().replace("\t", "    ").rstrip()


def cli_reference() -> str:
    from dspy_pxn.cli.main import build_parser

    parser = build_parser()
    sections = [f"## dspy-pxn\n\n```text\n{_help(parser)}\n```"]
    subcommands = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    for name, subparser in subcommands.choices.items():
        sections.append(f"## dspy-pxn {name}\n\n```text\n{_help(subparser)}\n```")
    return "\n\n".join(sections)


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ANN001 - mkdocs' hook signature
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, cli_reference())
    return markdown
