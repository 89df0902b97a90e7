"""MkDocs hooks for the gkl-jax site (configured in mkdocs.yml)."""


def _public_names(module_name):
    """The public names a sub-package exports (classes, functions, constants; not sub-modules)."""
    import importlib
    import inspect
    import os
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository, not an installed copy
    if sys.path[0] != root:
        sys.path.insert(0, root)
    module = importlib.import_module(module_name)
    return [name for name, value in vars(module).items() if not name.startswith("_") and not inspect.ismodule(value)]


def on_page_markdown(markdown, page, config, files):
    """API pages say `members: PUBLIC`; list the names the sub-package exports (they are defined in private
    modules, which mkdocstrings would otherwise skip)."""
    if "members: PUBLIC" not in markdown:
        return markdown
    lines = markdown.splitlines()
    module_name = next(line[4:].strip() for line in lines if line.startswith("::: "))
    names = ", ".join(_public_names(module_name))
    return markdown.replace("members: PUBLIC", f"members: [{names}]")


def on_post_page(output, page, config):
    """mkdocs-jupyter builds a notebook page's table of contents from the heading text without its code spans
    ("Fit: `GPClassifier`" -> #fit) while nbconvert's heading id keeps them (#fit-gpclassifier): point such
    a contents link at the one heading id that extends it."""
    if not page.file.src_uri.endswith(".ipynb"):
        return output
    import re

    ids = set(re.findall(r'\sid="([^"]+)"', output))

    def fix(match):
        target = match.group(1)
        if target in ids:
            return match.group(0)
        longer = [i for i in ids if i.startswith(target + "-")]
        return f'href="#{longer[0]}"' if len(longer) == 1 else match.group(0)

    return re.sub(r'href="#([^"]+)"', fix, output)
