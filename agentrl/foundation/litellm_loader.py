"""litellm, imported where it is first called: its import takes ~2 s on a 2-core CPU, which a run that
never calls a judge (or a litellm-routed model) should not wait for at its first step."""

from __future__ import annotations

import os
from types import ModuleType


def load_litellm() -> ModuleType:
    """litellm with its bundled model price list: at import it would otherwise download one, which a machine
    without internet waits on until a timeout. Judging needs no prices."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm
    import litellm.exceptions  # noqa: F401 - loaded with it: the judge call retries on its types

    return litellm
