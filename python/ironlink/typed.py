"""`ironlink.typed`, the name users import (`import ironlink.typed as ilt`: the collectives with the
dtype taken from the pointer type): bound to the module `ironlink.language.typed` itself."""

import sys

from .language import typed as _module
from .language.typed import *  # noqa: F401,F403 - its names, for type checkers

sys.modules[__name__] = _module
