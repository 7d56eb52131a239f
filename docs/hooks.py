"""MkDocs hooks: the pages made from the code when the site builds.

``<!-- config-reference -->`` in a page becomes every config field's table, from the
schema (``trainflow.config.reference``).
"""

from trainflow.config.reference import markdown as config_reference


def on_page_markdown(markdown: str, page, config, files) -> str:
    return markdown.replace("<!-- config-reference -->", config_reference())
