"""Studies: the four papers' questions asked of diffperf (PAPERS.md sections 1-4).

Each study module has NAME, TITLE, `inputs(quick) -> {"models": names, "systems": names}` and
`run(models, systems, *, quick=False, training=None) -> StudyResult`: pure functions of
loaded specs that return the numbers behind a figure. `diffperf study NAME` loads the inputs,
runs the study, writes its CSV and draws its figure (cli/study_cmd.py, cli/figures.py).
"""

from __future__ import annotations

from diffperf.studies import axonn, comm_scaling, diminishing_returns, llm_vs_longseq
from diffperf.studies.common import StudyResult

STUDIES = {m.NAME: m for m in (comm_scaling, diminishing_returns, llm_vs_longseq, axonn)}
# Other names a user may type: the study number and the paper's first author.
ALIASES = {"1": "comm-scaling", "pati": "comm-scaling",
           "2": "diminishing-returns", "fernandez": "diminishing-returns",
           "3": "llm-vs-longseq", "subramanian": "llm-vs-longseq",
           "4": "axonn", "singh": "axonn"}

__all__ = ["STUDIES", "ALIASES", "StudyResult"]
