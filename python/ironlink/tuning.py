"""`ironlink.tuning`, the name users import (launch choices of the host-level and fused ops): bound
to the module `ironlink.runtime.tuning` itself, so a setting made here, as
`ironlink.tuning.DECODE_PDL = False`, is the one the ops read."""

import sys

from .runtime import tuning as _module
from .runtime.tuning import *  # noqa: F401,F403 - its names, for type checkers

sys.modules[__name__] = _module
