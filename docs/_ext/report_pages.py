"""Study reports are pages reached from the study that cites them, not from the navigation.

A study's README links its reports (`studies/recall/recall_d.md`, written by the study's
report script); MyST resolves a link to a `.md` file only to a page of the site, so the
reports are pages (docs/conf.py's `include_patterns`). Each page matching
`report_pages` (other than a README) is marked orphan, so it needs no toctree, and one
that has no heading is titled by its file name.
"""

import os

from sphinx.util.matching import Matcher


def _mark(app, doctree):
  docname = app.env.docname
  if not Matcher(app.config.report_pages)(docname) or os.path.basename(docname) == 'README':
    return
  app.env.metadata[docname]['orphan'] = True
  if not any(True for _ in doctree.findall(lambda n: n.tagname == 'section')):
    doctree['title'] = os.path.basename(docname) + '.md'


def setup(app):
  app.add_config_value('report_pages', [], 'env', types=[list])
  app.connect('doctree-read', _mark, priority=400)  # before Sphinx's title collector (500)
  return {'version': '1', 'parallel_read_safe': True, 'parallel_write_safe': True}
