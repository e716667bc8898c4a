"""`ironlink.torch_interop`, the name users import (ironlink contexts over PyTorch's own `symm_mem`
tensors): bound to the module `ironlink.runtime.torch_interop` itself."""

import sys

from .runtime import torch_interop as _module
from .runtime.torch_interop import *  # noqa: F401,F403 - its names, for type checkers

sys.modules[__name__] = _module
