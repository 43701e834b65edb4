"""Sphinx configuration for mpinb's documentation site.

Pages generated at build time (never hand-copied): the protocol's state diagram from
``mpinb._collective.protocol``, the performance tables from ``benchmarks/results/*.json``, and the
tutorials from ``notebooks/`` (rendered with their saved outputs, never executed).
"""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DOCS / "_ext"))

import generate  # noqa: E402

import mpinb  # noqa: E402

generate.all_pages(ROOT, DOCS / "_generated")

project = "mpinb"
author = "mpinb developers"
copyright = "2026, mpinb developers"
release = version = mpinb.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "numpydoc",
    "myst_nb",
    "sphinx_design",
    "sphinx_copybutton",
    "sphinxcontrib.mermaid",
]
exclude_patterns = ["_build", "contributing_layout.md", "Thumbs.db", ".DS_Store"]
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
suppress_warnings = ["myst.header"]

# Tutorials are rendered with the outputs saved in them; the notebooks tier executes them.
nb_execution_mode = "off"

autosummary_generate = True
templates_path = ["_templates"]
autodoc_inherit_docstrings = False  # Keras's and scikit-learn's own texts are not ours to lint
autodoc_typehints = "none"  # numpydoc's Parameters sections carry the types
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

# No intersphinx: the build must not need the network. Types from other projects therefore have no
# inventory to resolve against; they are ignored by name here, nothing of mpinb's own.
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(numpy|np|keras|tf|tensorflow|matplotlib|mpi4py|MPI|ipyparallel|ipp|sklearn)(\..*)?"),
    (r"py:.*", r"(collections\.abc|typing|pathlib|concurrent\.futures|glob)\..*"),
]
# Targeted, in modules whose docstrings this site does not own (mpinb/client): a private module
# named in MPICluster's, a private helper class.
nitpick_ignore = [
    ("py:mod", "mpinb.client.slurm"),
    ("py:class", "mpinb.interrupt.StopFlag"),
]


def _escape_shape_targets(app, what, name, obj, options, lines):
    # "of shape (n_iter_,)" reads as a reST reference to a target named n_iter.
    lines[:] = [line.replace("(n_iter_,)", "(n_iter\\_,)") for line in lines]


def setup(app):
    app.connect("autodoc-process-docstring", _escape_shape_targets)

html_theme = "pydata_sphinx_theme"
html_title = f"mpinb {release}"
html_static_path: list[str] = []
html_theme_options = {"navigation_with_keys": False, "show_toc_level": 2}
mermaid_output_format = "raw"  # the diagram is drawn in the reader's browser: no mmdc at build time
