"""Pallas kernels tuned by pallas-farm. Each module follows the protocol in `kernels.protocol`."""
from __future__ import annotations

import importlib
from types import ModuleType

from kernels.protocol import REQUIRED, check_module

# Registered kernel name -> module. A name with a dot is imported as a module path instead,
# which lets a project (or a test) tune kernels that live outside this package.
REGISTRY: dict[str, str] = {
    "softmax": "kernels.softmax",
    "matmul": "kernels.matmul",
    "bmm": "kernels.bmm",
    "broadcast_matmul": "kernels.broadcast_matmul",
    "matmul_layernorm": "kernels.matmul_layernorm",
    "matmul_subtiled_epilogue": "kernels.matmul_subtiled_epilogue",
    "flash_attention": "kernels.flash_attention",
    "flash_attention_causal": "kernels.flash_attention_causal",
    "batch_softmax": "kernels.batch_softmax",
    "softmax_two_pass": "kernels.softmax_two_pass",
    "layer_norm": "kernels.layer_norm",
    "rms_norm": "kernels.rms_norm",
    "rms_norm_bwd": "kernels.rms_norm_bwd",
    "welford": "kernels.welford",
    "cross_entropy": "kernels.cross_entropy",
    "swiglu": "kernels.swiglu",
    "geglu": "kernels.geglu",
}


class UnknownKernel(LookupError):
    """The name is neither registered nor an importable kernel module."""


def load(name: str) -> ModuleType:
    """The kernel module for a registered name or a dotted module path."""
    path = REGISTRY.get(name, name if "." in name else None)
    if path is None:
        raise UnknownKernel(f"unknown kernel {name!r}; registered kernels: {sorted(REGISTRY)}")
    try:
        module = importlib.import_module(path)
    except ImportError as err:
        raise UnknownKernel(f"kernel module {path!r} cannot be imported: {err}") from None
    except Exception as err:  # noqa: BLE001 - a module that fails as it runs (a SyntaxError, a raise)
        where = f" ({err.filename}, line {err.lineno})" if isinstance(err, SyntaxError) else ""
        raise UnknownKernel(f"kernel module {path!r} fails as it is imported: {type(err).__name__}: "
                            f"{str(err)[:300]}{where}") from None
    missing = check_module(module)
    if missing:
        raise UnknownKernel(f"kernel module {path!r} lacks {', '.join(missing)}")
    return module


__all__ = ["REGISTRY", "REQUIRED", "UnknownKernel", "load"]
