"""Sphinx configuration of the documentation site.

Build it from the repository's root (the one command; CONTRIBUTING.md, "Documentation"):

    .venv/bin/python -m sphinx -W --keep-going -c docs -b html . docs/_build/html

The source directory is the repository's root, so the Markdown files link to each other
by the same relative paths on GitHub and on the site; `include_patterns` keeps the site
to the guides (README.md, CHANGELOG.md, CONTRIBUTING.md, docs/**.md, the studies'
READMEs). Markdown is read by MyST, the API reference by autodoc (Google-style docstrings
through napoleon), and two local extensions in docs/_ext/ check that every public name
is documented (public_api) and list the registered mechanisms (mechanism_list).
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # train/, data/, configs/ run from the root, not installed
sys.path.insert(0, os.path.join(ROOT, 'docs', '_ext'))

import efficient_attn  # noqa: E402  (after the path; the version below is the library's)

project = 'efficient-attn'
author = 'the efficient-attn authors'
copyright = '2026, the efficient-attn authors'
release = version = efficient_attn.__version__

extensions = [
  'myst_parser',
  'sphinx.ext.autodoc',
  'sphinx.ext.napoleon',
  'docstrings',
  'public_api',
  'mechanism_list',
  'report_pages',
]

# The repository's root is the source directory; docs/index.md is the site's front page.
root_doc = 'docs/index'
source_suffix = {'.md': 'markdown'}
# `docs/**.md`, not `docs/**/*.md`: in Sphinx's globs the latter needs a folder below
# docs/ and misses docs/index.md itself. Every .md under studies/, not only the READMEs:
# MyST resolves a link to a .md file only to a page, and the studies' READMEs link their
# reports (studies/recall/recall_d.md); those are orphan pages (`report_pages` below).
include_patterns = [
  'README.md',
  'CHANGELOG.md',
  'CONTRIBUTING.md',
  'docs/**.md',
  'studies/**.md',
]
# The build output, and folders never searched for pages (they only slow the walk:
# the virtual environment, git, runs and caches).
exclude_patterns = [
  'docs/_build',
  '.*',
  '**/.*',
  'runs',
  'workdirs',
  'benchmark_results',
  'build',
  'dist',
  '*.egg-info',
  '**/__pycache__',
]

# MyST: GitHub's heading anchors (`README.md#data`) on every heading level, so the links
# that work on GitHub work here; a link to a missing page, file or anchor is a warning
# (myst.xref_missing), an error under -W. A link to a repository file that is not a page
# (a script, a JSON result, a report's .md) becomes a download of that file from the site.
myst_heading_anchors = 6
myst_enable_extensions = ['dollarmath']  # $math$, as GitHub renders it

# autodoc + napoleon: Google-style docstrings; a class's members as its directive names them
# (docs/api/), in source order; `name` in a docstring is code, as in the Markdown around it.
autodoc_member_order = 'bysource'
autodoc_typehints = 'signature'
autodoc_typehints_format = 'short'
napoleon_google_docstring = True
napoleon_numpy_docstring = False
default_role = 'code'

# public_api: every public name of these modules must be documented by autodoc, with a
# docstring, or the build warns (an error under -W). The rule is in docs/_ext/public_api.py.
public_api_modules = [
  'efficient_attn',
  'efficient_attn.mechanisms',
  'efficient_attn.nnx',
  'efficient_attn.models',
  'efficient_attn.models.generate',
  'efficient_attn.models.sampling',
  'efficient_attn.layers.lora',
  'train.api',
]

# report_pages: the studies' reports are pages reached from the study citing them, not
# from the navigation (orphan; titled by file name when they have no heading).
report_pages = ['studies/**']

html_theme = 'sphinx_book_theme'
html_title = 'efficient-attn'
html_theme_options = {
  'show_toc_level': 2,
  'use_download_button': False,
  'use_fullscreen_button': False,
}
html_show_sourcelink = False
html_copy_source = False

# No suppress_warnings: under -W every warning fails the build, from every page.


def _root_redirect(app, exception):
  """index.html at the site's root, sending a browser to the front page (docs/index)."""
  if exception is None and app.builder.format == 'html':
    target = app.builder.get_target_uri(root_doc)
    with open(os.path.join(app.outdir, 'index.html'), 'w', encoding='utf-8') as f:
      f.write(
        f'<!DOCTYPE html><html><head><meta charset="utf-8">'
        f'<meta http-equiv="refresh" content="0; url={target}">'
        f'<link rel="canonical" href="{target}"><title>{project}</title></head>'
        f'<body><a href="{target}">{project}</a></body></html>\n'
      )


def setup(app):
  app.connect('build-finished', _root_redirect)
