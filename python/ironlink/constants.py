"""`ironlink.constants`, the name users import (the ABI constants as `tl.constexpr`): bound to the
module `ironlink.language.constants` itself, so anything read or set here is that module's."""

import sys

from .language import constants as _module
from .language.constants import *  # noqa: F401,F403 - its names, for type checkers

sys.modules[__name__] = _module
