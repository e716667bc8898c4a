"""`ironlink.tuning`, the name users import (launch choices of the host-level and fused ops): bound
to the package `ironlink.runtime.tuning` itself. A choice is changed by passing an op its config
(`ironlink.all_reduce(t, config=ironlink.tuning.AllReduceConfig(...))`), not by setting a name here."""

import sys

from .runtime import tuning as _module
from .runtime.tuning import *  # noqa: F401,F403 - its names, for type checkers

sys.modules[__name__] = _module
