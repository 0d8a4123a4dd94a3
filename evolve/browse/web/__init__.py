"""The ``serve`` web page: Datasette with a plugin of our own (pages, SVG charts, templates)."""
